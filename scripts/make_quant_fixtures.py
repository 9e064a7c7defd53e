#!/usr/bin/env python3
"""Goldens for linnet-tp's at-load int8 weights (--weight-dtype int8), from
transformers on weights quantized and dequantized here, in numpy.

Requirements and usage as scripts/make_fixtures.py (the same pinned venv):

    /work/venv-fixtures/bin/python scripts/make_quant_fixtures.py [--out tests/data]

The scheme, written out from its definition (kernels/cpu/gemm.h documents the
same one; this file shares no code with linnet): every weight matrix of the
model (each nn.Linear and the nn.Embedding table, [out, in]) is cut into groups
of G consecutive inputs per output row; per group, in float32,
    s = max |w| / 127,   q = round-half-even(w / s) clipped to [-127, 127]
(q = 0 where s = 0), and the weight becomes float32(q) * s. Norm weights stay
as they are. transformers then runs the model in float32 on those weights.

For each tiny seed fixture (tests/data/fixtures/<name>/, made by
make_fixtures.py) and each source checkpoint (f32/, and bf16/ loaded as float32),
writes tests/data/fixtures/<name>/golden_int8.json:
    {"source", "scheme": {"bits", "group_size", "symmetric", "scale"},
     "prompt_ids" (golden.json's 40 ids),
     "logits_int8_f32" / "logits_int8_bf16": full uncached forward logits,
     "greedy": {"prompt_ids" (golden.json's 8), "new_tokens",
                "output_ids_int8_f32", "output_ids_int8_bf16"} (generate()
                with EOS disabled, checked against an uncached argmax loop),
     "min_greedy_margin_int8_f32" / "..._bf16": the smallest top-2 logit gap
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
    out = (q * s[:, :, None]).astype(np.float32)
    assert out.dtype == np.float32
    return out.reshape(n, k)


@torch.no_grad()
def quantize_model(model, group):
    seen = set()
    count = 0
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            p = m.weight
            if id(p) in seen:  # a tied lm_head: the same tensor
                continue
            seen.add(id(p))
            w = p.detach().to(torch.float32).numpy()
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
            "scheme": {"bits": 8, "group_size": GROUP, "symmetric": True,
                       "scale": "max|w| / 127 per group, float32; q = rint(w / s)"},
            "prompt_ids": prompt,
            "greedy": {"prompt_ids": gprompt, "new_tokens": n_new},
        }
        for variant in ("f32", "bf16"):
            model = mf.load_fixture(os.path.join(base, variant), torch.float32)
            n = quantize_model(model, GROUP)
            logits = mf.full_logits(model, prompt)
            out[f"logits_int8_{variant}"] = [[float(v) for v in row] for row in logits.numpy()]
            new = mf.greedy_generate_no_eos(model, gprompt, n_new)
            ref, margins = mf.greedy_uncached_margins(model, gprompt, n_new)
            if new != ref:
                sys.exit(f"{name}/{variant}: generate() and uncached argmax disagree")
            out["greedy"][f"output_ids_int8_{variant}"] = new
            out[f"min_greedy_margin_int8_{variant}"] = min(margins)
            print(f"{name}/{variant}: {n} matrices quantized; min greedy margin {min(margins):.3g}")
        mf.write_json(os.path.join(base, "golden_int8.json"), out)


if __name__ == "__main__":
    main()
