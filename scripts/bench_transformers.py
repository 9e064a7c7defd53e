#!/usr/bin/env python3
"""The transformers (torch CPU) peer of scripts/bench.sh, in the same sitting.

Makes a random-weight checkpoint of a config (default: scripts/configs/smollm2-135m.json)
with transformers, saves it (f32 safetensors) for linnet-tp to load too, and times
transformers on it with --threads torch threads: prefill of --prompt-len tokens, greedy
decode of --new-tokens tokens with the KV cache, and the loss (labels = input_ids) of
--loss-docs documents of --loss-len tokens. Developer tool only (venv of
scripts/requirements-fixtures.txt); nothing in the build or tests needs it.

  python scripts/bench_transformers.py --out /tmp/smollm2-random
  linnet-tp loss --model /tmp/smollm2-random --input /tmp/smollm2-random/docs.jsonl
"""

import argparse
import json
import os
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(here, "configs", "smollm2-135m.json"))
    ap.add_argument("--out", required=True, help="folder for the checkpoint and docs.jsonl")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--loss-docs", type=int, default=4)
    ap.add_argument("--loss-len", type=int, default=1024)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(a.config)
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.eval()
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    model = model.to(getattr(torch, a.dtype))

    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, cfg.vocab_size, (a.loss_len,), generator=g) for _ in range(a.loss_docs)]
    with open(os.path.join(a.out, "docs.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"ids": [int(x) for x in d]}) + "\n")

    res = {"transformers": transformers.__version__, "torch": torch.__version__, "threads": a.threads,
           "dtype": a.dtype}
    with torch.no_grad():
        ids = torch.randint(0, cfg.vocab_size, (1, a.prompt_len), generator=g)
        model(ids)  # warm-up
        t = time.perf_counter()
        out = model(ids, use_cache=True)
        res["prefill_tok_s"] = a.prompt_len / (time.perf_counter() - t)
        past = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        t = time.perf_counter()
        for _ in range(a.new_tokens):
            out = model(nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
        res["decode_tok_s"] = a.new_tokens / (time.perf_counter() - t)
        model(docs[0][None, :64], labels=docs[0][None, :64])  # warm-up
        t = time.perf_counter()
        nll = [float(model(d[None], labels=d[None]).loss) for d in docs]
        res["loss_tok_s"] = a.loss_docs * a.loss_len / (time.perf_counter() - t)
        res["loss_mean_nll"] = nll
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
