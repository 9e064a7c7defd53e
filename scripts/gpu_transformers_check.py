#!/usr/bin/env python3
"""A full-size random checkpoint made and run by transformers, for scripts/gpu_check.sh.

Developer tool (the GPU image has torch and transformers; tests never need Python).

  make    --config CONFIG.json --out DIR [--seed 1] [--prompt-len 64]
          Builds the model of CONFIG with transformers' own initialisation (torch seeded:
          matrices N(0, initializer_range^2), norm weights 1) in bf16 on the GPU (the CPU
          without one), saves it to DIR as a Hugging Face checkpoint (config.json +
          safetensors, bf16), writes DIR/ids.txt (--prompt-len random ids, seeded) and
          DIR/hf_logits.f32: transformers' logits of every position, computed in f32 on the
          bf16 weights (TF32 off), little-endian f32 [n, vocab].
  compare --out DIR
          Reads DIR/hf_logits.f32 and DIR/linnet_logits.f32 (compare_backends --model DIR
          --ids DIR/ids.txt --logits-out DIR/linnet_logits.f32) and prints the max |logit
          difference|, the top-1 agreement and PASS / FAIL against the bound of
          compare_backends (tests/compare_backends.cpp): the CUDA path rounds every GEMM
          input to bf16, transformers here does not, so a logit differs by about
          e = sqrt(4L + 1) * u * rms(logits), u = 2^-8 * sqrt(1 / (8 ln 2)) the rms relative
          error of one bf16 rounding (measured by scripts/estimate_bf16_rounding.py: max 4.6
          to 9.5 e); the bound is 16 e, and a different top-1 is a near tie (listed with
          its gap) unless the reference's two logits are more than 2 x bound apart.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np


def make(args):
    import torch
    import transformers

    t0 = time.time()
    with open(args.config) as f:
        cfg_dict = json.load(f)
    config = transformers.AutoConfig.for_model(**cfg_dict)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"checkpoint: {config.model_type}, {n_params / 1e9:.2f} B parameters, bf16, seed {args.seed}, "
          f"saved in {time.time() - t0:.0f} s on {device} (transformers {transformers.__version__}, "
          f"torch {torch.__version__})", flush=True)
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, config.vocab_size, size=args.prompt_len)
    with open(os.path.join(args.out, "ids.txt"), "w") as f:
        f.write(" ".join(str(int(i)) for i in ids) + "\n")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.float()
    with torch.no_grad():
        logits = model(torch.tensor(ids, device=device).unsqueeze(0)).logits[0].float().cpu().numpy()
    logits.astype("<f4").tofile(os.path.join(args.out, "hf_logits.f32"))
    with open(os.path.join(args.out, "layers.txt"), "w") as f:
        f.write(f"{config.num_hidden_layers}\n")
    print(f"transformers logits: {logits.shape[0]} x {logits.shape[1]} (f32 math on the bf16 weights)", flush=True)


def compare(args):
    ids = np.loadtxt(os.path.join(args.out, "ids.txt"), dtype=np.int64, ndmin=1)
    n = ids.shape[0]
    ref = np.fromfile(os.path.join(args.out, "hf_logits.f32"), dtype="<f4")
    got = np.fromfile(os.path.join(args.out, "linnet_logits.f32"), dtype="<f4")
    if ref.size != got.size or ref.size % n:
        print(f"result: FAIL (sizes differ: transformers {ref.size}, linnet-tp {got.size} values)")
        return 1
    ref = ref.reshape(n, -1).astype(np.float64)
    got = got.reshape(n, -1).astype(np.float64)
    with open(os.path.join(args.out, "layers.txt")) as f:
        layers = int(f.read())
    rms = math.sqrt(float(np.mean(ref * ref)))
    u = 2.0 ** -8 * math.sqrt(1.0 / (8.0 * math.log(2.0)))
    e = math.sqrt(4 * layers + 1) * u * rms
    bound = 16 * e
    diff = np.abs(ref - got)
    finite = bool(np.all(np.isfinite(got)))
    max_d = float(diff.max()) if finite else math.inf
    top_ref = ref.argmax(axis=1)
    top_got = got.argmax(axis=1)
    equal = int((top_ref == top_got).sum())
    ties = wrong = 0
    for i in np.nonzero(top_ref != top_got)[0]:
        gap = ref[i, top_ref[i]] - ref[i, top_got[i]]
        kind = "near tie" if gap <= 2 * bound else "WRONG"
        ties += kind == "near tie"
        wrong += kind == "WRONG"
        print(f"  position {i}: {kind}, transformers {top_ref[i]}, linnet-tp {top_got[i]} (gap {gap:.4f})")
    print(f"top-1 agreement: {equal}/{n} ({ties} near ties, {wrong} wrong)")
    print(f"max |logit diff|: {max_d:.5f}, rms {float(np.sqrt(np.mean(diff * diff))):.5f}; rms logits {rms:.4f}; "
          f"bound 16 e = {bound:.5f}")
    ok = finite and max_d <= bound and wrong == 0
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--config", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--prompt-len", type=int, default=64)
    c = sub.add_parser("compare")
    c.add_argument("--out", required=True)
    args = p.parse_args()
    if args.cmd == "make":
        make(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
