#!/usr/bin/env python3
"""Make tokenizer goldens for the seed models with the Hugging Face `tokenizers` package.

Requirements: the versions pinned in scripts/requirements-fixtures.txt (only
`tokenizers` is used here). Install them once into a virtual environment outside
the repository:

    python3 -m venv /work/venv-fixtures
    /work/venv-fixtures/bin/pip install -r scripts/requirements-fixtures.txt

Usage (from the repository root):

    /work/venv-fixtures/bin/python scripts/make_tokenizer_fixtures.py [--shared ../shared] [--out tests/data]

A developer tool only: the C++ tests read what it writes and never run Python, and
the expected ids come from `tokenizers` (Tokenizer.from_file on the model card's
tokenizer.json), never from linnet code. Deterministic: the same pinned version gives
the same bytes.

Outputs <out>/tokenizers/<name>.json for llama-3.1, qwen3 and phi-3, and
<out>/tokenizers/synthetic.json (see synthetic()):

  {"source", "model_dir" (relative to shared/), "with_special",
   "cases": [{"text", "ids", "ids_with_special" (only when with_special),
              "decoded", "decoded_skip_special"}],
   "decode_cases": [{"ids", "decoded", "decoded_skip_special"}]}

  ids: encode(text, add_special_tokens=False); ids_with_special: the same with
  add_special_tokens=True. with_special is false for Phi-3, whose
  tokenizer_config.json (add_bos_token) changes the template that tokenizer.json
  alone gives, so `tokenizers` by itself is not the oracle there. decoded /
  decoded_skip_special: decode(ids, skip_special_tokens=False / True).
  decode_cases: decode of seeded random id sequences (incl. runs of byte tokens
  that split or break UTF-8 characters), to check lossy decoding.
"""
import argparse
import json
import os
import random

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, \
    pre_tokenizers, trainers

MODELS = [
    # name, model card dir, with_special
    ("llama-3.1", "models/cards/llama-3.1-8b-instruct", True),
    ("qwen3", "models/cards/qwen3-4b", True),
    ("phi-3", "models/cards/phi-3-mini-4k-instruct", False),
]

COMMON_TEXTS = [
    "",
    "Hello world",
    # contractions in mixed case
    "I'M sure you'RE right; they'Ve said it's fine and HE'LL come. DON'T, won't, y'all'd've",
    "'s 'S 'T 're 'Re 'VE 'm 'LL 'd 'D",
    "The cat's toys. THE CAT'S TOYS. ſ'S K'Ll",
    # digit runs
    "1 12 123 1234 12345 123456 1234567 1234567890",
    "3.14159 2024-07-23 1,000,000 0x1F 007 v1.2.3 x²³ ½ ٣٤٥ ０１２３",
    # whitespace runs with newlines and tabs
    "a  b   c    d\t\te\n\nf \n g\t\n\th",
    "   leading and trailing   ",
    "line1\r\nline2\r\n\r\n  \n\n\n\tindented\n",
    "\n",
    " ",
    "\t \t",
    "word\u00a0nbsp\u2003em\u3000ideographic\u0085nel\u2028ls\u180emvs",
    # CJK
    "你好，世界！这是一个测试。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다. 中文和English混合text。",
    # emoji with ZWJ and modifiers
    "family 👨\u200d👩\u200d👧\u200d👦 flag 🏳️\u200d🌈 thumbs 👍🏽 heart ❤️ 🇩🇪",
    "🤗🤗🤗 x🤗y",
    # combining marks vs precomposed (NFC)
    "e\u0301 vs \u00e9; A\u030a vs \u00c5; \u2126 ohm; \u1112\u1161\u11ab vs \ud55c",
    "cafe\u0301 caf\u00e9 n\u0303 \u00f1 \u0041\u0308\u0304",
    # leading spaces, SentencePiece style
    " Hello",
    "  Hello",
    "   Hello world  ",
    "\tHello",
    "\nHello",
    # code
    "def f(x):\n    return x ** 2  # square\n\n\tif (a != b) { y = [1, 2, 3]; }\n",
    "for (int i = 0; i < n; ++i) {\n  s += a[i] * 0.5f;\n}\n// done",
    "<div class=\"a\">&amp; &lt;tag&gt;</div>",
    "https://example.com/path?q=1&r=two#frag user@mail.org",
    # a word over 256 bytes (past the BPE cache's word limit)
    "Supercalifragilistic" * 15,
    "\u00e9" * 200,
    # odd characters
    "\u200b\u200c\u200d\ufeff zero-width \ufffd replacement",
    "Ünïcödé ÀÉÎÕÜ ÆØÅ ß ﬁ ﬂ ℌ ℍ",
]

SPECIAL_TEXTS = {
    "llama-3.1": [
        "<|begin_of_text|>Hello<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "text <|eot_id|> more <|reserved_special_token_5|>end",
        "<|begin_of_text|><|begin_of_text|>",
        "<|eot_id |> not special <|eot_id",
    ],
    "qwen3": [
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<think>\nreasoning\n</think>\n\nanswer",
        "<|im_start|>system\nYou are helpful.<|im_end|>",
        "a<|endoftext|>b <tool_call>{\"x\": 1}</tool_call>",
        "<|im_start |> not special",
    ],
    "phi-3": [
        "<|user|>\nHello<|end|>\n<|assistant|>\nHi!<|end|>",
        "<|end|>   next",
        "<|end|>\n\nHello",
        "<|assistant|>x",
        "<s>text</s> more",
        "<|system|> You are helpful.<|end|> <|user|>  two spaces",
        "a<|endoftext|>b",
        "<unk> <|placeholder1|>\t\tq",
    ],
}

# Partial byte sequences of characters: ids of single bytes under each scheme are
# looked up by token string below.
BYTE_SPLIT_TEXTS = ["é", "中", "🤗", "ä中🤗"]


def byte_ids(tok, name, data):
    """Ids of single-byte tokens spelling `data` (byte-level or <0xXX> fallback)."""
    out = []
    for b in data:
        if name == "phi-3":
            out.append(tok.token_to_id("<0x%02X>" % b))
        else:
            out.append(tok.token_to_id(BYTE_CHARS[b]))
    return out


def bytes_to_unicode():
    # GPT-2's byte-level alphabet, as tokenizers defines it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHARS = bytes_to_unicode()


def decode_cases(tok, name, rng):
    cases = []
    vocab = tok.get_vocab_size(with_added_tokens=True)
    for text in BYTE_SPLIT_TEXTS:
        data = text.encode("utf-8")
        ids = byte_ids(tok, name, data)
        cases.append(ids)
        cases.append(ids[:-1])                      # an unfinished character
        cases.append(ids[:1] + tok.encode(" ok", add_special_tokens=False).ids)
    for _ in range(40):
        n = rng.randint(1, 24)
        cases.append([rng.randrange(vocab) for _ in range(n)])
    out = []
    for ids in cases:
        out.append({
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    return out


SYNTH_CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello world, hello there! 123 4567 fi \ufb01 fix",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u2014 d\u00e9j\u00e0 vu",
    "def f(x):\n    return x + 1\n",
    "\u65e5\u672c\u8a9e \u4e2d\u6587 \ud55c\uad6d\uc5b4",
] * 5

SYNTH_TEXTS = [
    "",
    "Hello world",
    " Hello  world ",
    "the  lazy dog, 123 jumps!! 4567 fox",
    "foo   bar\tbaz\n\nqux",
    "caf\u00e9 cafe\u0301 \ufb01x fix \u2460",
    "unknown \u00fc \U0001F917",
    "a<s>b <s> c <mask>  d x<mask>y",
]


def synthetic():
    """Small trained BPE tokenizers exercising components the seed models do not use:
    Metaspace (first / always, split or not) with its decoder, ByteLevel with
    add_prefix_space and use_regex, every Split behavior (and invert), NFKC, and added
    tokens with lstrip / single_word / normalized."""
    out = []

    def record(name, tok):
        cases = []
        for text in SYNTH_TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False)})
        out.append({"name": name, "tokenizer": json.loads(tok.to_str()), "cases": cases})

    for scheme, split in [("first", True), ("always", False), ("never", True)]:
        t = Tokenizer(models.BPE(unk_token="<unk>"))
        t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
        t.decoder = decoders.Metaspace(prepend_scheme=scheme, split=split)
        t.train_from_iterator(SYNTH_CORPUS, trainers.BpeTrainer(
            vocab_size=200, special_tokens=["<unk>", "<s>"], show_progress=False))
        record("metaspace_%s%s" % (scheme, "" if split else "_nosplit"), t)

    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFKC()
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(SYNTH_CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    record("bytelevel_prefix_nfkc", t)
    t.add_tokens([AddedToken("<mask>", lstrip=True, single_word=True, normalized=False),
                  AddedToken("\ufb01", normalized=True)])
    record("bytelevel_added_tokens", t)

    for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for invert in [False, True]:
            t.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"\s+|\d|[,!]+"), behavior, invert=invert),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            record("split_%s%s" % (behavior, "_invert" if invert else ""), t)
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", "merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    record("split_string_pattern", t)
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "shared"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data"))
    args = ap.parse_args()
    out_dir = os.path.join(args.out, "tokenizers")
    os.makedirs(out_dir, exist_ok=True)
    for name, model_dir, with_special in MODELS:
        tok = Tokenizer.from_file(os.path.join(args.shared, model_dir, "tokenizer.json"))
        cases = []
        for text in COMMON_TEXTS + SPECIAL_TEXTS[name]:
            ids = tok.encode(text, add_special_tokens=False).ids
            case = {"text": text, "ids": ids}
            if with_special:
                case["ids_with_special"] = tok.encode(text, add_special_tokens=True).ids
            case["decoded"] = tok.decode(ids, skip_special_tokens=False)
            case["decoded_skip_special"] = tok.decode(ids, skip_special_tokens=True)
            cases.append(case)
        doc = {
            "source": "huggingface tokenizers %s, Tokenizer.from_file; scripts/make_tokenizer_fixtures.py"
                      % tokenizers.__version__,
            "model_dir": model_dir,
            "with_special": with_special,
            "cases": cases,
            "decode_cases": decode_cases(tok, name, random.Random(1234)),
        }
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("wrote", path, len(cases), "cases")
    doc = {
        "source": "huggingface tokenizers %s; scripts/make_tokenizer_fixtures.py" % tokenizers.__version__,
        "note": "encode(text, add_special_tokens=False), decode(ids, skip_special_tokens=False)",
        "tokenizers": synthetic(),
    }
    path = os.path.join(out_dir, "synthetic.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, len(doc["tokenizers"]), "tokenizers")


if __name__ == "__main__":
    main()
