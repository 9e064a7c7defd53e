#!/usr/bin/env python3
"""bf16-GEMM-input error estimate for Llama-family decoders with random bf16 weights.

Developer tool: the evidence for the bound of tests/compare_backends.cpp and
scripts/gpu_transformers_check.py (the GPU check's real-shape steps). Runs on the CPU
with torch (the fixture venv, scripts/requirements-fixtures.txt); ~2-4 minutes a model.

Pass (a) "CPU":  every op in f32, weights = bf16 widened exactly to f32.
Pass (b) "CUDA": identical, except the activation input of every GEMM (qkv, o,
gate/up, down, lm_head) is rounded to bf16 (RNE) first; product/sums stay f32.

Both passes are carried through the network layer by layer; each layer's weights
are generated on the fly from a per-layer seed (torch.Generator), stored as bf16,
widened to f32 for use and then dropped. Logits are taken (final norm + lm_head)
after the layers listed in --depths, so one run yields the truncated-depth models
(first L layers + final norm + lm_head) as well as the full one.

usage: est.py MODEL SEED [--depths 2,8,16] [--json out.json]
"""
import argparse, json, math, sys, time
import numpy as np
import torch

torch.set_num_threads(2)
torch.set_float32_matmul_precision("highest")

CONFIGS = {
    "llama31-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                       inter=14336, vocab=128256, eps=1e-5, tied=False, qk_norm=False,
                       rope_theta=500000.0,
                       rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=8192)),
    "qwen3-4b": dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                     inter=9728, vocab=151936, eps=1e-6, tied=True, qk_norm=True,
                     rope_theta=1000000.0, rope_scaling=None),
}
STD = 0.02
T = 64
U = 2.0 ** -8 * math.sqrt(1.0 / (8.0 * math.log(2.0)))  # rms relative error of rounding to bf16 (8 significant bits, RNE), ~1.66e-3


def rb(x):
    return x.to(torch.bfloat16).float()


def gen_bf16(shape, g, chunk_rows=8192):
    """N(0, STD^2) rounded to bf16, generated in row chunks to bound f32 temporaries."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    for r in range(0, shape[0], chunk_rows):
        n = min(chunk_rows, shape[0] - r)
        out[r:r + n] = (torch.randn((n,) + tuple(shape[1:]), generator=g) * STD).to(torch.bfloat16)
    return out


def rmsnorm(x, eps):  # weight = 1
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_inv_freq(c):
    hd = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = c["rope_scaling"]
    if rs is not None:  # Llama-3 scaling (HF _compute_llama3_parameters)
        factor, lf, hf = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / lf, old / hf
        wl = 2 * math.pi / inv
        inv_l = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - lf) / (hf - lf)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        is_med = ~(wl < high_wl) * ~(wl > low_wl)
        inv = torch.where(is_med, smoothed, inv_l)
    return inv


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer:
    def __init__(self, c, seed, li):
        g = torch.Generator().manual_seed(seed * 100003 + li * 7919 + 17)
        H, nh, nkv, hd, I = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["inter"]
        # bf16 storage, widened exactly to f32 for use
        self.wqkv = gen_bf16(((nh + 2 * nkv) * hd, H), g).float()
        self.wo = gen_bf16((H, nh * hd), g).float()
        self.wgu = gen_bf16((2 * I, H), g).float()
        self.wd = gen_bf16((H, I), g).float()


SITES = {"qkv", "o", "gu", "down", "lm"}  # which GEMM inputs pass (b) rounds (--sites)


def layer_forward(x, L, c, cos, sin, mask, bf):
    ident = lambda t: t
    q_ = rb if bf else ident
    qq = q_ if "qkv" in SITES else ident
    qo = q_ if "o" in SITES else ident
    qg = q_ if "gu" in SITES else ident
    qd = q_ if "down" in SITES else ident
    nh, nkv, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
    h = rmsnorm(x, eps)
    qkv = qq(h) @ L.wqkv.T
    q = qkv[:, : nh * hd].view(T, nh, hd)
    k = qkv[:, nh * hd: (nh + nkv) * hd].view(T, nkv, hd)
    v = qkv[:, (nh + nkv) * hd:].view(T, nkv, hd)
    if c["qk_norm"]:
        q = rmsnorm(q, eps)
        k = rmsnorm(k, eps)
    q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
    k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    a = torch.einsum("hqk,khd->qhd", p, v).reshape(T, nh * hd)
    x = x + qo(a) @ L.wo.T
    h = rmsnorm(x, eps)
    gu = qg(h) @ L.wgu.T
    I = c["inter"]
    m = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
    x = x + qd(m) @ L.wd.T
    return x


def logits_of(x, lm_f32, c, bf):
    h = rmsnorm(x, c["eps"])
    if bf and "lm" in SITES:
        h = rb(h)
    return h @ lm_f32.T


def stats(la, lb, depth, xa, xb, c):
    d = (lb - la).abs()
    rms_l = la.pow(2).mean().sqrt().item()
    rms_d = d.pow(2).mean().sqrt().item()
    est = math.sqrt(4 * depth + 1) * U * rms_l
    p9999 = float(np.quantile(d.numpy().ravel(), 0.9999))
    am_a, am_b = la.argmax(-1), lb.argmax(-1)
    same = int((am_a == am_b).sum())
    top2 = la.topk(2, dim=-1).values
    gaps = (top2[:, 0] - top2[:, 1])
    mism = (am_a != am_b).nonzero().flatten().tolist()
    # measured relative error of the (pre-final-norm) residual stream and of normed hidden
    rel_x = ((xb - xa).pow(2).mean().sqrt() / xa.pow(2).mean().sqrt()).item()
    na, nb = rmsnorm(xa, c["eps"]), rmsnorm(xb, c["eps"])
    rel_n = ((nb - na).pow(2).mean().sqrt() / na.pow(2).mean().sqrt()).item()
    return dict(depth=depth, rms_logits=rms_l, max_diff=d.max().item(), rms_diff=rms_d,
                p9999=p9999, argmax_same=same, n_pos=T,
                mismatch_gaps=[round(gaps[i].item(), 6) for i in mism],
                min_gap_all=gaps.min().item(), median_gap=gaps.median().item(),
                est_rms=est, ratio_rms=rms_d / est, max_over_est=d.max().item() / est,
                max_over_rms=d.max().item() / rms_d,
                rel_err_resid=rel_x, rel_err_normed=rel_n,
                est_rel=math.sqrt(4 * depth + 1) * U)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=list(CONFIGS))
    ap.add_argument("seed", type=int)
    ap.add_argument("--depths", default="2,8,16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sites", default="qkv,o,gu,down,lm", help="ablation: GEMM inputs rounded in pass (b)")
    ap.add_argument("--max-layers", type=int, default=0, help="stop after this many layers (0 = all)")
    args = ap.parse_args()
    SITES.clear(); SITES.update(args.sites.split(","))
    c = CONFIGS[args.model]
    nl = args.max_layers or c["layers"]
    depths = sorted(set([int(d) for d in args.depths.split(",") if d and int(d) <= nl] + [nl]))
    t0 = time.time()

    gp = torch.Generator().manual_seed(args.seed * 31 + 5)
    ids = torch.randint(0, c["vocab"], (T,), generator=gp)

    ge = torch.Generator().manual_seed(args.seed * 100003 + 999983)
    emb = gen_bf16((c["vocab"], c["hidden"]), ge)
    if c["tied"]:
        lm = emb
    else:
        gl = torch.Generator().manual_seed(args.seed * 100003 + 999979)
        lm = gen_bf16((c["vocab"], c["hidden"]), gl)
    lm_f32 = lm.float()
    xa = emb[ids].float()
    xb = xa.clone()
    del emb, lm

    inv = rope_inv_freq(c)
    pos = torch.arange(T).float()
    fr = torch.outer(pos, inv)
    e = torch.cat((fr, fr), dim=-1)
    cos, sin = e.cos(), e.sin()
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    results = []
    for li in range(nl):
        L = Layer(c, args.seed, li)
        xa = layer_forward(xa, L, c, cos, sin, mask, bf=False)
        xb = layer_forward(xb, L, c, cos, sin, mask, bf=True)
        del L
        depth = li + 1
        if depth in depths:
            la = logits_of(xa, lm_f32, c, bf=False)
            lb = logits_of(xb, lm_f32, c, bf=True)
            r = stats(la, lb, depth, xa, xb, c)
            r.update(model=args.model, seed=args.seed, sites=args.sites)
            results.append(r)
            print(json.dumps(r), flush=True)
        print(f"# layer {depth} done t={time.time() - t0:.1f}s rms_x={xa.pow(2).mean().sqrt().item():.4g}",
              file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
