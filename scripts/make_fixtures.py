#!/usr/bin/env python3
"""Make golden test fixtures for linnet-tp with Hugging Face transformers.

Requirements: the exact versions pinned in scripts/requirements-fixtures.txt
(torch, transformers, tokenizers, safetensors, numpy, jinja2). Install them
once into a virtual environment OUTSIDE the repository:

    python3 -m venv /work/venv-fixtures
    /work/venv-fixtures/bin/pip install -r scripts/requirements-fixtures.txt

Usage (from the repository root):

    /work/venv-fixtures/bin/python scripts/make_fixtures.py [--shared ../shared] [--out tests/data]
        [--only all|stories|fixtures]

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

Outputs, tiny seed-model fixtures (see FIXTURES below): llama31, qwen3, phi3
are the real config.json files of <shared>/models/cards/{llama-3.1-8b-instruct,
qwen3-4b, phi-3-mini-4k-instruct} with only sizes (and out-of-vocab token ids)
shrunk; mistral is Mistral-7B-v0.1's config.json (written inline below, there
is no card for it) with sizes shrunk and sliding_window 16; all built by
transformers, with seeded random weights:

  <out>/fixtures/<name>/f32/         config.json, generation_config.json,
                                     model.safetensors (float32)
  <out>/fixtures/<name>/bf16/        the same weights rounded to bfloat16
  <out>/fixtures/phi3/f32_sharded/   the f32 weights in 2 shards + index.json
  <out>/fixtures/<name>/config.transformers5.json
      config.json as transformers 5 save_pretrained writes it ("rope_parameters",
      "dtype", ...). The config.json files in the checkpoint folders use the
      real hub spelling instead ("rope_theta", "rope_scaling", "torch_dtype").
  <out>/fixtures/<name>/golden.json
      {"source", "model_type", "architecture", "config" (summary),
       "prompt_ids" (40 seeded random ids), "sliding_window_keys_attended"
       (keys a query attends to in transformers, self included, measured;
       null = full causal attention, checked), "greedy" {"prompt_ids" (first 8
       prompt ids), "new_tokens" (24), "output_ids_f32",
       "output_ids_bf16_weights", "output_ids_bf16_kv"} (generate(do_sample=False) with EOS
       disabled, equal to an uncached argmax loop), "min_greedy_margin" (the
       smallest top-2 logit gap over those greedy steps),
       "logits_f32" (f32 file, f32 math), "logits_bf16_weights" (bf16 file
       loaded as float32), "logits_bf16_compute" (bf16 file, bf16 math),
       "logits_bf16_gemm_inputs" (bf16 file, f32 math, every nn.Linear's input
       rounded to bf16 first: the CUDA backend's numerics), each
       40 rows of vocab_size exact doubles of the float32 (or bf16) values,
       full uncached forward pass over prompt_ids, eager attention,
       "logits_bf16_kv" (f32 file, f32 math, every attention layer's key and
       value states rounded to bf16 first: --kv-cache-dtype bf16), with
       "bf16_kv_noise_spread" (the same noise test on the K/V states) and
       "tolerance_bf16_kv" (max(1e-4, 2 x that spread)),
       "bf16_gemm_inputs_noise_spread" (how far logits_bf16_gemm_inputs moves
       when f32-level noise, 1e-6 to 4e-6 relative, as another summation order
       makes, is added before each bf16 rounding, so activations land on the
       other side of a rounding step), "tolerance_cuda" (2 x that spread: the
       CUDA engine tests' per-architecture bound on |CUDA -
       logits_bf16_gemm_inputs| and on |decode - forward|)}
  <out>/fixtures/llama31_inv_freq.json
      the llama3-scaled and default rope inverse-frequency tables transformers
      computes for the real Llama-3.1-8B config and for the llama31 fixture.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import shutil
import sys

import numpy as np
import tokenizers
import torch
import transformers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer,
                          LlamaForCausalLM)

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
def full_logits_bf16_gemm_inputs(model, ids):
    """full_logits with every nn.Linear input rounded to bfloat16 (then back to
    float32) before the matmul: a bf16 x bf16 GEMM with f32 accumulation, as
    the CUDA backend runs its projections and lm_head."""
    def round_input(_module, args):
        return (args[0].to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])
    hooks = [m.register_forward_pre_hook(round_input)
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        return full_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()


@contextlib.contextmanager
def bf16_kv_states(model, rel_noise=0.0, seed=0):
    """Within it, every attention layer's key and value states (after rope and any QK
    norm: what a KV cache holds) are rounded to bfloat16 and back before the attention
    math: what --kv-cache-dtype bf16 stores and reads. With rel_noise, seeded relative
    noise is added before the rounding (the spread another f32 summation order makes)."""
    gen = torch.Generator().manual_seed(seed)
    patched = {}

    def rounded(k):
        if rel_noise:
            k = k * (1 + rel_noise * torch.randn(k.shape, generator=gen))
        return k.to(torch.bfloat16).to(torch.float32)

    for m in model.modules():
        mod = sys.modules[type(m).__module__]
        if hasattr(mod, "eager_attention_forward") and mod not in patched:
            orig = mod.eager_attention_forward
            patched[mod] = orig

            def wrapper(module, query, key, value, *a, _orig=orig, **kw):
                return _orig(module, query, rounded(key), rounded(value), *a, **kw)
            mod.eager_attention_forward = wrapper
    if not patched:
        sys.exit("no eager_attention_forward to round the KV states in")
    try:
        yield
    finally:
        for mod, orig in patched.items():
            mod.eager_attention_forward = orig


@torch.no_grad()
def full_logits_bf16_kv(model, ids, rel_noise=0.0, seed=0):
    """full_logits under bf16_kv_states."""
    with bf16_kv_states(model, rel_noise, seed):
        return full_logits(model, ids)


@torch.no_grad()
def bf16_gemm_inputs_noise_spread(model, ids, ref):
    """Max |logits - ref| over 4 runs of full_logits_bf16_gemm_inputs with
    seeded relative noise (1e-6, 1e-6, 4e-6, 4e-6) on every nn.Linear input
    before its bf16 rounding: what a different f32 summation order does to
    bf16-rounded numerics."""
    worst = 0.0
    for seed, rel in ((1, 1e-6), (2, 1e-6), (3, 4e-6), (4, 4e-6)):
        gen = torch.Generator().manual_seed(seed)

        def noisy_round(_module, args):
            x = args[0] * (1 + rel * torch.randn(args[0].shape, generator=gen))
            return (x.to(torch.bfloat16).to(torch.float32),) + tuple(args[1:])
        hooks = [m.register_forward_pre_hook(noisy_round)
                 for m in model.modules() if isinstance(m, torch.nn.Linear)]
        try:
            worst = max(worst, float((full_logits(model, ids) - ref).abs().max()))
        finally:
            for h in hooks:
                h.remove()
    return worst


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


def make_stories(args):
    """The stories260k goldens (see the module docstring)."""
    torch.manual_seed(SEED)
    np.random.seed(SEED)

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



# ---------------------------------------------------------------------------
# Tiny seed-model fixtures: llama31, qwen3, phi3, mistral
# ---------------------------------------------------------------------------
#
# Each fixture is the REAL config.json of a seed model (shared/models/cards/;
# for mistral, written inline as "base_config") with only sizes shrunk, built
# by transformers (AutoModelForCausalLM.from_config), filled with seeded
# random weights, and saved by save_pretrained. config.json is then rewritten
# in the REAL checkpoints' spelling (rope_theta / rope_scaling / torch_dtype at
# top level): transformers 5 would write "rope_parameters" and "dtype"
# instead, and the C++ loader must read what checkpoints on the hub contain.
# What transformers 5 itself wrote is kept next to it as
# <name>/config.transformers5.json (for information / a second loader test).
# Every golden is computed from the checkpoint as loaded back from disk with
# from_pretrained (real-spelling config), so the files and the goldens cannot
# drift apart.

FIXTURE_PROMPT_LEN = 40
FIXTURE_GREEDY_PROMPT = 8
FIXTURE_GREEDY_NEW = 24
FIXTURE_MIN_MARGIN = 1e-3

FIXTURES = [
    {
        "name": "llama31",
        "card": "llama-3.1-8b-instruct",
        "seed": 31,
        # head_dim = 64 / 8 = 8, implicit (no head_dim key), as in the real
        # config. rope_scaling keeps factor 8, low 1, high 4 and rope_theta
        # 500000; original_max_position_embeddings 240 (< the shrunk
        # max_position_embeddings 256, which transformers' llama3 validation
        # wants) puts the 4 frequencies (wavelengths ~6.3, ~167, ~4443,
        # ~118000) in the high / medium / low / low bands, and the medium-band
        # frequency turns by ~1.5 rad over 40 positions, so a wrong band
        # formula shows in the logits.
        "override": {
            "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 112,
            "max_position_embeddings": 256, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 301,
            "bos_token_id": 297, "eos_token_id": [298, 299, 300],
        },
        "rope_override": {"original_max_position_embeddings": 240},
        "generation": {"bos_token_id": 297, "eos_token_id": [298, 299, 300]},
    },
    {
        "name": "qwen3",
        "card": "qwen3-4b",
        "seed": 3,
        # head_dim 16 != 64 / 8: q_proj is [128, 64], o_proj [64, 128].
        # Tied head: model.safetensors has no lm_head.weight.
        "override": {
            "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96,
            "max_position_embeddings": 256, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 303,
            "max_window_layers": 2, "bos_token_id": 301, "eos_token_id": 302,
        },
        "generation": {"bos_token_id": 301, "eos_token_id": [302, 301],
                       "pad_token_id": 301},
    },
    {
        "name": "phi3",
        "card": "phi-3-mini-4k-instruct",
        "seed": 4,
        # MHA, fused qkv_proj [3*64, 64] and gate_up_proj [2*160, 64],
        # sliding_window 16. pad_token_id (32000 in the real config) must be
        # < vocab_size for nn.Embedding(padding_idx=...), so eos/pad move to
        # 296; bos stays 1. original_max_position_embeddings is shrunk along
        # with max_position_embeddings (equal, as in the real config; unused
        # without rope_scaling).
        "override": {
            "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 160,
            "max_position_embeddings": 256,
            "original_max_position_embeddings": 256,
            "num_attention_heads": 4, "num_key_value_heads": 4,
            "vocab_size": 299, "sliding_window": 16,
            "bos_token_id": 1, "eos_token_id": 296, "pad_token_id": 296,
        },
        "generation": {"bos_token_id": 1, "eos_token_id": [296, 297, 298],
                       "pad_token_id": 296},
        "shard": "300KB",
    },
    {
        "name": "mistral",
        "card": None,                   # no card: base_config is used instead
        "seed": 7,
        # Mistral-7B-v0.1's config.json as on the hub (model_type "mistral",
        # no head_dim key: 4096 / 32 = 128 implicit; rope_theta at top level;
        # sliding_window 4096). Shrunk: GQA 8 query / 2 kv heads, head_dim
        # 64 / 8 = 8 implicit, vocab 297 (not a multiple of 4), untied head,
        # and sliding_window 16, so the 40-token prompt is 2.5 windows long
        # and keys fall out of the window for 24 of its 40 queries.
        "base_config": {
            "architectures": ["MistralForCausalLM"],
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 14336,
            "max_position_embeddings": 32768,
            "model_type": "mistral",
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.34.0.dev0",
            "use_cache": True,
            "vocab_size": 32000,
        },
        "override": {
            "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "max_position_embeddings": 256, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 297, "sliding_window": 16,
            "bos_token_id": 1, "eos_token_id": 2,
        },
        "generation": {"bos_token_id": 1, "eos_token_id": 2},
    },
]


def fixture_real_config(shared, fx, dtype_name):
    """The real config.json dict with sizes shrunk, in the real spelling."""
    if fx["card"] is None:
        cfg = copy.deepcopy(fx["base_config"])
    else:
        path = os.path.join(shared, "models", "cards", fx["card"], "config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    cfg.update(copy.deepcopy(fx["override"]))
    if "rope_override" in fx:
        cfg["rope_scaling"] = dict(cfg["rope_scaling"], **fx["rope_override"])
    cfg["torch_dtype"] = dtype_name
    cfg["transformers_version"] = transformers.__version__
    return cfg


def is_norm_weight(name):
    return name.endswith("norm.weight")


# Weight scales (see init_fixture_weights). Plain 1/sqrt(fan_in) random
# weights give a nearly uniform attention and a residual stream dominated by
# the current token's embedding, so greedy decoding of a tiny random model
# (above all a tied one) just repeats one token, which would not exercise the
# KV cache. Sharper attention and stronger residual branches give varied
# continuations with clear top-2 margins.
GAIN_QK = 2.0     # query and key projections (or Qwen3's q_norm / k_norm)
GAIN_OUT = 8.0    # o_proj and down_proj
GAIN_HEAD = 2.0   # untied lm_head


@torch.no_grad()
def init_fixture_weights(model, seed):
    """Seeded weights, independent of transformers' own init. Every RMSNorm
    weight is 1 + 0.1 randn (never all ones; Qwen3's q_norm / k_norm are that
    times GAIN_QK), embeddings randn, every linear weight
    gain * randn / sqrt(in_features)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or \
        cfg.hidden_size // cfg.num_attention_heads
    qk_rows = (cfg.num_attention_heads + cfg.num_key_value_heads) * head_dim
    has_qk_norm = any(n.endswith("q_norm.weight") for n, _ in model.named_parameters())
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if is_norm_weight(name):
            w = 1.0 + 0.1 * r
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                w = w * GAIN_QK
            p.copy_(w)
        elif name.endswith("embed_tokens.weight"):
            p.copy_(r)
        elif p.dim() == 2:
            w = r / math.sqrt(p.shape[1])
            if name == "lm_head.weight":
                w = w * GAIN_HEAD
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                w = w * GAIN_OUT
            elif name.endswith(("q_proj.weight", "k_proj.weight")) and not has_qk_norm:
                w = w * GAIN_QK
            elif name.endswith("qkv_proj.weight"):
                w[:qk_rows] *= GAIN_QK          # query and key rows, not value
            p.copy_(w)
        else:
            sys.exit(f"unexpected parameter {name} {tuple(p.shape)}")


def load_fixture(path, dtype):
    kwargs = dict(attn_implementation="eager")
    kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.eval()
    assert next(model.parameters()).dtype == dtype
    return model


def top2_margin(row):
    t = torch.topk(row.to(torch.float32), 2).values
    return float(t[0] - t[1])


@torch.no_grad()
def greedy_uncached_margins(model, ids, n):
    ids = list(ids)
    new, margins = [], []
    for _ in range(n):
        row = full_logits(model, ids)[-1]
        nxt = int(torch.argmax(row).item())
        margins.append(top2_margin(row))
        ids.append(nxt)
        new.append(nxt)
    return new, margins


@torch.no_grad()
def greedy_generate_no_eos(model, ids, n):
    """generate() with EOS disabled, so it always runs all n steps."""
    inp = torch.tensor([ids], dtype=torch.long)
    # generate() fills unset fields from model.generation_config (which has
    # the EOS ids), so disable EOS there, not only in the config passed in.
    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    try:
        out = model.generate(inp, attention_mask=torch.ones_like(inp),
                             do_sample=False, num_beams=1, max_new_tokens=n,
                             eos_token_id=None, pad_token_id=0)
    finally:
        model.generation_config = saved
    new = [int(x) for x in out[0, len(ids):].tolist()]
    if len(new) != n:
        sys.exit(f"generate() made {len(new)} tokens, not {n}")
    return new


def rope_bands(inv_freq, rope):
    """Which llama3 band each frequency falls in (transformers' rule)."""
    old = rope["original_max_position_embeddings"]
    low_wl = old / rope["low_freq_factor"]
    high_wl = old / rope["high_freq_factor"]
    bands = []
    for f in inv_freq:
        wl = 2 * math.pi / f
        if wl < high_wl:
            bands.append("high")
        elif wl > low_wl:
            bands.append("low")
        else:
            bands.append("medium")
    return bands


def inv_freq_tables(cfg_dict):
    """llama3 and default inverse-frequency tables as transformers computes
    them for a Llama config dict (real spelling)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    d = {k: v for k, v in cfg_dict.items() if k not in ("torch_dtype",)}
    config = LlamaConfig(**d)
    rope = config.rope_parameters
    assert rope["rope_type"] == "llama3", rope
    inv, scaling = ROPE_INIT_FUNCTIONS["llama3"](config)
    module = LlamaRotaryEmbedding(config)
    if not torch.equal(inv, module.inv_freq):
        sys.exit("ROPE_INIT_FUNCTIONS['llama3'] and LlamaRotaryEmbedding.inv_freq differ")
    default, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    head_dim = getattr(config, "head_dim", None) or \
        config.hidden_size // config.num_attention_heads
    inv_l = [float(x) for x in inv.to(torch.float32).numpy()]
    def_l = [float(x) for x in default.to(torch.float32).numpy()]
    bands = rope_bands([float(x) for x in default.double()], rope)
    return {
        "head_dim": head_dim,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": {k: rope[k] for k in (
            "rope_type", "factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings")},
        "attention_scaling": float(scaling),
        "inv_freq": inv_l,
        "inv_freq_default": def_l,
        "bands": bands,
        "wavelength_default": [2 * math.pi / f for f in def_l],
    }


@torch.no_grad()
def sliding_window_keys(model, seq_len):
    """Empirically: how many keys (self included) does a query at position p
    attend to in layer 0? Perturb inputs_embeds at position j and see whether
    layer 0's output at p changes (hidden_states[1] is after layer 0 only)."""
    p = seq_len - 1
    gen = torch.Generator().manual_seed(1234)
    emb = torch.randn((1, seq_len, model.config.hidden_size), generator=gen)
    base = model(inputs_embeds=emb, use_cache=False,
                 output_hidden_states=True).hidden_states[1][0, p]
    seen = []
    for j in range(p + 1):
        e2 = emb.clone()
        e2[0, j] += 1.0
        h = model(inputs_embeds=e2, use_cache=False,
                  output_hidden_states=True).hidden_states[1][0, p]
        if not torch.equal(h, base):
            seen.append(j)
    # Must be a contiguous run ending at p.
    if seen != list(range(p + 1 - len(seen), p + 1)):
        sys.exit(f"unexpected attention pattern: {seen}")
    return len(seen)


def state_shapes(path):
    from safetensors import safe_open
    names = {}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    for fn in files:
        with safe_open(os.path.join(path, fn), "pt") as f:
            for k in f.keys():
                t = f.get_slice(k)
                names[k] = {"shape": list(t.get_shape()), "dtype": t.get_dtype(),
                            "file": fn}
    return names


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def write_fixture_config(path, cfg, gen):
    write_json(os.path.join(path, "config.json"), cfg)
    write_json(os.path.join(path, "generation_config.json"), gen)


def make_one_fixture(args, fx, src):
    name = fx["name"]
    root = os.path.join(args.out, "fixtures", name)
    if os.path.isdir(root):
        shutil.rmtree(root)
    os.makedirs(root)
    f32_dir = os.path.join(root, "f32")
    bf16_dir = os.path.join(root, "bf16")
    shard_dir = os.path.join(root, "f32_sharded") if "shard" in fx else None

    cfg_f32 = fixture_real_config(args.shared, fx, "float32")
    cfg_bf16 = fixture_real_config(args.shared, fx, "bfloat16")
    gen_cfg = dict(fx["generation"], do_sample=False,
                   transformers_version=transformers.__version__)

    # Build from the real-spelling config exactly as from_pretrained reads it.
    tmp_cfg_dir = os.path.join(root, "_cfg")
    os.makedirs(tmp_cfg_dir)
    write_json(os.path.join(tmp_cfg_dir, "config.json"), cfg_f32)
    config = AutoConfig.from_pretrained(tmp_cfg_dir)
    shutil.rmtree(tmp_cfg_dir)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    init_fixture_weights(model, fx["seed"])

    model.save_pretrained(f32_dir, safe_serialization=True)
    # Keep what transformers 5 writes, for information; then the real spelling.
    shutil.copyfile(os.path.join(f32_dir, "config.json"),
                    os.path.join(root, "config.transformers5.json"))
    write_fixture_config(f32_dir, cfg_f32, gen_cfg)
    if shard_dir:
        model.save_pretrained(shard_dir, safe_serialization=True,
                              max_shard_size=fx["shard"])
        write_fixture_config(shard_dir, cfg_f32, gen_cfg)
        if not os.path.exists(os.path.join(shard_dir, "model.safetensors.index.json")):
            sys.exit(f"{name}: sharded save made no index")
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    model_bf16.config.dtype = torch.bfloat16
    model_bf16.save_pretrained(bf16_dir, safe_serialization=True)
    write_fixture_config(bf16_dir, cfg_bf16, gen_cfg)
    del model, model_bf16

    # ---- load back and check ---------------------------------------------
    m32 = load_fixture(f32_dir, torch.float32)
    mbw = load_fixture(bf16_dir, torch.float32)      # bf16 weights, f32 math
    mbc = load_fixture(bf16_dir, torch.bfloat16)     # bf16 weights and math
    c = m32.config
    for k, want in fx["override"].items():
        got = getattr(c, k)
        if got != want:
            sys.exit(f"{name}: config {k} = {got!r}, wanted {want!r}")
    if c._attn_implementation != "eager":
        sys.exit(f"{name}: attention is {c._attn_implementation}")
    # The bf16 file holds exactly the f32 weights rounded to bf16.
    sd32, sdbw = m32.state_dict(), mbw.state_dict()
    for k, v in sd32.items():
        if not torch.equal(v.to(torch.bfloat16).to(torch.float32), sdbw[k]):
            sys.exit(f"{name}: bf16 {k} is not the rounded f32 weight")
        if is_norm_weight(k) and torch.all(v == 1):
            sys.exit(f"{name}: {k} is all ones")
    if shard_dir:
        msh = load_fixture(shard_dir, torch.float32)
        for k, v in msh.state_dict().items():
            if not torch.equal(v, sd32[k]):
                sys.exit(f"{name}: sharded {k} differs")

    gen = torch.Generator().manual_seed(fx["seed"] * 1000 + 7)
    prompt = [int(x) for x in torch.randint(
        0, c.vocab_size, (FIXTURE_PROMPT_LEN,), generator=gen)]

    lg32 = full_logits(m32, prompt)
    lgbw = full_logits(mbw, prompt)
    lgbc = full_logits(mbc, prompt)
    lgbg = full_logits_bf16_gemm_inputs(mbw, prompt)
    lgkv = full_logits_bf16_kv(m32, prompt)
    if float((lgkv - lg32).abs().max()) == 0.0:
        sys.exit(f"{name}: rounding the KV states to bf16 changed nothing (not hooked?)")
    kv_spread = max(float((full_logits_bf16_kv(m32, prompt, rel, seed) - lgkv).abs().max())
                    for seed, rel in ((1, 1e-6), (2, 1e-6), (3, 4e-6), (4, 4e-6)))
    spread = bf16_gemm_inputs_noise_spread(mbw, prompt, lgbg)
    if 2 * spread >= 0.5:
        sys.exit(f"{name}: bf16 noise spread {spread} too large for a CUDA "
                 "tolerance that catches a wrong half-logit")
    if shard_dir and not torch.equal(full_logits(msh, prompt), lg32):
        sys.exit(f"{name}: sharded checkpoint logits differ")

    gp = prompt[:FIXTURE_GREEDY_PROMPT]
    greedy = {"prompt_ids": gp, "new_tokens": FIXTURE_GREEDY_NEW}
    margins = {}
    for tag, m, kv in (("f32", m32, None), ("bf16_weights", mbw, None), ("bf16_kv", m32, "bf16")):
        with (bf16_kv_states(m) if kv else contextlib.nullcontext()):
            new = greedy_generate_no_eos(m, gp, FIXTURE_GREEDY_NEW)
            ref, marg = greedy_uncached_margins(m, gp, FIXTURE_GREEDY_NEW)
        if new != ref:
            sys.exit(f"{name} {tag}: generate() and uncached argmax disagree:"
                     f"\n  {new}\n  {ref}")
        greedy[f"output_ids_{tag}"] = new
        margins[tag] = min(marg)
    min_margin = min(margins.values())
    if min_margin <= FIXTURE_MIN_MARGIN:
        sys.exit(f"{name}: greedy top-2 margin {min_margin} too small")
    fwd_margin = min(top2_margin(r) for r in lg32)

    gold = {
        "source": src,
        "model_type": c.model_type,
        "architecture": c.architectures[0],
        "config": {
            "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_hidden_layers,
            "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", None)
            or c.hidden_size // c.num_attention_heads,
            "intermediate_size": c.intermediate_size,
            "vocab_size": c.vocab_size,
            "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": cfg_f32["rope_theta"],
            "rope_scaling": cfg_f32.get("rope_scaling"),
            "sliding_window": cfg_f32.get("sliding_window"),
            "tie_word_embeddings": c.tie_word_embeddings,
        },
        "prompt_ids": prompt,
    }
    if c.model_type in ("phi3", "mistral"):
        gold["sliding_window_keys_attended"] = sliding_window_keys(m32, FIXTURE_PROMPT_LEN)
    else:
        n = sliding_window_keys(m32, FIXTURE_PROMPT_LEN)
        if n != FIXTURE_PROMPT_LEN:
            sys.exit(f"{name}: full attention expected, saw {n} keys")
        gold["sliding_window_keys_attended"] = None
    gold.update({
        "greedy": greedy,
        "min_greedy_margin": min_margin,
        "min_greedy_margin_by_checkpoint": margins,
        "min_forward_top2_margin_f32": fwd_margin,
        "max_abs_diff_bf16_weights_vs_f32": float((lgbw - lg32).abs().max()),
        "max_abs_diff_bf16_compute_vs_f32": float((lgbc.float() - lg32).abs().max()),
        "max_abs_diff_bf16_gemm_inputs_vs_bf16_weights": float((lgbg - lgbw).abs().max()),
        "bf16_gemm_inputs_noise_spread": spread,
        "tolerance_cuda": 2 * spread,
        "max_abs_diff_bf16_kv_vs_f32": float((lgkv - lg32).abs().max()),
        "bf16_kv_noise_spread": kv_spread,
        "tolerance_bf16_kv": max(1e-4, 2 * kv_spread),
        "logits_f32": [[float(v) for v in r] for r in lg32.numpy()],
        "logits_bf16_weights": [[float(v) for v in r] for r in lgbw.numpy()],
        "logits_bf16_compute": [[float(v) for v in r] for r in lgbc.float().numpy()],
        "logits_bf16_gemm_inputs": [[float(v) for v in r] for r in lgbg.numpy()],
        "logits_bf16_kv": [[float(v) for v in r] for r in lgkv.numpy()],
    })
    write_json(os.path.join(root, "golden.json"), gold)

    shapes = state_shapes(f32_dir)
    print(f"== {name} ({c.architectures[0]})")
    for k, s in shapes.items():
        print(f"   {k} {s['shape']}")
    if c.tie_word_embeddings and "lm_head.weight" in shapes:
        sys.exit(f"{name}: tied model saved lm_head.weight")
    if not c.tie_word_embeddings and "lm_head.weight" not in shapes:
        sys.exit(f"{name}: untied model has no lm_head.weight")
    sizes = {d: dir_bytes(os.path.join(root, d))
             for d in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, d))}
    print(f"   sizes {sizes}; golden.json {os.path.getsize(os.path.join(root, 'golden.json'))} bytes")
    if shard_dir:
        print(f"   shards: {sorted(f for f in os.listdir(shard_dir) if 'safetensors' in f)}")
    print(f"   greedy f32 {greedy['output_ids_f32']}")
    print(f"   min greedy margin {margins}, forward top-2 margin {fwd_margin:.4g}, "
          f"sliding window keys {gold['sliding_window_keys_attended']}")
    print(f"   max |bf16_weights - f32| {gold['max_abs_diff_bf16_weights_vs_f32']:.3g}, "
          f"max |bf16_compute - f32| {gold['max_abs_diff_bf16_compute_vs_f32']:.3g}, "
          f"max |bf16_gemm_inputs - bf16_weights| "
          f"{gold['max_abs_diff_bf16_gemm_inputs_vs_bf16_weights']:.3g}, "
          f"CUDA tolerance {gold['tolerance_cuda']:.3g}, "
          f"max |bf16_kv - f32| {gold['max_abs_diff_bf16_kv_vs_f32']:.3g}, "
          f"bf16 KV tolerance {gold['tolerance_bf16_kv']:.3g}")
    return cfg_f32


def make_fixtures(args):
    v = versions()
    src = f"transformers {v['transformers']}, torch {v['torch']}"
    out = os.path.join(args.out, "fixtures")
    os.makedirs(out, exist_ok=True)
    cfgs = {}
    for fx in FIXTURES:
        cfgs[fx["name"]] = make_one_fixture(args, fx, src)

    real_path = os.path.join(args.shared, "models", "cards",
                             "llama-3.1-8b-instruct", "config.json")
    with open(real_path, encoding="utf-8") as f:
        real = json.load(f)
    table = {"source": src,
             "note": ("inv_freq: ROPE_INIT_FUNCTIONS['llama3'](config) (equal "
                      "to LlamaRotaryEmbedding(config).inv_freq), float32 "
                      "values written as exact doubles; inv_freq_default: "
                      "LlamaRotaryEmbedding.compute_default_rope_parameters; "
                      "bands: transformers' rule on the default wavelength "
                      "2*pi/f (high: < old/high_freq_factor, kept; low: > "
                      "old/low_freq_factor, divided by factor; else medium, "
                      "smoothed)."),
             "real": inv_freq_tables(real),
             "fixture": inv_freq_tables(cfgs["llama31"])}
    for k in ("real", "fixture"):
        b = table[k]["bands"]
        print(f"llama3 rope {k}: head_dim {table[k]['head_dim']}, bands "
              f"high {b.count('high')} medium {b.count('medium')} low {b.count('low')}")
        if k == "fixture":
            for f, wl, band, s in zip(table[k]["inv_freq_default"],
                                      table[k]["wavelength_default"], b,
                                      table[k]["inv_freq"]):
                print(f"   inv_freq {f:.6g} wavelength {wl:.6g} -> {band}: {s:.6g}")
    if set(table["fixture"]["bands"]) != {"high", "medium", "low"}:
        sys.exit("llama31 fixture does not exercise all three llama3 bands")
    p = os.path.join(out, "llama31_inv_freq.json")
    write_json(p, table)
    print(f"wrote {p} ({os.path.getsize(p)} bytes)")

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"),
                    help="the shared/ reference folder (default ../shared)")
    ap.add_argument("--out", default=os.path.join(root, "tests", "data"),
                    help="output folder (default tests/data)")
    ap.add_argument("--only", choices=["all", "stories", "fixtures"],
                    default="all",
                    help="make only the stories260k goldens or only the tiny "
                         "seed-model fixtures (default: all)")
    args = ap.parse_args()

    check_pins(here)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()

    if args.only in ("all", "stories"):
        make_stories(args)
    if args.only in ("all", "fixtures"):
        make_fixtures(args)


if __name__ == "__main__":
    main()
