#!/usr/bin/env python3
"""Joins the Google Benchmark JSON (kvarn_gpu_bench) with the SDPA JSON into one summary JSON and
prints a short table.

usage: gpu_summary.py bench.json sdpa.json meta.json out.json [throughput.json]
                      [--capacity capacity.json] [--flashinfer flashinfer.json]
                      [--markdown table.md]

--markdown writes the lead table of docs/PERFORMANCE.md (Hq 32, contexts 2K / 32K / 128K).

summary["throughput"] (also written alone, a bare list, to throughput.json: the file
reports/kvarn_report reads from a run directory) holds one entry per decode case:
  method (canonical method name: fp16, fp8_e4m3, kvarn_k4v2_g128, kvarn_k4v4_g128,
  turboquant_4bit_nc, turboquant_3bit_nc, turboquant_k8v4), batch, context, hq, hkv,
  time_us (median), bytes (bytes the kernel reads: KV + query/output + block table),
  tb_s, pct_roofline (of the measured read bandwidth), speedup_vs_best_fp16 (against the fastest
  FP16 decode measured at that shape: our FP16 kernel, PyTorch SDPA, FlashInfer's paged decode
  when its JSON is given; best_fp16 names it), speedup_vs_fp16 (our FP16 kernel, same shape),
  speedup_vs_sdpa (PyTorch SDPA flash, same shape; null where not measured),
  speedup_vs_flashinfer,
  bytes_per_token (KV bytes read per token and KV head, sink/tail included),
  plus fmt, splits, kv_bytes, sdpa_time_us, flashinfer_time_us, best_fp16_time_us.

summary["itl_fits"]: per (method, batch, hq, hkv), the least-squares line
time_us = intercept_us + slope * context over every context measured for that group
(fit_contexts), with r2 (null for a two-point line); itl_slope_us_per_1k_tokens = slope * 1000 (1k = 1,000 tokens of context
in every sequence of the batch). The methods are the throughput methods plus sdpa_fp16 (the SDPA
JSON). Break-even versus our FP16 kernel (same batch, hq, hkv), where method time <= fp16 time:
  break_even_context_fit: the crossing of the two fitted lines when the method is faster beyond
    it; null with break_even_reason_fit "always" (at or below FP16 for every context > 0),
    "never", "only_below" (faster only below crossover_context_fit: a smaller slope is what
    matters at long context), or "reference" (fp16 itself) / "no_fit";
  break_even_context_measured: the first measured context from which the method is at or below
    FP16 at every larger measured context; null with break_even_reason_measured "always",
    "never", "not_at_longest" (faster somewhere, but not at the longest context) or "reference";
    faster_at_contexts lists the measured contexts where it holds.

summary["coverage"]: the cases of the full sweep (7 formats x 56 shapes, SDPA x 56) measured, and
each missing one with the benchmark's reason (e.g. "time budget exhausted").

summary["capacity"]: per (method, context): bytes per token and KV head (K + V, fp16 sink/tail
and metadata included) from core's accounting (`kvarn-eval methods --json --context C`, the
--capacity file: one or more concatenated JSON arrays), bits per element and capacity vs FP16,
next to the bytes per token the decode kernel reads at that context (kernel_bytes_per_token).
Without a --capacity file the rows carry the kernel bytes only (core fields null).
"""
import json, os, sys

METHOD = {"fp16": "fp16", "fp8": "fp8_e4m3", "k4v2": "kvarn_k4v2_g128", "k4v4": "kvarn_k4v4_g128",
          "tq4": "turboquant_4bit_nc", "tq3": "turboquant_3bit_nc", "tqk8v4": "turboquant_k8v4"}
SDPA_METHOD = "sdpa_fp16"
# The sweep of bench/gpu_decode_bench.cu and bench/sdpa_bench.cpp (D 128), for the coverage check.
SWEEP_HEADS = [(32, 8), (64, 8)]
SWEEP_BATCHES = [1, 8, 32, 128]
SWEEP_CONTEXTS = [1024, 2048, 4096, 16384, 32768, 65536, 131072]
REFERENCE = "fp16"


class InputError(Exception):
    pass


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what} ({e.strerror})")
    except ValueError as e:
        raise InputError(f"{path}: the {what} is not valid JSON ({e})")


def load_json_stream(path, what):
    """One or more JSON values written back to back (e.g. several `kvarn-eval methods --json`)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what} ({e.strerror})")
    dec, pos, out = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return out
        try:
            value, pos = dec.raw_decode(text, pos)
        except ValueError as e:
            raise InputError(f"{path}: the {what} is not valid JSON ({e})")
        out.extend(value if isinstance(value, list) else [value])


def write_json(path, value):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
    os.replace(tmp, path)


# ------------------------------------------------------------------ ITL fits and break-even
def linear_fit(xs, ys):
    """Least squares y = a + b x; returns (a, b, r2). Needs >= 2 distinct x."""
    n = len(xs)
    if n < 2:
        raise ValueError("a line needs at least two distinct contexts")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a line needs at least two distinct contexts")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, (1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0)


def break_even_fit(ref, fit):
    """ref, fit: (a, b) lines. Returns (context or None, reason, crossover or None)."""
    da, db = fit[0] - ref[0], fit[1] - ref[1]  # method - fp16: <= 0 where the method is faster
    if db == 0:
        return None, ("always" if da <= 0 else "never"), None
    c = -da / db
    if db < 0:  # faster beyond c
        return (None, "always", c) if c <= 0 else (c, "", c)
    return (None, "never", c) if c <= 0 else (None, "only_below", c)


def break_even_measured(ref, pts):
    """ref, pts: {context: time}. First context from which pts <= ref at every larger context."""
    common = sorted(set(ref) & set(pts))
    faster = [c for c in common if pts[c] <= ref[c]]
    if not common:
        return None, "no_common_context", faster
    if len(faster) == len(common):
        return None, "always", faster
    if not faster:
        return None, "never", faster
    if faster[-1] != common[-1]:
        return None, "not_at_longest", faster
    first = common[-1]
    for c in reversed(common):
        if pts[c] > ref[c]:
            break
        first = c
    return first, "", faster


def itl_fits(points, reference=REFERENCE):
    """points: dicts with method, batch, hq, hkv, context, time_us (one per measured case)."""
    groups = {}
    for p in points:
        key = (p["method"], p["batch"], p["hq"], p["hkv"])
        groups.setdefault(key, {})[p["context"]] = p["time_us"]
    lines = {}
    for key, pts in groups.items():
        xs = sorted(pts)
        try:
            lines[key] = linear_fit(xs, [pts[x] for x in xs])
        except ValueError:
            lines[key] = None
    out = []
    for key in sorted(groups, key=lambda k: (k[2], k[3], k[1], k[0])):
        method, batch, hq, hkv = key
        pts, line = groups[key], lines[key]
        e = dict(method=method, batch=batch, hq=hq, hkv=hkv, fit_contexts=sorted(pts),
                 itl_slope_us_per_1k_tokens=line[1] * 1000 if line else None,
                 intercept_us=line[0] if line else None,
                 r2=line[2] if line and len(pts) > 2 else None,  # two points: exact, says nothing
                 break_even_context_fit=None, break_even_reason_fit="no_fit",
                 crossover_context_fit=None, break_even_context_measured=None,
                 break_even_reason_measured="no_reference", faster_at_contexts=[])
        ref_key = (reference, batch, hq, hkv)
        if method == reference:
            e.update(break_even_reason_fit="reference", break_even_reason_measured="reference")
        elif ref_key in groups:
            if line and lines[ref_key]:
                c, why, cross = break_even_fit(lines[ref_key][:2], line[:2])
                e.update(break_even_context_fit=c, break_even_reason_fit=why,
                         crossover_context_fit=cross)
            c, why, faster = break_even_measured(groups[ref_key], pts)
            e.update(break_even_context_measured=c, break_even_reason_measured=why,
                     faster_at_contexts=faster)
        out.append(e)
    return out


# ------------------------------------------------------------------ capacity table
def capacity_table(core_entries, rows):
    """core_entries: `kvarn-eval methods --json` objects; rows: decode rows (kernel bytes)."""
    kernel = {}
    for r in rows.values():
        if r.get("kv_bytes"):
            kernel[(METHOD.get(r["fmt"], r["fmt"]), r["ctx"])] = (
                r["kv_bytes"] / (r["batch"] * r["hkv"] * r["ctx"]))
    wanted = set(METHOD.values())
    out, seen = [], set()
    for e in core_entries:
        name, ctx = e.get("name"), e.get("context")
        if name not in wanted or not isinstance(ctx, int) or ctx <= 0 or "error" in e:
            continue
        if "sequence_bytes" not in e or e.get("head_dim") != 128:
            continue
        seen.add((name, ctx))
        out.append(dict(method=name, context=ctx, head_dim=e["head_dim"],
                        bytes_per_token=e["sequence_bytes"] / ctx,
                        steady_bytes_per_token=e.get("bytes_per_token"),
                        sequence_bytes=e["sequence_bytes"],
                        bits_per_element=e.get("bits_per_element_at_context"),
                        capacity_vs_fp16=e.get("capacity_vs_fp16_at_context"),
                        kernel_bytes_per_token=kernel.get((name, ctx)), spec=e.get("spec"),
                        source="core"))
    for (name, ctx), kb in kernel.items():
        if (name, ctx) not in seen:
            out.append(dict(method=name, context=ctx, head_dim=128, bytes_per_token=None,
                            steady_bytes_per_token=None, sequence_bytes=None,
                            bits_per_element=None, capacity_vs_fp16=None,
                            kernel_bytes_per_token=kb, spec=None, source="kernel"))
    order = {m: i for i, m in enumerate(METHOD.values())}
    return sorted(out, key=lambda e: (order.get(e["method"], 99), e["context"]))


# ------------------------------------------------------------------ sweep coverage
def coverage(bench, rows, sdpa):
    """Which cases of the full sweep were measured; the rest with the benchmark's reason."""
    shapes = [(hq, hkv, b, c) for hq, hkv in SWEEP_HEADS for b in SWEEP_BATCHES
              for c in SWEEP_CONTEXTS]
    errors = {}
    for b in bench.get("benchmarks", []):
        if b.get("error_occurred"):
            errors[b["name"].split("/iterations")[0]] = b.get("error_message", "error")
    missing = []
    for fmt in METHOD:
        for hq, hkv, b, c in shapes:
            if (fmt, hq, hkv, b, c) not in rows:
                name = f"decode/{fmt}/hq{hq}/hkv{hkv}/b{b}/ctx{c}"
                missing.append(dict(case=name, reason=errors.get(name, "not run")))
    got = {(s["hq"], s["hkv"], s["batch"], s["ctx"]) for s in sdpa}
    sdpa_missing = [f"sdpa/hq{hq}/hkv{hkv}/b{b}/ctx{c}" for hq, hkv, b, c in shapes
                    if (hq, hkv, b, c) not in got]
    return dict(decode_expected=len(METHOD) * len(shapes),
                decode_measured=len(METHOD) * len(shapes) - len(missing), decode_missing=missing,
                sdpa_expected=len(shapes), sdpa_measured=len(shapes) - len(sdpa_missing),
                sdpa_missing=sdpa_missing)


# ------------------------------------------------------------------ the summary
def parse_bench(bench):
    rows, read_bw, copy_bw, store, store_launch = {}, None, None, {}, {}
    for b in bench.get("benchmarks", []):
        n = b["name"].split("/")
        if b.get("error_occurred"):
            continue
        t = b["real_time"] * {"us": 1e-6, "ms": 1e-3, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        if n[0] == "roofline":
            if n[1] == "read":
                read_bw = b["TBps"]
            else:
                copy_bw = b["TBps"]
        elif n[0] == "store_launch":
            store_launch[int(n[2][1:])] = t
        elif n[0] == "store":
            store[n[1]] = dict(time_s=t, tiles=b["tiles"], tiles_per_s=b["tiles_per_s"])
        elif n[0] == "decode":
            fmt, hq, hkv, bs, ctx = n[1], int(n[2][2:]), int(n[3][3:]), int(n[4][1:]), int(n[5][3:])
            rows[(fmt, hq, hkv, bs, ctx)] = dict(fmt=fmt, hq=hq, hkv=hkv, batch=bs, ctx=ctx,
                                                 time_s=t, bytes_read=b["bytes_read"],
                                                 TBps=b["TBps"], splits=b["splits"],
                                                 kv_bytes=b.get("kv_bytes"))
    return rows, read_bw, copy_bw, store, store_launch


def best_fp16(rows, sd, fi, shape):
    """(time_s, name) of the fastest FP16 decode measured at shape, or (None, None)."""
    cands = []
    f16 = rows.get(("fp16",) + shape)
    if f16:
        cands.append((f16["time_s"], "fp16"))
    for name, table in (("sdpa", sd), ("flashinfer", fi)):
        if shape in table:
            cands.append((table[shape]["time_s"], name))
    return min(cands) if cands else (None, None)


def summarize(bench, sdpa, meta, capacity=None, flashinfer=None):
    """Returns (summary, throughput list)."""
    rows, read_bw, copy_bw, store, store_launch = parse_bench(bench)
    key = lambda s: (s["hq"], s["hkv"], s["batch"], s["ctx"])  # noqa: E731
    sd = {key(s): s for s in sdpa}
    fi = {key(s): s for s in (flashinfer or [])}
    ratio = lambda ref, t: ref / t if ref else None  # noqa: E731
    for (fmt, hq, hkv, bs, ctx), r in rows.items():
        shape = (hq, hkv, bs, ctx)
        r["pct_read_bw"] = 100.0 * r["TBps"] / read_bw if read_bw else None
        f16 = rows.get(("fp16",) + shape)
        r["speedup_vs_fp16"] = ratio(f16["time_s"] if f16 else None, r["time_s"])
        r["sdpa_time_s"] = sd[shape]["time_s"] if shape in sd else None
        r["speedup_vs_sdpa"] = ratio(r["sdpa_time_s"], r["time_s"])
        r["flashinfer_time_s"] = fi[shape]["time_s"] if shape in fi else None
        r["speedup_vs_flashinfer"] = ratio(r["flashinfer_time_s"], r["time_s"])
        r["best_fp16_time_s"], r["best_fp16"] = best_fp16(rows, sd, fi, shape)
        r["speedup_vs_best_fp16"] = ratio(r["best_fp16_time_s"], r["time_s"])
    # store cost per 128 generated tokens: one tile per (sequence, KV head) per 128 tokens, vs the
    # 128 decode steps of the same batch (k4v2, Hq 32, Hkv 8, per layer)
    for fmt, st in store.items():
        per = []
        for (f, hq, hkv, bs, ctx), r in rows.items():
            if f == fmt and hq == 32:
                tiles = bs * hkv
                per.append(dict(batch=bs, ctx=ctx, store_s=tiles / st["tiles_per_s"],
                                decode_128_s=128 * r["time_s"],
                                pct=100.0 * tiles / st["tiles_per_s"] / (128 * r["time_s"])))
        st["cost_per_128_tokens"] = per
    # measured: one store launch of batch * Hkv tiles (what 128 generated tokens produce) vs 128
    # steps
    store_cost = []
    for (f, hq, hkv, bs, ctx), r in rows.items():
        if f == "k4v2" and hq == 32 and bs in store_launch:
            store_cost.append(dict(batch=bs, ctx=ctx, store_launch_us=store_launch[bs] * 1e6,
                                   decode_128_us=128e6 * r["time_s"],
                                   pct=100.0 * store_launch[bs] / (128 * r["time_s"])))
    decode = sorted(rows.values(), key=lambda r: (r["hq"], r["batch"], r["ctx"], r["fmt"]))
    throughput = []
    for r in decode:
        kvb = r.get("kv_bytes")
        throughput.append(dict(
            method=METHOD.get(r["fmt"], r["fmt"]), batch=r["batch"], context=r["ctx"], hq=r["hq"],
            hkv=r["hkv"], time_us=r["time_s"] * 1e6, bytes=r["bytes_read"], tb_s=r["TBps"],
            pct_roofline=r["pct_read_bw"], speedup_vs_best_fp16=r["speedup_vs_best_fp16"],
            best_fp16=r["best_fp16"], speedup_vs_fp16=r["speedup_vs_fp16"],
            speedup_vs_sdpa=r["speedup_vs_sdpa"], speedup_vs_flashinfer=r["speedup_vs_flashinfer"],
            bytes_per_token=(kvb / (r["batch"] * r["hkv"] * r["ctx"]) if kvb else None),
            fmt=r["fmt"], splits=r["splits"], kv_bytes=kvb,
            sdpa_time_us=(r["sdpa_time_s"] * 1e6 if r["sdpa_time_s"] else None),
            flashinfer_time_us=(r["flashinfer_time_s"] * 1e6 if r["flashinfer_time_s"] else None),
            best_fp16_time_us=(r["best_fp16_time_s"] * 1e6 if r["best_fp16_time_s"] else None),
            roofline_read_tb_s=read_bw))
    points = [dict(method=e["method"], batch=e["batch"], hq=e["hq"], hkv=e["hkv"],
                   context=e["context"], time_us=e["time_us"]) for e in throughput]
    points += [dict(method=SDPA_METHOD, batch=s["batch"], hq=s["hq"], hkv=s["hkv"],
                    context=s["ctx"], time_us=s["time_s"] * 1e6) for s in sdpa]
    points += [dict(method="flashinfer_fp16", batch=s["batch"], hq=s["hq"], hkv=s["hkv"],
                    context=s["ctx"], time_us=s["time_s"] * 1e6) for s in flashinfer or []]
    out = dict(meta=meta, read_TBps=read_bw, copy_TBps=copy_bw, store=store, decode=decode,
               sdpa=sdpa, flashinfer=flashinfer or [], throughput=throughput,
               store_launch_cost=sorted(store_cost, key=lambda e: (e["batch"], e["ctx"])),
               itl_fits=itl_fits(points),
               itl_fit_note=("time_us = intercept_us + slope * context, least squares over every "
                             "measured context of the (method, batch, hq, hkv) group "
                             "(fit_contexts); slope per 1,000 tokens; break-even vs our fp16 "
                             "kernel, see scripts/gpu_summary.py"),
               coverage=coverage(bench, rows, sdpa),
               capacity=capacity_table(capacity or [], rows),
               capacity_source=("core: kvarn-eval methods --json" if capacity else
                                "kernel bytes only (no --capacity file)"))
    return out, throughput


def print_tables(out):
    read_bw, copy_bw, store = out["read_TBps"], out["copy_TBps"], out["store"]
    cov = out["coverage"]
    print(f"coverage: decode {cov['decode_measured']}/{cov['decode_expected']} cases, SDPA "
          f"{cov['sdpa_measured']}/{cov['sdpa_expected']} shapes" +
          "".join(f"\n  missing {m['case']}: {m['reason']}" for m in cov["decode_missing"][:5]) +
          (f"\n  ... {len(cov['decode_missing']) - 5} more" if len(cov["decode_missing"]) > 5 else ""))
    print(f"read {read_bw} TB/s  copy {copy_bw} TB/s  store "
          f"{json.dumps({k: round(v['tiles_per_s']) for k, v in store.items()})}")
    for e in out["store_launch_cost"]:
        if e["ctx"] in (2048, 32768):
            print(f"store launch b{e['batch']} ctx{e['ctx']}: {e['store_launch_us']:.1f} us = "
                  f"{e['pct']:.2f} % of 128 steps")
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    print(f"{'fmt':6} {'hq':>3} {'B':>4} {'ctx':>6} {'us':>9} {'TB/s':>5} {'%rd':>4} {'xBest':>6} "
          f"{'best':>10} {'xFP16':>6} {'xSDPA':>6} {'xFI':>6}")
    for r in out["decode"]:
        if r["hq"] != 32 or r["ctx"] not in (2048, 8192, 32768, 131072):
            continue
        print(f"{r['fmt']:6} {r['hq']:>3} {r['batch']:>4} {r['ctx']:>6} {r['time_s']*1e6:>9.1f} "
              f"{r['TBps']:>5.2f} {f(r['pct_read_bw'], 0):>4} {f(r['speedup_vs_best_fp16']):>6} "
              f"{r['best_fp16'] or '-':>10} {f(r['speedup_vs_fp16']):>6} "
              f"{f(r['speedup_vs_sdpa']):>6} {f(r['speedup_vs_flashinfer']):>6}")
    print(f"ITL fits (Hq 32): {'method':19} {'B':>4} {'us/1k tok':>9} {'icpt us':>8} {'r2':>6} "
          f"{'break-even fit':>15} {'measured':>15}")
    be = lambda c, why: f"{c:.0f}" if c is not None else why  # noqa: E731
    for e in out["itl_fits"]:
        if e["hq"] != 32 or e["method"] == REFERENCE:
            continue
        print(f"{'':18}{e['method']:19} {e['batch']:>4} {f(e['itl_slope_us_per_1k_tokens']):>9} "
              f"{f(e['intercept_us'], 1):>8} {f(e['r2'], 4):>6} "
              f"{be(e['break_even_context_fit'], e['break_even_reason_fit']):>15} "
              f"{be(e['break_even_context_measured'], e['break_even_reason_measured']):>15}")
    cap = [c for c in out["capacity"] if c["context"] == 32768]
    if cap:
        print(f"capacity at 32K ({out['capacity_source']}): " + ", ".join(
            f"{c['method']} {f(c['bytes_per_token'], 1)} B/tok (kernel {f(c['kernel_bytes_per_token'], 1)})"
            for c in cap))


def markdown_table(out, hq=32, contexts=(2048, 32768, 131072)):
    """The lead table of docs/PERFORMANCE.md: one row per (method, batch, context) at hq."""
    f = lambda x, p=2: "–" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = ["| method | B | context | µs | TB/s | % read BW | × best FP16 (which) | × SDPA | "
             "× FlashInfer |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = {m: i for i, m in enumerate(METHOD)}
    rows = [r for r in out["decode"] if r["hq"] == hq and r["ctx"] in contexts]
    for r in sorted(rows, key=lambda r: (r["batch"], r["ctx"], order.get(r["fmt"], 99))):
        lines.append(
            f"| {METHOD.get(r['fmt'], r['fmt'])} | {r['batch']} | {r['ctx']} | "
            f"{r['time_s'] * 1e6:.1f} | {r['TBps']:.2f} | {f(r['pct_read_bw'], 0)} | "
            f"{f(r['speedup_vs_best_fp16'])} ({r['best_fp16'] or '–'}) | "
            f"{f(r['speedup_vs_sdpa'])} | {f(r['speedup_vs_flashinfer'])} |")
    return "\n".join(lines) + "\n"


def main(argv):
    args = list(argv[1:])
    def take(flag):
        if flag not in args:
            return None
        i = args.index(flag)
        if i + 1 >= len(args):
            raise InputError(f"{flag} needs a file name")
        value = args[i + 1]
        del args[i:i + 2]
        return value

    capacity_path = take("--capacity")
    flashinfer_path = take("--flashinfer")
    markdown_path = take("--markdown")
    if len(args) not in (4, 5):
        raise InputError("usage: gpu_summary.py bench.json sdpa.json meta.json out.json "
                         "[throughput.json] [--capacity capacity.json]")
    bench = load_json(args[0], "Google Benchmark JSON")
    try:
        sdpa = load_json(args[1], "SDPA JSON")
    except InputError as e:
        print(f"gpu_summary.py: note: no SDPA columns: {e}")
        sdpa = []
    meta = load_json(args[2], "meta JSON")
    capacity = load_json_stream(capacity_path, "capacity JSON") if capacity_path else None
    flashinfer = load_json(flashinfer_path, "FlashInfer JSON") if flashinfer_path else None
    if not isinstance(bench, dict) or not isinstance(sdpa, list):
        raise InputError(f"{args[0]} must be a Google Benchmark object and {args[1]} a list")
    if flashinfer is not None and not isinstance(flashinfer, list):
        raise InputError(f"{flashinfer_path} must be a list")
    try:
        out, throughput = summarize(bench, sdpa, meta, capacity, flashinfer)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{args[0]} / {args[1]}: unexpected content ({type(e).__name__}: {e})")
    write_json(args[3], out)
    tp_path = args[4] if len(args) > 4 else os.path.join(
        os.path.dirname(os.path.abspath(args[3])), "throughput.json")
    write_json(tp_path, throughput)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(markdown_table(out))
    print_tables(out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except InputError as e:
        print(f"gpu_summary.py: error: {e}", file=sys.stderr)
        sys.exit(2)
