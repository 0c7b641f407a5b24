#!/usr/bin/env python3
"""Prints the short table that scripts/gpu.sh shows after a runner sweep, from the run's
summary.jsonl (docs/results.md: one row per method, data part, metric, layer and head).

usage: sweep_table.py accumulation|quality|retrieval SUMMARY_JSONL

  accumulation: per method the pooled ("all" layers) accumulation and decode metrics;
  quality:      per method and model, effective bits and the pooled KLD / perplexity metrics;
  retrieval:    per method, effective bits, passkey accuracy per length (mean over the depth
                cells, equal trials per cell) and pooled over every cell with its 95 % CI.
A cell a run did not measure prints "-". Exit 1 with one line when the summary is missing or
not JSON lines.
"""
import json
import re
import sys

ACCUMULATION = ["accumulation.mae_accumulated.final", "accumulation.mae_static.final",
                "accumulation.mae_accumulated.first", "decode.kl.mean", "decode.top1_agreement",
                "decode.first_divergence"]
QUALITY = ["quality.kld.mean", "quality.kld.p99", "quality.ppl_ratio", "quality.same_top1"]


def load(path):
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        sys.exit(f"error: {path}: no summary (the sweep did not finish)")
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            sys.exit(f"error: {path}:{n}: not a JSON line: {e.msg}")
    return rows


def cell(v, width):
    return ("%.4g" % v if isinstance(v, (int, float)) else "-").rjust(width)


def accumulation(rows):
    val = {(r["method"], r["metric"]): r["value"] for r in rows
           if r.get("layer") == "all" and r["metric"] in ACCUMULATION}
    out = ["method".ljust(20) + "".join(m.split(".", 1)[1][:22].rjust(24) for m in ACCUMULATION)]
    for m in dict.fromkeys(r["method"] for r in rows):
        out.append(m.ljust(20) + "".join(cell(val.get((m, w)), 24) for w in ACCUMULATION))
    return out


def quality(rows):
    val = {(r["method"], r["data"], r["metric"]): r["value"] for r in rows
           if r.get("layer") == "all"}
    out = ["method".ljust(20) + "model".ljust(30) + "eff.bits".rjust(9) +
           "".join(w.split(".", 1)[1].rjust(14) for w in QUALITY)]
    for m, d in dict.fromkeys((r["method"], r["data"]) for r in rows
                              if r.get("scope") == "quality"):
        eff = next(r["effective_bits"] for r in rows if r["method"] == m and r["data"] == d)
        out.append(m.ljust(20) + d.ljust(30) + ("%.3f" % eff).rjust(9) +
                   "".join(cell(val.get((m, d, w)), 14) for w in QUALITY))
    return out


def length(r):  # the cell rows' data is "<model>/L=<tokens>/depth=<d>"
    m = re.search(r"/L=(\d+)/", r["data"])
    return int(m.group(1)) if m else None


def retrieval(rows):
    acc, lo, hi = ([r for r in rows if r["metric"] == "retrieval.passkey." + m]
                   for m in ("accuracy", "ci_low", "ci_high"))
    cols = sorted({length(r) for r in acc} - {None})
    out = ["method".ljust(20) + "eff.bits".rjust(9) +
           "".join(("acc L=%d" % c).rjust(12) for c in cols) + "all [95% CI]".rjust(24)]
    for m in dict.fromkeys(r["method"] for r in acc):
        cells = []
        for c in cols:
            v = [r["value"] for r in acc if r["method"] == m and length(r) == c]
            cells.append("%.3f" % (sum(v) / len(v)) if v else "-")
        pooled = [(a["value"], l["value"], h["value"], a["effective_bits"])
                  for a, l, h in zip(acc, lo, hi) if a["method"] == m and length(a) is None]
        all_ = "%.3f [%.2f, %.2f]" % pooled[0][:3] if pooled else "-"
        eff = "%.3f" % pooled[0][3] if pooled else "-"
        out.append(m.ljust(20) + eff.rjust(9) + "".join(x.rjust(12) for x in cells) +
                   all_.rjust(24))
    return out


TABLES = {"accumulation": accumulation, "quality": quality, "retrieval": retrieval}


def main(argv):
    if len(argv) != 3 or argv[1] not in TABLES:
        sys.exit("usage: sweep_table.py accumulation|quality|retrieval SUMMARY_JSONL")
    print("\n".join(TABLES[argv[1]](load(argv[2]))))


if __name__ == "__main__":
    main(sys.argv)
