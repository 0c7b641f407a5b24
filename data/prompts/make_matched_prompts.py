#!/usr/bin/env python3
"""Writes matched_long_fixture_ids.jsonl: the prompts of configs/matched.yaml (captured tiles and
the model loop).

16 disjoint windows of 2176 fixture token ids (the 128-token sink plus 16 complete 128-token
tiles of KVarN g128, so its fp16 tail is empty at the measured length) from the held-out text
`data/heldout/heldout.txt`, as already tokenized in `data/heldout/heldout_fixture_ids.jsonl`:
window i starts at token i * 15000 (the text holds 244,280 tokens, so the windows spread over it
and never overlap). Token ids need no tokenizer at run time.

Usage: python3 data/prompts/make_matched_prompts.py   (deterministic; only the standard library)
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOURCE = os.path.join(ROOT, "data", "heldout", "heldout_fixture_ids.jsonl")
OUT = os.path.join(HERE, "matched_long_fixture_ids.jsonl")
WINDOWS, LENGTH, STRIDE = 16, 2176, 15000


def main():
    with open(SOURCE, encoding="utf-8") as f:
        ids = json.loads(f.readline())["token_ids"]
    if (WINDOWS - 1) * STRIDE + LENGTH > len(ids):
        raise SystemExit(f"{SOURCE}: {len(ids)} tokens, too few for {WINDOWS} windows")
    tmp = OUT + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(WINDOWS):
            row = {"id": "heldout-w%02d" % i, "token_ids": ids[i * STRIDE:i * STRIDE + LENGTH]}
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    os.replace(tmp, OUT)  # never a half-written file


if __name__ == "__main__":
    main()
