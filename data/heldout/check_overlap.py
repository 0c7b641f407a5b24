#!/usr/bin/env python3
"""Measures how much of data/heldout/heldout.txt also occurs in the fixture's training text.

  bash tools/fixture/build_corpus.sh     # or its steps 1-2: data/cache/fixture-corpus/train.txt
  python3 data/heldout/check_overlap.py [--train data/cache/fixture-corpus/train.txt] [--json OUT]

Two measures, both exact (64-bit polynomial hashes of every window, then set membership):
  chars   every 50-character window of each held-out document, whitespace runs collapsed to
          one space on both sides; reported: share of windows found in train.txt, per part, and
          share of held-out characters covered by at least one found window;
  tokens  every 13-token window of the held-out token ids (fixture tokenizer) against every
          13-token window of train.txt's ids (each document followed by <|endoftext|>, as the
          training pack; cached in data/cache/fixture-train-ids.npy).
Prints the most frequent matched windows so that a reader can judge what they are.
"""
import argparse
import collections
import json
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "fixture"))
HEADER = re.compile(r"^=== (prose|code|math): (.*) ===$", re.M)
CHAR_N = 50
TOKEN_N = 13
PRIME = np.uint64(1099511628211)


def window_hashes(a, n):
    """Hash of every length-n window of the integer array a (uint64 arithmetic wraps mod 2^64)."""
    a = a.astype(np.uint64)
    m = a.size - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    h = np.zeros(m, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * PRIME + a[j:j + m] + np.uint64(1)
    return h


def found_in(arr, n, wanted, chunk=1 << 24):
    """The hashes of `wanted` that are also window hashes of the long array (chunked: bounded memory)."""
    wanted = np.unique(wanted)
    out = [np.zeros(0, np.uint64)]
    for s in range(0, max(1, arr.size - n + 1), chunk):
        out.append(np.intersect1d(window_hashes(arr[s:s + chunk + n - 1], n), wanted))
    return np.unique(np.concatenate(out))


def norm(s):
    return re.sub(r"\s+", " ", s)


def heldout_docs(text):
    heads = list(HEADER.finditer(text))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        yield m.group(1), m.group(2), text[m.end():end]


def char_overlap(held_text, train_path):
    with open(train_path, encoding="utf-8") as f:
        train = np.frombuffer(norm(f.read()).encode("utf-8"), np.uint8)
    docs = [(part, np.frombuffer(norm(body).encode("utf-8"), np.uint8))
            for part, _, body in heldout_docs(held_text)]
    th = found_in(train, CHAR_N, np.concatenate([window_hashes(b, CHAR_N) for _, b in docs]))
    del train
    parts = collections.defaultdict(lambda: [0, 0, 0, 0])  # windows, found, chars, covered
    found_text = collections.Counter()
    for part, b in docs:
        h = window_hashes(b, CHAR_N)
        hit = np.isin(h, th)
        cov = np.zeros(b.size, bool)
        for i in np.flatnonzero(hit):
            cov[i:i + CHAR_N] = True
            found_text[bytes(b[i:i + CHAR_N]).decode("utf-8", "replace")] += 1
        p = parts[part]
        p[0] += h.size
        p[1] += int(hit.sum())
        p[2] += b.size
        p[3] += int(cov.sum())
    tot = [sum(p[i] for p in parts.values()) for i in range(4)]
    res = {"window_chars": CHAR_N, "windows": tot[0], "found": tot[1], "rate": tot[1] / max(1, tot[0]),
           "bytes": tot[2], "covered_bytes": tot[3], "covered_rate": tot[3] / max(1, tot[2]),
           "per_part": {k: {"windows": v[0], "found": v[1], "rate": v[1] / max(1, v[0]),
                            "covered_rate": v[3] / max(1, v[2])} for k, v in sorted(parts.items())},
           "top_found": found_text.most_common(12),
           "top_found_with_letters": [(t, n) for t, n in found_text.most_common()
                                      if any(ch.isalpha() for ch in t)][:30]}
    return res


def train_ids(train_path, cache):
    if os.path.exists(cache) and os.path.getmtime(cache) > os.path.getmtime(train_path):
        return np.load(cache)
    from tokenizers import Tokenizer
    from pack_corpus import tokenize_text
    tok = Tokenizer.from_file(os.path.join(ROOT, "data", "models", "fixture-qwen3-h128", "tokenizer.json"))
    with open(train_path, encoding="utf-8") as f:
        ids, _ = tokenize_text(f.read(), tok)
    np.save(cache + ".tmp.npy", ids)
    os.replace(cache + ".tmp.npy", cache)
    return ids


def token_overlap(ids_path, train_path, cache):
    with open(ids_path) as f:
        held = np.asarray(json.loads(f.readline())["token_ids"], np.int64)
    tr = train_ids(train_path, cache)
    h = window_hashes(held, TOKEN_N)
    th = found_in(tr, TOKEN_N, h)
    hit = np.isin(h, th)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(ROOT, "data", "models", "fixture-qwen3-h128", "tokenizer.json"))
    grams = collections.Counter(tok.decode(held[i:i + TOKEN_N].tolist()) for i in np.flatnonzero(hit))
    return {"window_tokens": TOKEN_N, "windows": int(h.size), "found": int(hit.sum()),
            "rate": float(hit.mean()), "train_tokens": int(tr.size),
            "distinct_found": len(grams), "top_found": grams.most_common(30)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", default=os.path.join(ROOT, "data", "cache", "fixture-corpus", "train.txt"))
    ap.add_argument("--heldout", default=os.path.join(HERE, "heldout.txt"))
    ap.add_argument("--ids", default=os.path.join(HERE, "heldout_fixture_ids.jsonl"))
    ap.add_argument("--ids-cache", default=os.path.join(ROOT, "data", "cache", "fixture-train-ids.npy"))
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args()
    if not os.path.exists(a.train):
        sys.exit("check_overlap: %s is missing; run tools/fixture/build_corpus.sh first" % a.train)
    with open(a.heldout, encoding="utf-8") as f:
        held_text = f.read()
    res = {"train": os.path.relpath(a.train, ROOT), "chars": char_overlap(held_text, a.train),
           "tokens": token_overlap(a.ids, a.train, a.ids_cache)}
    c, t = res["chars"], res["tokens"]
    print("50-char windows found in train.txt: %d / %d = %.4f%% (held-out bytes covered: %.4f%%)"
          % (c["found"], c["windows"], 100 * c["rate"], 100 * c["covered_rate"]))
    for k, v in c["per_part"].items():
        print("  %-6s %d / %d = %.4f%% (covered %.4f%%)" % (k, v["found"], v["windows"], 100 * v["rate"],
                                                         100 * v["covered_rate"]))
    print("13-token windows found: %d / %d = %.4f%% (train.txt: %d tokens)"
          % (t["found"], t["windows"], 100 * t["rate"], t["train_tokens"]))
    print("most frequent matched 50-char windows:")
    for s, n in c["top_found"]:
        print("  %3d x %r" % (n, s))
    print("matched 50-char windows with letters:")
    for s, n in c["top_found_with_letters"]:
        print("  %3d x %r" % (n, s))
    print("matched 13-token windows (%d distinct), most frequent:" % t["distinct_found"])
    for s, n in t["top_found"]:
        print("  %3d x %r" % (n, s))
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(a.json + ".tmp", a.json)


if __name__ == "__main__":
    main()
