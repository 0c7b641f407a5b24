#!/usr/bin/env python3
"""Writes the long-context prompt sets of the error-accumulation runs (docs/FINDINGS.md, finding 4).

  long_context.jsonl              text: every prompt of heldout, mixed and aime_style joined by a
                                  blank line, in four rotations (different openings); ~2.7K
                                  SmolLM2 / ~3.0K fixture tokens each
  long_context_fixture_ids.jsonl  the same prompts as fixture-qwen3-h128 token ids (its
                                  tokenizer.json, no special tokens, as `Runner::encode`), cut to
                                  the model's 1024-token context: for builds without a tokenizer
                                  (the GPU image lacks PCRE2)

Usage: python3 data/prompts/make_long_prompts.py   (needs the `tokenizers` package; deterministic)
"""

import json
import os

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOURCES = ["heldout.jsonl", "mixed.jsonl", "aime_style.jsonl"]
ROTATIONS = [0, 2, 8, 15]  # index of the first text: story, mixed prompts, later mixed, math
FIXTURE = os.path.join(ROOT, "data", "models", "fixture-qwen3-h128")
MAX_IDS = 1024  # the fixture's max_position_embeddings


def texts():
    out = []
    for name in SOURCES:
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            out += [json.loads(line)["text"] for line in f if line.strip()]
    return out


def write_jsonl(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # never a half-written file


def main():
    t = texts()
    prompts = [("long-concat-%d" % i, "\n\n".join(t[r:] + t[:r])) for i, r in enumerate(ROTATIONS)]
    write_jsonl(os.path.join(HERE, "long_context.jsonl"), [{"id": i, "text": s} for i, s in prompts])
    tok = Tokenizer.from_file(os.path.join(FIXTURE, "tokenizer.json"))
    write_jsonl(os.path.join(HERE, "long_context_fixture_ids.jsonl"),
                [{"id": i, "token_ids": tok.encode(s, add_special_tokens=False).ids[:MAX_IDS]}
                 for i, s in prompts])


if __name__ == "__main__":
    main()
