"""Tests of scripts/gpu_summary.py (run by pytest).

Synthetic decode times on known lines time_us = a + b * context check the ITL fit (slope,
intercept, r2), the break-even context versus FP16 (from the lines and from the measured points,
every reason code), the capacity table (core accounting from concatenated `kvarn-eval methods`
arrays next to the kernel's bytes) and the written files (summary.json, throughput.json as the
report reads it, atomic writes, clear errors on bad input) and the report's ITL table; on a
measured bench/results gbench JSON, the fits' invariants against the raw times.
"""
import json
import os
import subprocess
import sys
import tempfile

import gpu_summary as gs
from kvarn_report import tables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_summary.py")
CONTEXTS = [1024, 2048, 4096, 16384, 32768, 65536, 131072]
# A measured H200 run (committed): the decode benchmark and the libtorch SDPA anchor.
REAL_GBENCH = os.path.join(ROOT, "bench", "results", "h200_2026-11-29_tq_gbench.json")
REAL_SDPA = os.path.join(ROOT, "bench", "results", "h200_2026-11-29_tc_sdpa.json")


def close(x, y, rel=1e-9, abs_=1e-9):
    return x is not None and y is not None and abs(x - y) <= max(abs_, rel * abs(y))


def test_linear_fit(check):
    a, b, r2 = gs.linear_fit(CONTEXTS, [7.5 + 0.0031 * c for c in CONTEXTS])
    check(close(a, 7.5) and close(b, 0.0031) and close(r2, 1.0), f"exact line: {a} {b} {r2}")
    noisy = [7.5 + 0.0031 * c + (1.0 if i % 2 else -1.0) for i, c in enumerate(CONTEXTS)]
    a, b, r2 = gs.linear_fit(CONTEXTS, noisy)
    check(0.99 < r2 < 1.0, f"noisy line r2 in (0.99, 1): {r2}")
    check(abs(b - 0.0031) < 1e-4, f"noisy slope near 0.0031: {b}")
    for xs in ([4096], [4096, 4096]):
        try:
            gs.linear_fit(xs, [1.0] * len(xs))
            check(False, f"linear_fit({xs}) must refuse")
        except ValueError:
            pass


def test_break_even_fit(check):
    ref = (10.0, 1.0)
    c, why, cross = gs.break_even_fit(ref, (30.0, 0.5))  # slower start, smaller slope
    check(close(c, 40.0) and why == "" and close(cross, 40.0), f"crossing at 40: {c} {why}")
    check(gs.break_even_fit(ref, (5.0, 0.5))[:2] == (None, "always"), "below everywhere")
    check(gs.break_even_fit(ref, (10.0, 1.0))[:2] == (None, "always"), "equal lines: always")
    check(gs.break_even_fit(ref, (20.0, 1.0))[:2] == (None, "never"), "parallel above: never")
    check(gs.break_even_fit(ref, (20.0, 2.0))[:2] == (None, "never"), "above, steeper: never")
    c, why, cross = gs.break_even_fit(ref, (4.0, 1.5))  # faster only below 12
    check(c is None and why == "only_below" and close(cross, 12.0), f"only below 12: {why} {cross}")


def test_break_even_measured(check):
    ref = {1: 10.0, 2: 20.0, 4: 40.0, 8: 80.0}
    c, why, faster = gs.break_even_measured(ref, {1: 15.0, 2: 20.0, 4: 30.0, 8: 60.0})
    check(c == 2 and why == "" and faster == [2, 4, 8], f"first from 2 on: {c} {why} {faster}")
    # faster at 2, slower at 4, faster again from 8: the break-even is 8, not the first hit
    c, why, faster = gs.break_even_measured(ref, {1: 15.0, 2: 19.0, 4: 41.0, 8: 70.0})
    check(c == 8 and faster == [2, 8], f"holds from 8 on: {c} {faster}")
    check(gs.break_even_measured(ref, {1: 9.0, 2: 9.0, 4: 9.0, 8: 9.0})[:2] == (None, "always"),
          "always")
    check(gs.break_even_measured(ref, {1: 11.0, 2: 21.0, 4: 41.0, 8: 81.0})[:2] == (None, "never"),
          "never")
    check(gs.break_even_measured(ref, {1: 5.0, 2: 25.0, 4: 45.0, 8: 85.0})[:2] ==
          (None, "not_at_longest"), "faster only at the shortest")
    check(gs.break_even_measured(ref, {3: 1.0})[:2] == (None, "no_common_context"), "disjoint")


def synthetic_points():
    """fp16: 10 + 0.004 c; kvarn: 25 + 0.001 c (break-even 5000); fp8: below everywhere."""
    lines = {"fp16": (10.0, 0.004), "kvarn_k4v2_g128": (25.0, 0.001), "fp8_e4m3": (6.0, 0.002)}
    return [dict(method=m, batch=8, hq=32, hkv=8, context=c, time_us=a + b * c)
            for m, (a, b) in lines.items() for c in CONTEXTS]


def test_itl_fits(check):
    fits = {f["method"]: f for f in gs.itl_fits(synthetic_points())}
    k = fits["kvarn_k4v2_g128"]
    check(close(k["itl_slope_us_per_1k_tokens"], 1.0) and close(k["intercept_us"], 25.0),
          f"kvarn slope 1 us/1k, intercept 25: {k['itl_slope_us_per_1k_tokens']} {k['intercept_us']}")
    check(close(k["r2"], 1.0), f"kvarn r2 1: {k['r2']}")
    check(close(k["break_even_context_fit"], 5000.0, rel=1e-6), f"fit break-even 5000: {k}")
    check(k["break_even_context_measured"] == 16384, f"measured break-even 16384: {k}")
    check(k["faster_at_contexts"] == [16384, 32768, 65536, 131072], f"faster at: {k}")
    check(k["fit_contexts"] == CONTEXTS, "fit contexts listed")
    f8 = fits["fp8_e4m3"]
    check(f8["break_even_reason_fit"] == "always" and f8["break_even_reason_measured"] == "always",
          f"fp8 always: {f8}")
    f16 = fits["fp16"]
    check(f16["break_even_reason_fit"] == "reference" and close(f16["itl_slope_us_per_1k_tokens"], 4.0),
          f"fp16 is the reference, slope 4: {f16}")
    two = [p for p in synthetic_points() if p["context"] in (2048, 131072)]
    k2 = {f["method"]: f for f in gs.itl_fits(two)}["kvarn_k4v2_g128"]
    check(close(k2["itl_slope_us_per_1k_tokens"], 1.0) and k2["r2"] is None,
          f"two contexts: exact line, no r2: {k2}")
    # one context only: no line, but the measured comparison still works
    pts = [p for p in synthetic_points() if p["method"] != "kvarn_k4v2_g128" or p["context"] == 65536]
    k1 = {f["method"]: f for f in gs.itl_fits(pts)}["kvarn_k4v2_g128"]
    check(k1["itl_slope_us_per_1k_tokens"] is None and k1["break_even_reason_fit"] == "no_fit",
          f"single context: no fit {k1}")
    check(k1["break_even_reason_measured"] == "always", f"single context measured: {k1}")


def test_report_table(check):
    """reports/kvarn_report/tables.itl_markdown renders the same fits from throughput.json rows."""

    class Run:
        throughput = synthetic_points() + [dict(method="broken", batch="x")]

    text = tables.itl_markdown(Run())
    row = "| kvarn_k4v2_g128 | 8 | 32/8 | 1.00 | 25.0 | 1.0000 | 5,000 | 16,384 |"
    check(row in text.splitlines(), f"report ITL row {row!r} in:\n{text}")
    check("| fp16 | 8 | 32/8 | 4.00 | 10.0 | 1.0000 | reference | reference |" in text, "fp16 row")
    Run.throughput = []
    check(tables.itl_markdown(Run()) == "", "no throughput: no table")


def gbench_json():
    """A kvarn_gpu_bench-shaped JSON whose decode times lie on the synthetic lines."""
    bms = [dict(name="roofline/read", real_time=1.0, time_unit="us", TBps=4.0),
           dict(name="roofline/copy", real_time=1.0, time_unit="us", TBps=3.5)]
    per_token = {"fp16": 512.0, "k4v2": 109.6, "fp8": 256.0}
    lines = {"fp16": (10.0, 0.004), "k4v2": (25.0, 0.001), "fp8": (6.0, 0.002)}
    for fmt, (a, b) in lines.items():
        for c in CONTEXTS:
            kv = 8 * 8 * c * per_token[fmt]
            bms.append(dict(name=f"decode/{fmt}/hq32/hkv8/b8/ctx{c}/iterations:1/manual_time",
                            real_time=a + b * c, time_unit="us", bytes_read=kv, kv_bytes=kv,
                            TBps=kv / ((a + b * c) * 1e-6) * 1e-12, splits=4.0))
    bms.append(dict(name="decode/tq4/hq32/hkv8/b8/ctx4096/iterations:1/manual_time",
                    error_occurred=True, error_message="time budget exhausted", real_time=0,
                    time_unit="us"))  # skipped case: no row, listed in the coverage
    return {"context": {}, "benchmarks": bms}


def capacity_stream():
    """Two concatenated `kvarn-eval methods --json` arrays (contexts 4096 and 32768)."""
    arrays = []
    for c in (4096, 32768):
        arrays.append([
            dict(name="fp16", spec="fp16", head_dim=128, context=c, bytes_per_token=512.0,
                 sequence_bytes=512 * c, bits_per_element_at_context=16.0,
                 capacity_vs_fp16_at_context=1.0),
            dict(name="kvarn_k4v2_g128", spec="kvarn:k=4,v=2,g=128", head_dim=128, context=c,
                 bytes_per_token=108.0, sequence_bytes=108 * (c - 128) + 512 * 128,
                 bits_per_element_at_context=3.8, capacity_vs_fp16_at_context=4.2),
            dict(name="kivi_2bit", spec="kivi", head_dim=128, context=c, bytes_per_token=96.0,
                 sequence_bytes=96 * c),  # not in the sweep: left out
        ])
    return "\n".join(json.dumps(a, indent=1) for a in arrays) + "\n"


def run_script(d, *extra, bench=None):
    paths = {n: os.path.join(d, n) for n in ("bench.json", "sdpa.json", "meta.json", "cap.json")}
    if bench is None:
        with open(paths["bench.json"], "w") as f:
            json.dump(gbench_json(), f)
    sdpa = [dict(hq=32, hkv=8, batch=8, ctx=c, time_s=(40.0 + 0.008 * c) * 1e-6,
                 kv_bytes=8 * 8 * c * 512, backend="flash", source="libtorch") for c in CONTEXTS]
    with open(paths["sdpa.json"], "w") as f:
        json.dump(sdpa, f)
    with open(paths["meta.json"], "w") as f:
        json.dump({"gpu": "synthetic"}, f)
    with open(paths["cap.json"], "w") as f:
        f.write(capacity_stream())
    args = [sys.executable, SCRIPT, bench or paths["bench.json"], paths["sdpa.json"],
            paths["meta.json"], os.path.join(d, "summary.json"), os.path.join(d, "tp.json")]
    return subprocess.run(args + list(extra), capture_output=True, text=True)


def test_end_to_end(check):
    with tempfile.TemporaryDirectory() as d:
        p = run_script(d, "--capacity", os.path.join(d, "cap.json"))
        check(p.returncode == 0, f"script exit 0: {p.returncode} {p.stderr}")
        if p.returncode:
            return
        check(sorted(os.listdir(d)) == ["bench.json", "cap.json", "meta.json", "sdpa.json",
                                        "summary.json", "tp.json"], f"no temp files: {os.listdir(d)}")
        s = json.load(open(os.path.join(d, "summary.json")))
        tp = json.load(open(os.path.join(d, "tp.json")))
        fits = {(f["method"], f["batch"]): f for f in s["itl_fits"]}
        k = fits[("kvarn_k4v2_g128", 8)]
        check(close(k["itl_slope_us_per_1k_tokens"], 1.0, rel=1e-6) and
              close(k["break_even_context_fit"], 5000.0, rel=1e-6) and
              k["break_even_context_measured"] == 16384, f"summary kvarn fit: {k}")
        sd = fits.get(("sdpa_fp16", 8))
        check(sd is not None and close(sd["itl_slope_us_per_1k_tokens"], 8.0, rel=1e-6) and
              sd["break_even_reason_fit"] == "never", f"sdpa fit slope 8, never: {sd}")
        # throughput.json: a bare list of the kernels only (SDPA is not a method row there: the
        # report keys its FP16 reference per shape), one fp16 row per shape
        check(isinstance(tp, list) and tp == s["throughput"], "throughput.json = summary list")
        check({e["method"] for e in tp} == {"fp16", "kvarn_k4v2_g128", "fp8_e4m3"},
              f"throughput methods: {sorted({e['method'] for e in tp})}")
        shapes = [(e["batch"], e["context"], e["hq"], e["hkv"]) for e in tp if e["method"] == "fp16"]
        check(len(shapes) == len(set(shapes)) == len(CONTEXTS), "one fp16 row per shape")
        e = [e for e in tp if e["method"] == "kvarn_k4v2_g128" and e["context"] == 32768][0]
        check(close(e["speedup_vs_fp16"], (10 + 0.004 * 32768) / (25 + 0.001 * 32768)) and
              close(e["speedup_vs_sdpa"], (40 + 0.008 * 32768) / (25 + 0.001 * 32768)),
              f"speedups: {e}")
        # best FP16: the fastest of our kernel and SDPA (our kernel on these lines)
        check(e["best_fp16"] == "fp16" and close(e["speedup_vs_best_fp16"], e["speedup_vs_fp16"]),
              f"best fp16 without FlashInfer: {e}")
        cap = {(c["method"], c["context"]): c for c in s["capacity"]}
        c = cap.get(("kvarn_k4v2_g128", 32768))
        check(c is not None and c["source"] == "core" and
              close(c["bytes_per_token"], (108 * (32768 - 128) + 512 * 128) / 32768) and
              close(c["kernel_bytes_per_token"], 109.6), f"capacity kvarn 32K: {c}")
        check(("kivi_2bit", 4096) not in cap, "capacity keeps the sweep's methods only")
        c = cap.get(("fp8_e4m3", 2048))
        check(c is not None and c["source"] == "kernel" and c["bytes_per_token"] is None and
              close(c["kernel_bytes_per_token"], 256.0), f"kernel-only capacity row: {c}")
        cov = s["coverage"]
        check(cov["decode_expected"] == 7 * 56 and cov["decode_measured"] == 3 * 7 and
              cov["sdpa_expected"] == 56 and cov["sdpa_measured"] == 7, f"coverage counts: {cov}")
        why = {m["case"]: m["reason"] for m in cov["decode_missing"]}
        check(why.get("decode/tq4/hq32/hkv8/b8/ctx4096") == "time budget exhausted" and
              why.get("decode/k4v2/hq64/hkv8/b128/ctx131072") == "not run" and
              "decode/k4v2/hq32/hkv8/b8/ctx4096" not in why, "coverage reasons")
        check("sdpa/hq64/hkv8/b1/ctx1024" in cov["sdpa_missing"], "sdpa coverage")
        check("ITL fits" in p.stdout and "capacity at 32K" in p.stdout and
              "coverage: decode 21/392" in p.stdout, "printed tables")
        # a FlashInfer anchor faster than our FP16 kernel at 32K becomes the best FP16 there
        fi = os.path.join(d, "fi.json")
        with open(fi, "w") as f:
            json.dump([dict(hq=32, hkv=8, batch=8, ctx=32768, time_s=50e-6, kv_bytes=1,
                            backend="flashinfer")], f)
        p = run_script(d, "--flashinfer", fi)
        tp = json.load(open(os.path.join(d, "tp.json")))
        e = [e for e in tp if e["method"] == "kvarn_k4v2_g128" and e["context"] == 32768][0]
        check(p.returncode == 0 and e["best_fp16"] == "flashinfer" and
              close(e["speedup_vs_best_fp16"], 50 / (25 + 0.001 * 32768)) and
              close(e["speedup_vs_flashinfer"], e["speedup_vs_best_fp16"]),
              f"best fp16 with FlashInfer: {e}")
        e = [e for e in tp if e["method"] == "kvarn_k4v2_g128" and e["context"] == 4096][0]
        check(e["best_fp16"] == "fp16" and e["speedup_vs_flashinfer"] is None,
              f"no FlashInfer at 4K: {e}")
        # without --capacity: kernel rows only, stated
        p = run_script(d)
        s = json.load(open(os.path.join(d, "summary.json")))
        check(p.returncode == 0 and s["capacity_source"].startswith("kernel") and
              all(c["source"] == "kernel" for c in s["capacity"]), "no capacity file")


def test_bad_input(check):
    with tempfile.TemporaryDirectory() as d:
        missing = os.path.join(d, "nope.json")
        p = run_script(d, bench=missing)
        check(p.returncode == 2 and missing in p.stderr and "Traceback" not in p.stderr,
              f"missing bench: one clear error: {p.returncode} {p.stderr}")
        bad = os.path.join(d, "bad.json")
        with open(bad, "w") as f:
            f.write("[1, 2")
        p = run_script(d, "--capacity", bad)
        check(p.returncode == 2 and "bad.json" in p.stderr and "Traceback" not in p.stderr,
              f"bad capacity: one clear error: {p.stderr}")
        check(not os.path.exists(os.path.join(d, "summary.json")), "nothing written on error")
        p = run_script(d, "--capacity")
        check(p.returncode == 2 and "--capacity" in p.stderr, "--capacity without a file")


def test_real(check):
    """Invariants on measured data (no hard-coded results)."""
    gbench, sdpa = REAL_GBENCH, REAL_SDPA
    assert os.path.isfile(gbench) and os.path.isfile(sdpa), "committed bench/results files missing"
    with tempfile.TemporaryDirectory() as d:
        meta = os.path.join(d, "meta.json")
        with open(meta, "w") as f:
            json.dump({}, f)
        out = os.path.join(d, "summary.json")
        p = subprocess.run([sys.executable, SCRIPT, gbench, sdpa, meta, out,
                            os.path.join(d, "tp.json")], capture_output=True, text=True)
        check(p.returncode == 0, f"real data: exit 0 ({p.stderr})")
        if p.returncode:
            return
        print(p.stdout)
        s = json.load(open(out))
        groups = {(e["method"], e["batch"], e["hq"], e["hkv"]) for e in s["throughput"]}
        fits = {(f["method"], f["batch"], f["hq"], f["hkv"]): f for f in s["itl_fits"]}
        check(groups <= set(fits), "a fit for every measured (method, batch, hq, hkv)")
        times = {}
        for e in s["throughput"]:
            times.setdefault((e["method"], e["batch"], e["hq"], e["hkv"]), {})[e["context"]] = e["time_us"]
        for e in s["sdpa"]:
            times.setdefault(("sdpa_fp16", e["batch"], e["hq"], e["hkv"]), {})[e["ctx"]] = e["time_s"] * 1e6
        for key, f in fits.items():
            if f["itl_slope_us_per_1k_tokens"] is None:
                continue
            check(f["r2"] is None or 0.0 <= f["r2"] <= 1.0 + 1e-12, f"{key}: r2 in [0, 1]")
            check(f["itl_slope_us_per_1k_tokens"] > 0, f"{key}: time grows with context")
            ref = times.get(("fp16",) + key[1:])
            if f["method"] == "fp16" or ref is None:
                continue
            # recompute the measured break-even from the raw times
            mine = times[key]
            common = sorted(set(mine) & set(ref))
            holds = [c for c in common if mine[c] <= ref[c]]
            check(f["faster_at_contexts"] == holds, f"{key}: faster_at_contexts")
            m = f["break_even_context_measured"]
            if m is not None:
                check(all(mine[c] <= ref[c] for c in common if c >= m), f"{key}: holds from {m}")
                before = [c for c in common if c < m]
                check(not before or mine[before[-1]] > ref[before[-1]], f"{key}: {m} is the first")
            elif f["break_even_reason_measured"] == "always":
                check(holds == common, f"{key}: always")
            elif f["break_even_reason_measured"] == "never":
                check(holds == [], f"{key}: never")
            # the fitted break-even lies where the two fitted lines cross
            c = f["break_even_context_fit"]
            rf = fits[("fp16",) + key[1:]]
            if c is not None:
                tm = f["intercept_us"] + f["itl_slope_us_per_1k_tokens"] * c / 1000
                tr = rf["intercept_us"] + rf["itl_slope_us_per_1k_tokens"] * c / 1000
                check(abs(tm - tr) <= 1e-6 * max(tm, tr), f"{key}: lines cross at {c}")
