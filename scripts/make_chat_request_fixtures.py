#!/usr/bin/env python3
"""Goldens for chat requests as transformers' apply_chat_template sees them.

Usage: /work/venv-fixtures/bin/python scripts/make_chat_request_fixtures.py [--shared ../shared]
       (versions pinned in scripts/requirements-fixtures.txt)

Writes tests/data/chat_templates/requests_transformers.jsonl: one line per request,
{"card": <model card dir name>, "request": {...}, "text": <rendered>} or
{"card", "request", "error": true}, rendered by transformers itself (AutoTokenizer on the
model card directory, apply_chat_template(tokenize=False)). These cover what
transformers does to messages before the template sees them: keys whose value is None
are dropped, reasoning given as "thinking"/"reasoning" is passed as "reasoning_content",
and an empty conversation is refused.
"""
import argparse
import json
import os

from transformers import AutoTokenizer

REQUESTS = {
    "llama-3.1-8b-instruct": [
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ans", "tool_calls": None}]},
        {"messages": [{"role": "system", "content": "s", "name": None}, {"role": "user", "content": "q"}],
         "add_generation_prompt": True},
        {"messages": []},
    ],
    "qwen3-4b": [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ans", "reasoning": "because"}]},
        {"messages": [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": "ans", "thinking": "t", "reasoning_content": None}]},
        {"messages": [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": "ans", "reasoning_content": "r", "thinking": "other"}]},
        {"messages": [{"role": "user", "content": "q", "tool_calls": None}], "add_generation_prompt": True,
         "enable_thinking": False},
        {"messages": []},
    ],
    "phi-3-mini-4k-instruct": [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]},
    ],
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat_templates"))
    a = p.parse_args()
    lines = []
    for card, requests in REQUESTS.items():
        tok = AutoTokenizer.from_pretrained(os.path.join(a.shared, "models", "cards", card))
        for req in requests:
            kwargs = {k: v for k, v in req.items() if k != "messages"}
            try:
                text = tok.apply_chat_template(req["messages"], tokenize=False, **kwargs)
                lines.append({"card": card, "request": req, "text": text})
            except Exception:  # the oracle refuses: linnet-tp must refuse too
                lines.append({"card": card, "request": req, "error": True})
    with open(os.path.join(a.out, "requests_transformers.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"{len(lines)} requests")


if __name__ == "__main__":
    main()
