#!/usr/bin/env python3
"""Goldens for linnet-tp's at-load int8 and int4 weights (--weight-dtype int8 |
int4), from transformers on weights quantized and dequantized here, in numpy.

Requirements and usage as scripts/make_fixtures.py (the same pinned venv):

    /work/venv-fixtures/bin/python scripts/make_quant_fixtures.py [--out tests/data]

The scheme, written out from its definition (kernels/cpu/gemm.h documents the
same one; this file shares no code with linnet): every weight matrix of the
model (each nn.Linear and the nn.Embedding table, [out, in]) is cut into groups
of G consecutive inputs per output row; per group, in float32,
    s = max |w| / 127,   q = round-half-even(w / s) clipped to [-127, 127]
(q = 0 where s = 0), and the weight becomes float32(q) * s. int4 (asymmetric,
w ~ q s + m with q in [0, 15]) searches each group's (s, m): see
quantize_dequantize_int4; the embedding table and the lm_head stay int8 then.
Norm weights stay as they are. transformers then runs the model in float64 on
those float32 weights (widened exactly), so the goldens are the exact logits of the
dequantized model up to float64 rounding.

For each tiny seed fixture (tests/data/fixtures/<name>/, made by
make_fixtures.py) and each source checkpoint (f32/, and bf16/ loaded as float32),
writes tests/data/fixtures/<name>/golden_quant.json:
    {"source", "scheme": {"bits", "group_size", "symmetric", "scale"},
     "prompt_ids" (golden.json's 40 ids),
     "logits_int{8,4}_{f32,bf16}": full uncached forward logits,
     "greedy": {"prompt_ids" (golden.json's 8), "new_tokens",
                "output_ids_int{8,4}_{f32,bf16}"} (generate() with EOS disabled,
                checked against an uncached argmax loop),
     "min_greedy_margin_int{8,4}_{f32,bf16}": the smallest top-2 logit gap
                over those greedy steps}
G = 4 divides every input width of these fixtures at tp 1, 2 and 4 (hidden 64;
o_proj 64 / 32 / 16; down_proj e.g. 112 / 56 / 28), so the same golden holds at
each tp size. At tp 8, Llama-3.1's down_proj slice is 14 wide: linnet refuses
G = 4 there, which the test checks.
"""
import argparse
import copy
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (versions, pins, loading, greedy, JSON)

GROUP = 4
FIXTURES = ["llama31", "qwen3", "phi3", "mistral"]


def quantize_dequantize(w, group):
    """w: float32 [n, k] -> the float32 values its int8 groups stand for."""
    n, k = w.shape
    assert k % group == 0, (w.shape, group)
    wg = w.reshape(n, k // group, group)
    amax = np.abs(wg).max(axis=2)
    s = (amax / np.float32(127.0)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1.0)).astype(np.float32)
    q = np.rint(wg / safe[:, :, None])
    q = np.where(s[:, :, None] > 0, q, np.float32(0.0))
    q = np.clip(q, -127, 127).astype(np.float32)
    s = np.where(np.isfinite(wg).all(axis=2), s, np.float32(np.nan)).astype(np.float32)  # NaN / inf: NaN
    out = (q * s[:, :, None]).astype(np.float32)
    assert out.dtype == np.float32
    return out.reshape(n, k)


def quantize_dequantize_int4(w, group):
    """w: float32 [n, k] -> the float32 values its int4 groups stand for: per group,
    in float64 with sums in ascending order, round-to-nearest over [min, max] and 20
    rescalings of it, each refit by least squares; the (s, m) of least squared error,
    stored as s and m' = m + 8 s in float32; the weight becomes
    float32((q - 8) * s) + m' (float32 each)."""
    n, k = w.shape
    assert k % group == 0 and group % 2 == 0, (w.shape, group)
    wg = w.reshape(-1, group).astype(np.float64)            # [groups, G]
    mn, mx = wg.min(axis=1), wg.max(axis=1)
    span = mx - mn
    live = span > 0
    safe_span = np.where(live, span, 1.0)
    best_err = np.full(len(wg), np.inf)
    best_s = np.zeros(len(wg))
    best_m = mn.copy()
    best_q = np.zeros_like(wg)
    sw = np.zeros(len(wg)); sww = np.zeros(len(wg))
    for i in range(group):                                    # ascending, as the C++ loop
        sw = sw + wg[:, i]
        sww = sww + wg[:, i] * wg[:, i]
    for step in range(-1, 21):
        iscale = 15.0 / safe_span if step < 0 else (15.0 + (step - 10) * 0.1) / safe_span
        q = np.clip(np.rint(iscale[:, None] * (wg - mn[:, None])), 0.0, 15.0)
        sq = np.zeros(len(wg)); sqq = np.zeros(len(wg)); sqw = np.zeros(len(wg))
        for i in range(group):                                # ascending, as the C++ loop
            sq = sq + q[:, i]
            sqq = sqq + q[:, i] * q[:, i]
            sqw = sqw + q[:, i] * wg[:, i]
        if step < 0:
            s_, m_ = span / 15.0, mn
            ok = live
        else:
            nn = float(group)
            det = nn * sqq - sq * sq
            with np.errstate(divide="ignore", invalid="ignore"):
                s_ = (nn * sqw - sq * sw) / det
                m_ = (sqq * sw - sq * sqw) / det
            ok = live & (det > 0) & (s_ > 0)
        nn = float(group)
        err = sww - 2.0 * s_ * sqw - 2.0 * m_ * sw + s_ * s_ * sqq + 2.0 * s_ * m_ * sq + nn * m_ * m_
        take = ok & ((step < 0) | (err < best_err))
        best_err = np.where(take, err, best_err)
        best_s = np.where(take, s_, best_s)
        best_m = np.where(take, m_, best_m)
        best_q = np.where(take[:, None], q, best_q)
    # Stored as w = (q - 8) s + m' with m' = m + 8 s (float32 each).
    bad = ~np.isfinite(wg).all(axis=1)                          # NaN / inf in the group: NaN
    s32 = np.where(bad, np.nan, best_s).astype(np.float32)
    m32 = np.where(bad, np.nan, best_m + 8.0 * best_s).astype(np.float32)
    out = ((best_q - 8.0).astype(np.float32) * s32[:, None]).astype(np.float32) + m32[:, None]
    return out.astype(np.float32).reshape(n, k)


@torch.no_grad()
def quantize_model(model, group, bits):
    """Every matrix to `bits` (8 or 4); with 4, the embedding table and the lm_head go
    to int8 instead (linnet's vocab_weight_dtype)."""
    vocab = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    seen = set()
    count = 0
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            p = m.weight
            if id(p) in seen:  # a tied lm_head: the same tensor
                continue
            seen.add(id(p))
            w = p.detach().to(torch.float32).numpy()
            if bits == 4 and id(p) not in vocab:
                p.copy_(torch.from_numpy(quantize_dequantize_int4(w, group)))
            else:
                p.copy_(torch.from_numpy(quantize_dequantize(w, group)))
            count += 1
    return count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/data")
    args = ap.parse_args()
    mf.check_pins(os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name in FIXTURES:
        base = os.path.join(args.out, "fixtures", name)
        with open(os.path.join(base, "golden.json"), encoding="utf-8") as f:
            golden = json.load(f)
        prompt = golden["prompt_ids"]
        gprompt = golden["greedy"]["prompt_ids"]
        n_new = golden["greedy"]["new_tokens"]
        out = {
            "source": "scripts/make_quant_fixtures.py with " +
                      ", ".join(f"{k} {v}" for k, v in mf.versions().items()),
            "scheme": {"group_size": GROUP,
                       "int8": "symmetric: s = max|w| / 127 per group, float32; q = rint(w / s)",
                       "int4": "asymmetric, w ~ q s + m, q in [0, 15]: the least-squares search of "
                               "quantize_dequantize_int4; embedding and lm_head in int8"},
            "prompt_ids": prompt,
            "greedy": {"prompt_ids": gprompt, "new_tokens": n_new},
        }
        for bits in (8, 4):
            for variant in ("f32", "bf16"):
                model = mf.load_fixture(os.path.join(base, variant), torch.float32)
                n = quantize_model(model, GROUP, bits)
                # The dequantized float32 weights, widened exactly: transformers then
                # runs in float64, so the golden carries no float32 rounding of its own
                # (linnet sums int4's scale and offset terms apart, another f32 rounding
                # than transformers' f32 matmul; against float64 both are held to 1e-4).
                model = model.double()
                key = f"int{bits}_{variant}"
                logits = mf.full_logits(model, prompt)
                out[f"logits_{key}"] = [[float(v) for v in row] for row in logits.numpy()]
                new = mf.greedy_generate_no_eos(model, gprompt, n_new)
                ref, margins = mf.greedy_uncached_margins(model, gprompt, n_new)
                if new != ref:
                    sys.exit(f"{name}/{key}: generate() and uncached argmax disagree")
                out["greedy"][f"output_ids_{key}"] = new
                out[f"min_greedy_margin_{key}"] = min(margins)
                print(f"{name}/{key}: {n} matrices quantized; min greedy margin {min(margins):.3g}")
        mf.write_json(os.path.join(base, "golden_quant.json"), out)


if __name__ == "__main__":
    main()
