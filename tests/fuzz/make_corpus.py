#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Small real inputs: the safetensors headers of tests/data/fixtures (tensor shapes shrunk
so each file is a few KB), the seed models' config.json / generation_config.json, the
stories260k and synthetic tokenizer.json files, the chat templates with their test
conversations, and request lines in the shapes the tests and README use.
Run from anywhere: python3 tests/fuzz/make_corpus.py [--shared ../shared]. Needs only
the standard library. The corpus is committed; rerun this only to change the seeds.
"""
import argparse
import hashlib
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
OUT = ROOT / "tests" / "fuzz" / "corpus"


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def safetensors_bytes(entries, metadata=None, pad=0):
    """entries: [(name, dtype, shape)] -> a valid file with deterministic data."""
    size = {"F32": 4, "F16": 2, "BF16": 2}
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in entries:
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 37 + 11) % 256 for i in range(n))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8 + pad)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    for fixture in sorted((DATA / "fixtures").glob("*/*/model.safetensors")):
        raw = fixture.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        meta = header.pop("__metadata__", None)
        entries = sorted((k, v["dtype"], [min(d, 3) for d in v["shape"]]) for k, v in header.items())
        put("safetensors", safetensors_bytes(entries[:12], meta))
    put("safetensors", safetensors_bytes([("scalar", "F32", []), ("empty", "BF16", [0, 4]), ("vec", "F16", [5])]))
    put("safetensors", safetensors_bytes([("a", "F32", [2, 3]), ("b", "BF16", [3, 2]), ("c", "F16", [1, 2, 2])],
                                         {"format": "pt", "note": "[[{\"x"}))
    put("safetensors", safetensors_bytes([]))


def config_seeds(shared):
    files = [shared / "models/stories260k/config.json", shared / "models/stories260k/generation_config.json"]
    for card in sorted((shared / "models/cards").glob("*")):
        files += [card / "config.json", card / "generation_config.json"]
    files += sorted((DATA / "fixtures").glob("*/config.transformers5.json"))
    files += sorted((DATA / "fixtures").glob("*/f32/config.json"))
    files += sorted((DATA / "fixtures").glob("*/f32/generation_config.json"))
    for f in files:
        if f.exists():
            put("config", f.read_bytes())


def tokenizer_seeds(shared):
    stories = shared / "models/stories260k"
    text = "Once upon a time, <s>Lily</s> saw a cat. 🙂\n"
    put("tokenizer_load", (stories / "tokenizer.json").read_bytes() + b"\0" +
        (stories / "tokenizer_config.json").read_bytes() + b"\0" + text.encode())
    put("tokenizer_load", (stories / "tokenizer.json").read_bytes())
    synthetic = json.loads((DATA / "tokenizers/synthetic.json").read_text())
    keep = {"metaspace_first", "metaspace_always_nosplit", "bytelevel_prefix_nfkc", "bytelevel_added_tokens",
            "split_removed_invert", "split_merged_with_next", "split_string_pattern"}
    for t in synthetic["tokenizers"]:
        if t["name"] not in keep:
            continue
        case = t["cases"][0]["text"] if t.get("cases") else "hello world"
        put("tokenizer_load", json.dumps(t["tokenizer"], ensure_ascii=False).encode() + b"\0\0" + case.encode())

    # tokenizer_codec: SELECT FLAGS PAYLOAD (see fuzz_tokenizer_codec.cpp); 7 tokenizers.
    texts = ["Once upon a time there was a little girl named Lily.", "  leading spaces\tand\ttabs\n\nnew lines",
             "naïve café — 日本語 한국어 🙂👍🏽", "<s>x</s><unk> <|begin_of_text|>hi<|eot_id|> <|im_start|>",
             "3.14159 1234567 don't I'LL we've", "\u00a0\u2003\u3000 nbsp and ideographic spaces"]
    inp = shared / "tokenizer-tests/llama-bpe.inp"
    if inp.exists():
        texts += [t for t in inp.read_text().split("\n__ggml_vocab_test__\n") if 0 < len(t) < 200][:8]
    for sel in range(7):
        for i, t in enumerate(texts):
            put("tokenizer_codec", bytes([sel, (i % 4) << 3 | (i & 3)]) + t.encode())
        ids = b"".join(struct.pack("<I", v)[:3] for v in [1, 300, 3, 4, 5, 260, 261, 262, 263, 2, 10, 11])
        put("tokenizer_codec", bytes([sel, 4 | 8]) + ids)
        put("tokenizer_codec", bytes([sel, 4 | 2 | 16 | 0xE0]) + ids[:12])
    # Inputs the target found (each a quadratic stream, fixed): a byte-level token ending
    # inside the character the next one finishes, repeated; a run of Metaspace "▁".
    put("tokenizer_codec", bytes.fromhex("5defea003b09"))
    put("tokenizer_codec", bytes.fromhex("01e401e4000000"))


def chat_seeds():
    d = DATA / "chat_templates"
    for jinja in sorted(d.glob("*.jinja")):
        source = jinja.read_bytes()
        put("chat_template", source)
        cases = d / (jinja.stem + ".jsonl")
        if cases.exists():
            for line in cases.read_text().splitlines()[:3]:
                put("chat_template", source + b"\0" + json.dumps(json.loads(line)["variables"]).encode())
    for line in (d / "snippets.jsonl").read_text().splitlines():
        s = json.loads(line)
        put("chat_template", s["template"].encode() + b"\0" + json.dumps(s["variables"]).encode())


def request_seeds():
    lines = [
        {"prompt": "Once upon a time"},
        {"prompt": "Lily and Ben", "temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7,
         "max_new_tokens": 32, "stop": ["\n", "The end"], "stop_token_ids": [2, 13], "logprobs": True,
         "top_logprobs": 5},
        {"prompt": "x", "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
         "stop": "the", "logprobs": False},
        {"prompt": "<s>a</s> b", "max_new_tokens": 0, "temperature": 0, "top_k": None},
        {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello.", "reasoning_content": "think"},
                      {"role": "user", "content": "Bye"}], "enable_thinking": False, "temperature": 0.5},
        {"text": "Once upon a time, there was a cat."},
        {"ids": [1, 400, 20, 30, 2]},
        {"ids": [1, 400, 20, 30], "labels": [-100, 400, -100, 30]},
    ]
    for l in lines:
        put("request_line", json.dumps(l, ensure_ascii=False))
    put("request_line", "\n".join(json.dumps(l) for l in lines[:3]) + "\n")
    for line in (DATA / "chat_templates/requests_transformers.jsonl").read_text().splitlines()[:6]:
        put("request_line", json.dumps(json.loads(line)["request"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    shared = pathlib.Path(ap.parse_args().shared)
    if OUT.exists():
        shutil.rmtree(OUT)
    safetensors_seeds()
    config_seeds(shared)
    tokenizer_seeds(shared)
    chat_seeds()
    request_seeds()
    for d in sorted(OUT.iterdir()):
        files = list(d.iterdir())
        print(f"{d.name}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
