#!/usr/bin/env python3
"""Joins two or more gpu_summary.py outputs (the same sweep run several times, each a separate
process) into per-case spreads and says which orderings against the best FP16 decode hold.

usage: gpu_runs.py summary1.json summary2.json [...] [--out runs.json] [--markdown table.md]
                   [--hq 32] [--contexts 2048,32768,131072]

One repetition's median inside a process hides what moves between processes (placement of the
cache in memory, clocks, the order of the sweep): on the H200 most decode cases repeat within
4 %, some KVarN batch-128 cases move by 15 %. So per decode case (fmt, hq, hkv, batch, ctx)
present in every run:
  times_us       the run's median time, per run (in the order given)
  time_us        the median over runs; spread = max / min - 1 over runs
  ratios         × best FP16 per run (best FP16 as each run measured it: our FP16 kernel, SDPA or
                 FlashInfer, whichever its summary named)
  ratio_min/max  the range of those ratios
  margin         the larger run-to-run spread of the method's time and of the best FP16's time
  ordering       "faster" when every run has the method ahead of the best FP16 by more than the
                 margin (ratio_min > 1 + margin), "slower" when every run has it behind by more
                 than that (ratio_max < 1 - margin), else "not significant"; none for our FP16
                 kernel where it is the best FP16 in every run.
The decision uses every run, not a mean: with few runs the range is the honest interval, and a
margin within one case's run-to-run spread is not an ordering. Runs must come from the same GPU
(meta.gpu); their commits are listed (kernels that changed between them make a case's spread
include that change, which the caller must say). Writes atomically; exits 2 on bad input.
"""
import os
import statistics
import sys

from gpu_summary import InputError, load_json, write_json


def load(path):
    s = load_json(path, "summary")
    if not isinstance(s, dict) or not isinstance(s.get("decode"), list):
        raise InputError(f"{path}: not a gpu_summary.py summary (no 'decode' list)")
    return s


def case_key(r):
    return (r["fmt"], r["hq"], r["hkv"], r["batch"], r["ctx"])


def join_runs(summaries, names=None):
    """The per-case record of the module docstring, sorted by (hq, batch, ctx, fmt)."""
    if len(summaries) < 2:
        raise InputError("need at least two runs")
    names = names or [f"run{i}" for i in range(len(summaries))]
    gpus = {s.get("meta", {}).get("gpu") for s in summaries}
    if len(gpus) != 1:
        raise InputError(f"runs from different GPUs: {sorted(map(str, gpus))}")
    per_run = []
    for name, s in zip(names, summaries):
        rows = {}
        for r in s["decode"]:
            t = r.get("time_s")
            if not isinstance(t, (int, float)) or not t > 0:
                raise InputError(f"{name}: case {case_key(r)} has no positive time_s")
            rows[case_key(r)] = r
        per_run.append(rows)
    common = set(per_run[0]).intersection(*per_run[1:])
    out = []
    for k in sorted(common, key=lambda k: (k[1], k[3], k[4], k[0], k[2])):
        times = [rows[k]["time_s"] * 1e6 for rows in per_run]
        spread = max(times) / min(times) - 1.0
        ratios = [rows[k].get("speedup_vs_best_fp16") for rows in per_run]
        rec = dict(fmt=k[0], hq=k[1], hkv=k[2], batch=k[3], ctx=k[4], times_us=times,
                   time_us=statistics.median(times), spread=spread,
                   best_fp16=[rows[k].get("best_fp16") for rows in per_run], ratios=ratios,
                   ratio_min=None, ratio_max=None, margin=None, ordering=None)
        if all(isinstance(x, (int, float)) and x > 0 for x in ratios):
            lo, hi = min(ratios), max(ratios)
            ref = [t * x for t, x in zip(times, ratios)]  # the best FP16's time in each run
            margin = max(spread, max(ref) / min(ref) - 1.0)
            rec.update(ratio_min=lo, ratio_max=hi, margin=margin)
            if rec["best_fp16"] != ["fp16"] * len(per_run) or k[0] != "fp16":
                rec["ordering"] = ("faster" if lo > 1.0 + margin else
                                   "slower" if hi < 1.0 - margin else "not significant")
        out.append(rec)
    return out


def markdown(cases, hq=32, contexts=(2048, 32768, 131072)):
    lines = ["| method | B | context | µs, median of runs (range) | × best FP16, range over runs "
             "| ordering |", "|---|---:|---:|---:|---:|---|"]
    for c in cases:
        if c["hq"] != hq or c["ctx"] not in contexts or c["ordering"] is None:
            continue
        t = c["times_us"]
        lines.append(f"| {c['fmt']} | {c['batch']} | {c['ctx']} | {c['time_us']:.1f} "
                     f"({min(t):.1f}–{max(t):.1f}) | {c['ratio_min']:.3f}–{c['ratio_max']:.3f} "
                     f"| {c['ordering']} |")
    return "\n".join(lines) + "\n"


def write_text(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv):
    args, opts = [], {}
    it = iter(argv)
    for a in it:
        if a in ("--out", "--markdown", "--hq", "--contexts"):
            opts[a] = next(it, None)
            if opts[a] is None:
                raise InputError(f"{a} needs a value")
        else:
            args.append(a)
    summaries = [load(p) for p in args]
    cases = join_runs(summaries, names=args)
    doc = dict(runs=[dict(path=p, commit=s.get("meta", {}).get("commit"),
                          date=s.get("meta", {}).get("date")) for p, s in zip(args, summaries)],
               gpu=summaries[0].get("meta", {}).get("gpu"), cases=cases)
    if "--out" in opts:
        write_json(opts["--out"], doc)
    hq = int(opts.get("--hq", 32))
    ctxs = tuple(int(x) for x in opts.get("--contexts", "2048,32768,131072").split(","))
    table = markdown(cases, hq, ctxs)
    if "--markdown" in opts:
        write_text(opts["--markdown"], table)
    counts = {}
    for c in cases:
        if c["ordering"]:
            counts[c["ordering"]] = counts.get(c["ordering"], 0) + 1
    print(f"{len(cases)} cases in all {len(args)} runs; orderings against the best FP16: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (InputError, ValueError) as e:
        print(f"gpu_runs.py: {e}", file=sys.stderr)
        sys.exit(2)
