"""Tests of scripts/gpu_runs.py (run by pytest): per-case spreads over runs and the orderings
against the best FP16 decode, on synthetic summaries with known times, and the CLI (files,
errors)."""
import json
import os
import subprocess
import sys
import tempfile

import gpu_runs as gr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_runs.py")


def summary(cases, gpu="NVIDIA H200", commit="abc"):
    """cases: {(fmt, batch, ctx): (time_us, best_fp16_time_us, best_name)} at Hq 32, Hkv 8."""
    decode = []
    for (fmt, batch, ctx), (t, ref, name) in cases.items():
        decode.append(dict(fmt=fmt, hq=32, hkv=8, batch=batch, ctx=ctx, time_s=t * 1e-6,
                           best_fp16=name, speedup_vs_best_fp16=ref / t if t else None))
    return dict(meta=dict(gpu=gpu, commit=commit, date="2026-12-03"), decode=decode)


def by_fmt(cases):
    return {(c["fmt"], c["batch"], c["ctx"]): c for c in cases}


def test_orderings(check):
    r1 = summary({("k4v2", 8, 32768): (100.0, 300.0, "sdpa"),     # 3x ahead, 1 % spread
                  ("k4v4", 1, 2048): (11.4, 11.6, "fp16"),        # 1.7 % ahead in run 1
                  ("tq4", 8, 1024): (20.0, 17.0, "fp16"),         # behind by 15 %
                  ("fp16", 8, 1024): (17.0, 17.0, "fp16"),        # the reference itself
                  ("fp8", 1, 2048): (10.0, 10.6, "fp16")})        # 6-10 % ahead, ref. 12 % spread
    r2 = summary({("k4v2", 8, 32768): (101.0, 301.0, "sdpa"),
                  ("k4v4", 1, 2048): (11.6, 11.5, "fp16"),        # 0.9 % behind in run 2
                  ("tq4", 8, 1024): (20.2, 17.1, "fp16"),
                  ("fp16", 8, 1024): (17.1, 17.1, "fp16"),
                  ("fp8", 1, 2048): (10.8, 11.9, "fp16")})
    cases = by_fmt(gr.join_runs([r1, r2]))
    check(len(cases) == 5, f"five common cases: {sorted(cases)}")
    c = cases[("k4v2", 8, 32768)]
    check(c["ordering"] == "faster", f"3x ahead in both runs: {c}")
    check(abs(c["time_us"] - 100.5) < 1e-9 and abs(c["spread"] - 0.01) < 1e-9,
          f"median, spread: {c}")
    check(abs(c["ratio_min"] - 301.0 / 101.0) < 1e-9 and abs(c["ratio_max"] - 3.0) < 1e-9, c)
    check(cases[("k4v4", 1, 2048)]["ordering"] == "not significant", cases[("k4v4", 1, 2048)])
    check(cases[("tq4", 8, 1024)]["ordering"] == "slower", cases[("tq4", 8, 1024)])
    check(cases[("fp16", 8, 1024)]["ordering"] is None, "our FP16 as its own reference: none")
    f8 = cases[("fp8", 1, 2048)]
    check(abs(f8["margin"] - (11.9 / 10.6 - 1.0)) < 1e-9, f"margin from the reference: {f8}")
    check(f8["ordering"] == "not significant", f"6-10 % ahead within a 12 % spread: {f8}")


def test_three_runs_use_every_run(check):
    mk = lambda t: summary({("k4v2", 8, 16384): (t, 120.0, "fp16")})  # noqa: E731
    c = gr.join_runs([mk(100.0), mk(101.0), mk(118.0)])[0]
    check(c["time_us"] == 101.0, f"median of three: {c['time_us']}")
    check(c["ordering"] == "not significant", f"one run at 1.02x within an 18 % spread: {c}")
    c = gr.join_runs([mk(100.0), mk(101.0), mk(102.0)])[0]
    check(c["ordering"] == "faster", f"1.18-1.2x with a 2 % spread: {c}")


def test_cases_missing_from_a_run_are_left_out(check):
    r1 = summary({("k4v2", 8, 2048): (10.0, 20.0, "fp16"), ("k4v4", 8, 2048): (12.0, 20.0, "fp16")})
    r2 = summary({("k4v2", 8, 2048): (10.0, 20.0, "fp16")})
    cases = gr.join_runs([r1, r2])
    check([c["fmt"] for c in cases] == ["k4v2"], f"only the common case: {cases}")


def test_bad_input_is_an_error(check):
    one = summary({("k4v2", 8, 2048): (10.0, 20.0, "fp16")})
    for runs, what in (([one], "a single run"),
                       ([one, summary({("k4v2", 8, 2048): (10.0, 20.0, "fp16")}, gpu="H100")],
                        "different GPUs"),
                       ([one, summary({("k4v2", 8, 2048): (0.0, 20.0, "fp16")})], "zero time")):
        try:
            gr.join_runs(runs)
            check(False, f"{what}: no error")
        except gr.InputError:
            pass


def test_cli_writes_json_and_table_and_rejects_bad_files(check):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, t in enumerate((100.0, 101.0)):
            p = os.path.join(d, f"s{i}.json")
            with open(p, "w") as f:
                json.dump(summary({("k4v2", 8, 32768): (t, 300.0, "sdpa")}, commit=f"c{i}"), f)
            paths.append(p)
        out, md = os.path.join(d, "runs.json"), os.path.join(d, "runs.md")
        r = subprocess.run([sys.executable, SCRIPT, *paths, "--out", out, "--markdown", md],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"exit 0: {r.stderr}")
        doc = json.load(open(out))
        check([x["commit"] for x in doc["runs"]] == ["c0", "c1"], f"runs listed: {doc['runs']}")
        check(doc["cases"][0]["ordering"] == "faster", doc["cases"])
        table = open(md).read()
        row = "| k4v2 | 8 | 32768 | 100.5 (100.0–101.0) | 2.970–3.000 | faster |"
        check(row in table, table)
        check(not any(n.startswith(("runs.json.tmp", "runs.md.tmp")) for n in os.listdir(d)),
              "no temporary files left")
        bad = os.path.join(d, "bad.json")
        with open(bad, "w") as f:
            f.write("{not json")
        r = subprocess.run([sys.executable, SCRIPT, paths[0], bad], capture_output=True, text=True)
        check(r.returncode == 2 and "bad.json" in r.stderr, f"exit 2 naming the file: {r.stderr}")
