#!/usr/bin/env python3
"""Make golden test fixtures for linnet-tp with Hugging Face transformers.

Requirements: the exact versions pinned in scripts/requirements-fixtures.txt
(torch, transformers, tokenizers, safetensors, numpy, jinja2). Install them
once into a virtual environment OUTSIDE the repository:

    python3 -m venv /work/venv-fixtures
    /work/venv-fixtures/bin/pip install -r scripts/requirements-fixtures.txt

Usage (from the repository root):

    /work/venv-fixtures/bin/python scripts/make_fixtures.py [--shared ../shared] [--out tests/data]

This is a developer tool only. The C++ tests read the files it writes and
never run Python; the goldens come from transformers / tokenizers, never from
linnet code. Everything runs on the CPU in float32 under torch.no_grad() with
a fixed seed, single-threaded, with eager attention, so reruns with the same
pinned versions give the same bytes.

Outputs, from <shared>/models/stories260k (a real tiny Llama, vocab 512):

  <out>/stories260k/forward.json
      {"source", "model", "cases": [{"name", "input_ids", "logits"}]}
      logits[i] is the 512-wide float32 logit row for position i (a full,
      uncached forward pass over input_ids), written as the exact double value
      of each float32. Cases: "once_upon" (tokenizer encoding, with BOS, of
      "Once upon a time, there was a little"), "long" (BOS followed by the
      first 47 greedy tokens from the empty prompt: 48 ids), "bos_only" ([1]).

  <out>/stories260k/greedy.json
      {"source", "model", "cases": [{"prompt", "input_ids", "max_new_tokens",
      "eos_token_id", "output_ids", "finish_reason", "text", "full_text"}]}
      model.generate(do_sample=False, max_new_tokens=60); generation stops
      early only if EOS (id 2) is produced ("finish_reason": "eos", with the
      EOS id as the last of output_ids), else "length". "text" decodes the new
      ids only, "full_text" the prompt and the new ids (skip_special_tokens).
      Each generate() result is cross-checked against an uncached argmax loop.
      Sanity check: the empty prompt must give llama2.c's documented story.

  <out>/stories260k/tokenizer_cases.json
      {"source", "cases": [{"text", "ids", "ids_no_special", "decoded"}]}
      made with tokenizers.Tokenizer.from_file(tokenizer.json), i.e. exactly the
      pipeline tokenizer.json describes (Prepend "▁" + Replace normalizer, BPE
      with byte fallback, BOS template, special tokens matched inside text).
      "decoded" is decode(ids, skip_special_tokens=True). transformers 5's
      AutoTokenizer (LlamaTokenizer) rebuilds its own pipeline and disagrees
      with tokenizer.json on some inputs (leading spaces, text around special
      tokens); where it does, the case also carries "transformers_ids" /
      "transformers_ids_no_special" for information only.
"""

import argparse
import json
import os
import sys

import numpy as np
import tokenizers
import torch
import transformers
from transformers import AutoTokenizer, LlamaForCausalLM

MODEL = "stories260k"
SEED = 0

ONCE_UPON = "Once upon a time, there was a little"
LONG_LEN = 48
GREEDY_PROMPTS = ["", "Once upon a time"]
GREEDY_NEW = 60
EXPECTED_EMPTY_PROMPT_START = (
    "Once upon a time, there was a little girl named Lily. "
    "She loved to play outside in the park."
)

TOKENIZER_TEXTS = [
    "",
    " ",
    "  ",
    "Once upon a time",
    "  two leading spaces",
    "trailing space ",
    "multi\nline\n\ttabs",
    "Hello, World!",
    "caf\u00e9",
    "na\u00efve",
    "\u65e5\u672c\u8a9e",
    "emoji \U0001F600 here",
    "\u00dcn\u00efc\u00f6d\u00e9",
    "<s>hello</s>",
    "a <unk> b",
    "</s>",
    "<s>",
    "12345 678",
    "!!!???...",
    "a  b   c    d",
    "Tim's dog didn't bark.",
    "\"Quotes\" and (parens) [brackets] {braces}",
    "CamelCase UPPER lower MiXeD",
    "\n",
    "tab\tseparated\tvalues",
    "Once upon a time, there was a little girl named Lily. She loved to play "
    "outside in the park. One day, she saw a big, red ball in the sky.",
]


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
    }


def check_pins(script_dir):
    """Warn (do not fail) when installed versions differ from the pins."""
    req = os.path.join(script_dir, "requirements-fixtures.txt")
    if not os.path.exists(req):
        print(f"warning: {req} not found", file=sys.stderr)
        return
    have = {k.lower(): v for k, v in versions().items()}
    with open(req, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if "==" not in line:
                continue
            name, want = (s.strip() for s in line.split("==", 1))
            got = have.get(name.lower())
            # torch reports a local build tag (2.15.0+cu132); compare the
            # public version only.
            if got is not None and got.split("+", 1)[0] != want:
                print(f"warning: {name} {got} installed, {want} pinned; "
                      "goldens may differ", file=sys.stderr)


def load_model(model_dir):
    kwargs = dict(attn_implementation="eager")
    major = int(transformers.__version__.split(".")[0])
    # transformers 5 renamed torch_dtype to dtype.
    kwargs["dtype" if major >= 5 else "torch_dtype"] = torch.float32
    model = LlamaForCausalLM.from_pretrained(model_dir, **kwargs)
    model.eval()
    assert next(model.parameters()).dtype == torch.float32
    return model


@torch.no_grad()
def full_logits(model, ids):
    out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    logits = out.logits[0].to(torch.float32)
    assert logits.shape == (len(ids), model.config.vocab_size), logits.shape
    return logits


@torch.no_grad()
def greedy_uncached(model, ids, n, eos):
    ids = list(ids)
    new = []
    for _ in range(n):
        nxt = int(torch.argmax(full_logits(model, ids)[-1]).item())
        ids.append(nxt)
        new.append(nxt)
        if eos is not None and nxt == eos:
            break
    return new


@torch.no_grad()
def greedy_generate(model, ids, n, eos):
    inp = torch.tensor([ids], dtype=torch.long)
    out = model.generate(
        inp,
        attention_mask=torch.ones_like(inp),
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=eos,
        pad_token_id=eos if eos is not None else 0,
        num_beams=1,
    )
    return [int(x) for x in out[0, len(ids):].tolist()]


def row_json(values):
    # float(np.float32) is the exact double of the float32; json writes the
    # shortest repr that round-trips that double.
    return json.dumps([float(v) for v in values])


def write_forward(path, source, cases):
    """Hand-formatted JSON: one logits row per line keeps diffs readable."""
    parts = ['{\n', f'  "source": {json.dumps(source)},\n',
             f'  "model": {json.dumps(MODEL)},\n', '  "cases": [\n']
    for ci, c in enumerate(cases):
        parts.append('    {\n')
        parts.append(f'      "name": {json.dumps(c["name"])},\n')
        parts.append(f'      "input_ids": {json.dumps(c["input_ids"])},\n')
        parts.append('      "logits": [\n')
        rows = c["logits"]
        for ri, row in enumerate(rows):
            sep = "," if ri + 1 < len(rows) else ""
            parts.append(f'        {row_json(row)}{sep}\n')
        parts.append('      ]\n')
        parts.append('    }' + ("," if ci + 1 < len(cases) else "") + '\n')
    parts.append('  ]\n}\n')
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(parts))


def dumps(obj, indent=0):
    """Indented JSON with every list of scalars (token ids) on one line."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps(v, indent + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        items = [inner + dumps(x, indent + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(obj) + "\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"),
                    help="the shared/ reference folder (default ../shared)")
    ap.add_argument("--out", default=os.path.join(root, "tests", "data"),
                    help="output folder (default tests/data)")
    args = ap.parse_args()

    check_pins(here)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    model_dir = os.path.join(args.shared, "models", MODEL)
    out_dir = os.path.join(args.out, MODEL)
    os.makedirs(out_dir, exist_ok=True)

    v = versions()
    src_model = f"transformers {v['transformers']}, torch {v['torch']}"
    src_tok = f"tokenizers {v['tokenizers']}"

    tok = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(model_dir)
    model = load_model(model_dir)
    bos = model.config.bos_token_id
    eos = model.config.eos_token_id

    def encode(text, special=True):
        return list(tok.encode(text, add_special_tokens=special).ids)

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    # ---- greedy.json -------------------------------------------------------
    greedy_cases = []
    for prompt in GREEDY_PROMPTS:
        ids = encode(prompt)
        new = greedy_generate(model, ids, GREEDY_NEW, eos)
        ref = greedy_uncached(model, ids, GREEDY_NEW, eos)
        if new != ref:
            sys.exit(f"generate() and uncached argmax disagree for {prompt!r}:"
                     f"\n  {new}\n  {ref}")
        finish = "eos" if (new and new[-1] == eos) else "length"
        greedy_cases.append({
            "prompt": prompt,
            "input_ids": ids,
            "max_new_tokens": GREEDY_NEW,
            "eos_token_id": eos,
            "output_ids": new,
            "finish_reason": finish,
            "text": decode(new),
            "full_text": decode(ids + new),
        })
        print(f"greedy {prompt!r} ({finish}, {len(new)} tokens): {decode(new)!r}")
    empty_text = greedy_cases[0]["text"]
    if not empty_text.startswith(EXPECTED_EMPTY_PROMPT_START):
        sys.exit("sanity check failed: empty-prompt greedy text does not start "
                 f"with llama2.c's story:\n  {empty_text!r}")
    print("sanity check passed: empty-prompt greedy text matches llama2.c")
    write_json(os.path.join(out_dir, "greedy.json"),
               {"source": src_model, "model": MODEL, "cases": greedy_cases})

    # ---- forward.json ------------------------------------------------------
    story = greedy_cases[0]["output_ids"]
    long_ids = ([bos] + story)[:LONG_LEN]
    fwd_inputs = [
        ("once_upon", encode(ONCE_UPON)),
        ("long", long_ids),
        ("bos_only", [bos]),
    ]
    fwd_cases = []
    for name, ids in fwd_inputs:
        logits = full_logits(model, ids).numpy().astype(np.float32)
        fwd_cases.append({"name": name, "input_ids": ids, "logits": logits})
        print(f"forward {name}: {len(ids)} ids, logits[0][:4]={logits[0][:4].tolist()}, "
              f"argmax(last)={int(logits[-1].argmax())}")
    # Consistency: the long case's argmaxes replay the greedy story.
    la = fwd_cases[1]["logits"].argmax(axis=1).tolist()
    if la[:-1] != long_ids[1:]:
        sys.exit("forward 'long' argmaxes do not replay the greedy tokens")
    write_forward(os.path.join(out_dir, "forward.json"), src_model, fwd_cases)

    # ---- tokenizer_cases.json ---------------------------------------------
    tok_cases = []
    n_diff = 0
    for text in TOKENIZER_TEXTS:
        ids = encode(text, True)
        ids_ns = encode(text, False)
        case = {"text": text, "ids": ids, "ids_no_special": ids_ns,
                "decoded": decode(ids)}
        a_ids = list(auto(text, add_special_tokens=True)["input_ids"])
        a_ns = list(auto(text, add_special_tokens=False)["input_ids"])
        if a_ids != ids or a_ns != ids_ns:
            n_diff += 1
            case["transformers_ids"] = a_ids
            case["transformers_ids_no_special"] = a_ns
        tok_cases.append(case)
    print(f"tokenizer: {len(tok_cases)} cases, {n_diff} where transformers' "
          "AutoTokenizer differs from tokenizer.json")
    write_json(os.path.join(out_dir, "tokenizer_cases.json"), {
        "source": src_tok,
        "note": ("ids/ids_no_special/decoded come from tokenizers.Tokenizer."
                 "from_file(tokenizer.json). transformers_ids* (present only "
                 "where they differ) come from transformers "
                 f"{v['transformers']} AutoTokenizer and are informational."),
        "cases": tok_cases,
    })

    for fn in ("forward.json", "greedy.json", "tokenizer_cases.json"):
        p = os.path.join(out_dir, fn)
        print(f"wrote {p} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
