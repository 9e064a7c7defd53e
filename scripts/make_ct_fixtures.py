#!/usr/bin/env python3
"""Pre-quantized compressed-tensors checkpoints of the tiny seed fixtures, made by
llm-compressor, and their goldens from transformers (which reads them back).

Developer tool only (the C++ build and tests never need Python). It has a venv of
its own, because llmcompressor pins its own transformers:

    python3 -m venv /work/venv-llmc
    /work/venv-llmc/bin/pip install -r scripts/requirements-ct-fixtures.txt
    /work/venv-llmc/bin/python scripts/make_ct_fixtures.py [--out tests/data]

For each tiny seed fixture (tests/data/fixtures/<name>/f32, made by
make_fixtures.py) and each scheme below, llmcompressor's oneshot() quantizes every
nn.Linear of the decoder except the lm_head (ignore=["lm_head"], as the published
w4a16 / w8a16 checkpoints do; the embedding is no Linear) with plain min-max scales
(no calibration data), and save_pretrained(save_compressed=True) writes the
checkpoint (format "pack-quantized" for the integer schemes, "naive-quantized" /
"float-quantized" for FP8) to tests/data/fixtures/<name>/ct_<scheme>/ (ct_fp8_dynamic/
holds its config only: its model.safetensors is byte for byte ct_fp8's, checked here).
transformers then loads that folder back (decompressing it: run_compressed=False)
and runs it in float64 (the float32 dequantized weights, widened exactly), so the
goldens are the logits of the checkpoint as transformers reads it. Writes
tests/data/fixtures/<name>/golden_ct.json:
    {"source", "schemes": {scheme: its weights' QuantizationArgs, or a preset's name},
     "prompt_ids" (golden.json's 40 ids), "logits_<scheme>",
     "greedy": {"prompt_ids", "new_tokens", "output_ids_<scheme>"},
     "min_greedy_margin_<scheme>"}
Group size 4 divides every input width these fixtures have at tp 1, 2 and 4 (hidden
64; o_proj 64 / 32 / 16; down_proj e.g. 112 / 56 / 28).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import torch

import compressed_tensors
import llmcompressor
import transformers
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from transformers import AutoModelForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

FIXTURES = ["llama31", "qwen3", "phi3", "mistral"]
GROUP = 4
SCHEMES = {
    # int4, symmetric, groups of 4 (the "W4A16" preset with a smaller group)
    "w4a16": dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP),
    # int4 with zero points ("W4A16_ASYM")
    "w4a16_asym": dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=GROUP),
    # int8, symmetric, one scale per output channel ("W8A16")
    "w8a16": dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
    # FP8 e4m3 weights per channel, weight-only (format "naive-quantized")
    "fp8": dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
    # the "FP8_DYNAMIC" preset (format "float-quantized"): the same weights plus dynamic
    # per-token FP8 input activations, which linnet-tp does not apply; its golden is
    # transformers on this checkpoint with input_activations removed from its config
    # (the weight-only computation on the same stored weights)
    "fp8_dynamic": "FP8_DYNAMIC",
}


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "llmcompressor": llmcompressor.__version__, "compressed-tensors": compressed_tensors.__version__}


def check_pins(script_dir):
    pins = {}
    with open(os.path.join(script_dir, "requirements-ct-fixtures.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                name, ver = line.split("==")
                pins[name] = ver
    have = versions()
    for name in ("torch", "transformers", "llmcompressor", "compressed-tensors"):
        if not have[name].startswith(pins[name]):
            sys.exit(f"{name} {have[name]} is not the pinned {pins[name]} (scripts/requirements-ct-fixtures.txt)")


@torch.no_grad()
def full_logits(model, ids):
    out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


@torch.no_grad()
def greedy_uncached_margins(model, ids, n):
    ids, new, margins = list(ids), [], []
    for _ in range(n):
        row = full_logits(model, ids)[-1]
        top = torch.topk(row, 2).values
        nxt = int(torch.argmax(row).item())
        margins.append(float(top[0] - top[1]))
        ids.append(nxt)
        new.append(nxt)
    return new, margins


def quantize(src, dst, args):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager")
    if isinstance(args, str):  # a preset scheme of llmcompressor
        recipe = QuantizationModifier(targets="Linear", scheme=args, ignore=["lm_head"])
    else:
        scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
        recipe = QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(dst, save_compressed=True)
    for f in os.listdir(dst):  # the checkpoint only (no recipe.yaml)
        if f not in ("config.json", "generation_config.json", "model.safetensors"):
            os.remove(os.path.join(dst, f))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/data")
    args = ap.parse_args()
    check_pins(os.path.dirname(os.path.abspath(__file__)))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for name in FIXTURES:
        base = os.path.join(args.out, "fixtures", name)
        with open(os.path.join(base, "golden.json"), encoding="utf-8") as f:
            golden = json.load(f)
        prompt, gprompt = golden["prompt_ids"], golden["greedy"]["prompt_ids"]
        n_new = golden["greedy"]["new_tokens"]
        out = {"source": "scripts/make_ct_fixtures.py with " + ", ".join(f"{k} {v}" for k, v in versions().items()),
               "schemes": SCHEMES, "prompt_ids": prompt,
               "greedy": {"prompt_ids": gprompt, "new_tokens": n_new}}
        for scheme, qargs in SCHEMES.items():
            dst = os.path.join(base, "ct_" + scheme)
            shutil.rmtree(dst, ignore_errors=True)
            quantize(os.path.join(base, "f32"), dst, qargs)
            read = dst
            with tempfile.TemporaryDirectory() as tmp:
                if isinstance(qargs, str):  # weight-only reading of the same checkpoint
                    for f in os.listdir(dst):
                        shutil.copy(os.path.join(dst, f), tmp)
                    with open(os.path.join(tmp, "config.json"), encoding="utf-8") as f:
                        cfg = json.load(f)
                    for g in cfg["quantization_config"]["config_groups"].values():
                        g["input_activations"] = None
                    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
                        json.dump(cfg, f)
                    read = tmp
                model = AutoModelForCausalLM.from_pretrained(
                    read, dtype=torch.float32, attn_implementation="eager",
                    quantization_config=CompressedTensorsConfig(run_compressed=False))
            model.eval()
            model = model.double()
            # 9 significant digits: far inside the 1e-4 the tests hold, and a third of the bytes
            out[f"logits_{scheme}"] = [[float(f"{v:.9g}") for v in row] for row in full_logits(model, prompt).tolist()]
            new, margins = greedy_uncached_margins(model, gprompt, n_new)
            out["greedy"][f"output_ids_{scheme}"] = new
            if scheme == "fp8_dynamic":
                # The same stored weights as fp8 (only config.json differs): kept once, the
                # test pairs this config with ct_fp8/model.safetensors.
                with open(os.path.join(dst, "model.safetensors"), "rb") as a, \
                        open(os.path.join(base, "ct_fp8", "model.safetensors"), "rb") as b:
                    if a.read() != b.read():
                        sys.exit(f"{name}: fp8_dynamic's weights differ from fp8's")
                os.remove(os.path.join(dst, "model.safetensors"))
            out[f"min_greedy_margin_{scheme}"] = min(margins)
            print(f"{name}/{scheme}: min greedy margin {min(margins):.3g}", flush=True)
        with open(os.path.join(base, "golden_ct.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, separators=(",", ":"))
            f.write("\n")


if __name__ == "__main__":
    main()
