#!/usr/bin/env python3
"""Make causal-LM loss (negative log-likelihood) goldens for linnet-tp.

Requirements: the versions pinned in scripts/requirements-fixtures.txt, in a
virtual environment outside the repository (see scripts/make_fixtures.py).

Usage (from the repository root):

    /work/venv-fixtures/bin/python scripts/make_loss_fixtures.py [--shared ../shared] [--out tests/data/loss]

Developer tool only: the C++ tests read the files it writes and never run
Python. Everything runs on the CPU in float32 under torch.no_grad(), with
eager attention, one thread, deterministic algorithms and fixed seeds.

Semantics (exactly transformers' causal-LM loss): a document has ids
x[0..n-1] and labels y (default y = x). The model runs on x alone (batch 1,
no padding, no attention mask, positions 0..n-1). Position t predicts y[t+1]
for t = 0..n-2; positions whose target y[t+1] == -100 are ignored (y[0] is
never a target). With lp[t] = log_softmax(logits[t])[y[t+1]], computed in
float64 from the float32 logits:

    nll_sum  = -sum(lp[t] over scored t)
    tokens   = number of scored t
    mean_nll = nll_sum / tokens

mean_nll is asserted equal (1e-6 relative) to model(ids, labels=y).loss.

Outputs (in <out>, default tests/data/loss):

  stories260k.json, llama31.json, qwen3.json, phi3.json, mistral.json
      {"source", "model_dir", "documents": [{"text" (stories260k only), "ids",
       "labels" (only where it differs from ids), "nll_sum", "tokens",
       "mean_nll", "target_log_probs" (n-1 entries: lp[t], null where
       ignored)}]}
      stories260k: tokenizer.json encodings (tokenizers.Tokenizer.from_file,
      BOS id 1 added by its post-processor) of STORY_TEXTS; the last document
      copies ids into labels with -100 at LABEL_MASK_STORIES (position 1 is
      the first real target).
      Fixtures (tests/data/fixtures/<name>/f32): seeded random ids in
      [0, vocab_size) of lengths FIXTURE_LENGTHS, plus one document with
      labels -100 at FIXTURE_MASK (including position 0, never a target, and
      position 1, the first target).

  stories260k_chunks.json
      {"source", "model_dir", "text", "ids", "max_chunk", "chunks": [{"start",
       "end" (exclusive), "nll_sum", "tokens", "mean_nll",
       "target_log_probs"}], "nll_sum", "tokens", "mean_nll",
       "unchunked": {"nll_sum", "tokens", "mean_nll"}}
      One long document (CHUNK_TEXTS joined by spaces, encoded with BOS)
      scored in consecutive chunks ids[start:end] of at most max_chunk ids;
      each chunk runs ALONE as its own sequence (positions restart at 0, its
      first id gets no prediction, so the target ids[start] is never scored
      for start > 0). Totals: nll_sum and tokens summed over chunks,
      mean_nll = nll_sum / tokens. "unchunked" scores the whole document in
      one pass, for information.

Floats are written with Python's shortest round-trip repr of the double.
"""

import argparse
import json
import math
import os
import sys

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

IGNORE = -100
SEED = 0

STORY_PARAGRAPH = (
    "Once upon a time, in a small house near the woods, there lived a little "
    "boy named Tim. Tim loved to play with his red truck every day. One "
    "morning, he went outside and saw a big, brown dog sitting under the old "
    "tree. The dog looked sad and hungry. Tim ran back inside and asked his "
    "mom for some bread."
)

# (name, text); the 2-token text is checked below.
STORY_TEXTS = [
    ("once_upon", "Once upon a time, there was a little girl named Lily."),
    ("paragraph", STORY_PARAGRAPH),
    ("cat_sat", "The cat sat."),
    ("park", "Tom and Sue went to the park to play with a big red ball. "
             "They had fun."),
    ("two_tokens", "The"),
    ("masked", "Lily saw a bird in the sky. She wanted to fly too, so she "
               "jumped up and down."),
]
LABEL_MASK_STORIES = [1, 9, -1]  # positions set to -100 in "masked" labels

FIXTURES = ["llama31", "qwen3", "phi3", "mistral"]
FIXTURE_LENGTHS = [2, 7, 20, 33, 60]
FIXTURE_MASKED_LEN = 24
FIXTURE_MASK = [0, 1, 2, 10, 11, 17, 23]

CHUNK_TEXTS = [
    STORY_PARAGRAPH,
    "One day, a little girl named Sue found a shiny stone in the garden. "
    "She showed it to her dad. He said it was very pretty. Sue put the stone "
    "in a box and kept it safe under her bed.",
    "Ben and Mia liked to build castles in the sand. The sun was warm and "
    "the sea was blue. A big wave came and took their castle away. They "
    "laughed and built a new one.",
]
MAX_CHUNK = 128


def source_string():
    return f"transformers {transformers.__version__}, torch {torch.__version__}"


def load(path):
    model = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    assert next(model.parameters()).dtype == torch.float32
    assert model.config._attn_implementation == "eager"
    return model


@torch.no_grad()
def score(model, ids, labels=None):
    """Score one document run alone; returns the JSON fields."""
    n = len(ids)
    assert n >= 2, n
    lab = list(ids) if labels is None else list(labels)
    assert len(lab) == n
    inp = torch.tensor([ids], dtype=torch.long)
    logits = model(inp, use_cache=False).logits[0]
    assert logits.dtype == torch.float32
    assert logits.shape == (n, model.config.vocab_size), logits.shape
    lsm = torch.log_softmax(logits.to(torch.float64), dim=-1)
    lps, nll, tokens = [], 0.0, 0
    for t in range(n - 1):
        y = lab[t + 1]
        if y == IGNORE:
            lps.append(None)
            continue
        lp = float(lsm[t, y].item())
        lps.append(lp)
        nll -= lp
        tokens += 1
    assert tokens > 0
    mean = nll / tokens
    # Cross-check against transformers' own loss.
    ref = model(inp, labels=torch.tensor([lab], dtype=torch.long),
                use_cache=False).loss
    ref = float(ref.item())
    rel = abs(ref - mean) / abs(mean)
    if not rel <= 1e-6:
        sys.exit(f"loss mismatch: mine {mean!r} transformers {ref!r} rel {rel}")
    score.max_rel = max(score.max_rel, rel)
    score.checked += 1
    return {"nll_sum": nll, "tokens": tokens, "mean_nll": mean,
            "target_log_probs": lps}


score.max_rel = 0.0
score.checked = 0


def doc_entry(ids, labels, scored, text=None):
    d = {}
    if text is not None:
        d["text"] = text
    d["ids"] = list(ids)
    if labels is not None:
        d["labels"] = list(labels)
    d.update(scored)
    return d


def dumps(obj, indent=0):
    """Indented JSON with every list of scalars on one line."""
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: "
                 f"{dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        items = [inner + dumps(x, indent + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(obj) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def make_stories(args, src):
    model_dir = os.path.join(args.shared, "models", "stories260k")
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    model = load(model_dir)
    label = "shared/models/stories260k"

    docs = []
    for name, text in STORY_TEXTS:
        ids = tok.encode(text).ids
        assert ids[0] == 1, ids
        if name == "two_tokens":
            assert len(ids) == 2, ids
        labels = None
        if name == "masked":
            labels = list(ids)
            for p in LABEL_MASK_STORIES:
                labels[p] = IGNORE
        d = doc_entry(ids, labels, score(model, ids, labels), text=text)
        print(f"  stories260k {name}: n={len(ids)} tokens={d['tokens']} "
              f"mean_nll={d['mean_nll']:.6f}")
        docs.append(d)
    write_json(os.path.join(args.out, "stories260k.json"),
               {"source": src, "model_dir": label, "documents": docs})

    # Chunked long document.
    text = " ".join(CHUNK_TEXTS)
    ids = tok.encode(text).ids
    assert ids[0] == 1 and 280 <= len(ids) <= 400, len(ids)
    n = len(ids)
    chunks = []
    for start in range(0, n, MAX_CHUNK):
        end = min(start + MAX_CHUNK, n)
        assert end - start >= 2, (start, end)
        s = score(model, ids[start:end])
        chunks.append({"start": start, "end": end, **s})
    total_nll = sum(c["nll_sum"] for c in chunks)
    total_tok = sum(c["tokens"] for c in chunks)
    assert total_tok == n - len(chunks)
    full = score(model, ids)
    del full["target_log_probs"]
    obj = {"source": src, "model_dir": label, "text": text, "ids": ids,
           "max_chunk": MAX_CHUNK, "chunks": chunks,
           "nll_sum": total_nll, "tokens": total_tok,
           "mean_nll": total_nll / total_tok, "unchunked": full}
    print(f"  chunks: n={n} bounds={[(c['start'], c['end']) for c in chunks]} "
          f"mean={total_nll / total_tok:.6f} unchunked={full['mean_nll']:.6f}")
    write_json(os.path.join(args.out, "stories260k_chunks.json"), obj)


def make_fixture(args, name, idx, src):
    rel = os.path.join("tests", "data", "fixtures", name, "f32")
    model = load(os.path.join(args.root, rel))
    cfg = model.config
    vocab, maxpos = cfg.vocab_size, cfg.max_position_embeddings
    gen = torch.Generator().manual_seed(SEED * 1000 + 100 + idx)
    docs = []
    for n in FIXTURE_LENGTHS + [FIXTURE_MASKED_LEN]:
        assert n <= maxpos
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        labels = None
        if len(docs) == len(FIXTURE_LENGTHS):
            labels = list(ids)
            for p in FIXTURE_MASK:
                labels[p] = IGNORE
        d = doc_entry(ids, labels, score(model, ids, labels))
        print(f"  {name}: n={n} tokens={d['tokens']} "
              f"mean_nll={d['mean_nll']:.6f}")
        docs.append(d)
    write_json(os.path.join(args.out, f"{name}.json"),
               {"source": src, "model_dir": rel.replace(os.sep, "/"),
                "documents": docs})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "loss"))
    args = ap.parse_args()
    args.root = root

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    transformers.utils.logging.disable_progress_bar()
    os.makedirs(args.out, exist_ok=True)
    src = source_string()

    make_stories(args, src)
    for i, name in enumerate(FIXTURES):
        make_fixture(args, name, i, src)
    print(f"loss check: {score.checked} scorings matched transformers' loss, "
          f"max relative difference {score.max_rel:.3g}")


if __name__ == "__main__":
    main()
