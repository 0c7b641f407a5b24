#!/usr/bin/env python3
"""Writes the prompts of configs/matched.yaml (captured tiles and the model loop):
matched_long_fixture_ids.jsonl (the long-context fixture's tokens) and
matched_long_smollm2_ids.jsonl (SmolLM2-135M-Instruct's tokens).

Each holds 16 disjoint windows of 2176 token ids (the 128-token sink plus 16 complete 128-token
tiles of KVarN g128, so its fp16 tail is empty at the measured length) from the held-out text
`data/heldout/heldout.txt`, as already tokenized in `data/heldout/heldout_<model>_ids.jsonl`:
window i starts at token i * 15000 (the text holds 244,280 fixture / 230,854 SmolLM2 tokens, so
the windows spread over it and never overlap). Token ids need no tokenizer at run time.

Usage: python3 data/prompts/make_matched_prompts.py   (deterministic; only the standard library)
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WINDOWS, LENGTH, STRIDE = 16, 2176, 15000
MODELS = ("fixture", "smollm2")


def write_windows(model):
    source = os.path.join(ROOT, "data", "heldout", "heldout_%s_ids.jsonl" % model)
    out = os.path.join(HERE, "matched_long_%s_ids.jsonl" % model)
    with open(source, encoding="utf-8") as f:
        ids = json.loads(f.readline())["token_ids"]
    if (WINDOWS - 1) * STRIDE + LENGTH > len(ids):
        raise SystemExit(f"{source}: {len(ids)} tokens, too few for {WINDOWS} windows")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i in range(WINDOWS):
            row = {"id": "heldout-w%02d" % i, "token_ids": ids[i * STRIDE:i * STRIDE + LENGTH]}
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    os.replace(tmp, out)  # never a half-written file


def main():
    for model in MODELS:
        write_windows(model)


if __name__ == "__main__":
    main()
