#!/usr/bin/env python3
"""Joins the Google Benchmark JSON (kvarn_gpu_bench) with the SDPA JSON into one summary JSON and
prints a short table. usage: gpu_summary.py bench.json sdpa.json meta.json out.json"""
import json, sys

bench = json.load(open(sys.argv[1]))
try:
    sdpa = json.load(open(sys.argv[2]))
except Exception:
    sdpa = []
meta = json.load(open(sys.argv[3]))
rows, read_bw, copy_bw, store = {}, None, None, {}
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
    elif n[0] == "store":
        store[n[1]] = dict(time_s=t, tiles=b["tiles"], tiles_per_s=b["tiles_per_s"])
    elif n[0] == "decode":
        fmt, hq, hkv, bs, ctx = n[1], int(n[2][2:]), int(n[3][3:]), int(n[4][1:]), int(n[5][3:])
        rows[(fmt, hq, hkv, bs, ctx)] = dict(fmt=fmt, hq=hq, hkv=hkv, batch=bs, ctx=ctx, time_s=t,
                                             bytes_read=b["bytes_read"], TBps=b["TBps"],
                                             splits=b["splits"])
sd = {(s["hq"], s["hkv"], s["batch"], s["ctx"]): s for s in sdpa}
for (fmt, hq, hkv, bs, ctx), r in rows.items():
    r["pct_read_bw"] = 100.0 * r["TBps"] / read_bw if read_bw else None
    f16 = rows.get(("fp16", hq, hkv, bs, ctx))
    r["speedup_vs_fp16"] = f16["time_s"] / r["time_s"] if f16 else None
    s = sd.get((hq, hkv, bs, ctx))
    r["sdpa_time_s"] = s["time_s"] if s else None
    r["speedup_vs_sdpa"] = s["time_s"] / r["time_s"] if s else None
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
out = dict(meta=meta, read_TBps=read_bw, copy_TBps=copy_bw, store=store,
           decode=sorted(rows.values(), key=lambda r: (r["hq"], r["batch"], r["ctx"], r["fmt"])),
           sdpa=sdpa)
json.dump(out, open(sys.argv[4], "w"), indent=1)
print(f"read {read_bw} TB/s  copy {copy_bw} TB/s  store {json.dumps({k: round(v['tiles_per_s']) for k, v in store.items()})}")
print(f"{'fmt':5} {'hq':>3} {'B':>4} {'ctx':>6} {'us':>9} {'TB/s':>5} {'%rd':>4} {'xFP16':>6} {'xSDPA':>6}")
for r in out["decode"]:
    if r["hq"] != 32 or r["ctx"] not in (2048, 8192, 32768, 131072) and not (r["batch"] == 8 and r["ctx"] == 2048):
        continue
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"
    print(f"{r['fmt']:5} {r['hq']:>3} {r['batch']:>4} {r['ctx']:>6} {r['time_s']*1e6:>9.1f} "
          f"{r['TBps']:>5.2f} {f(r['pct_read_bw'], 0):>4} {f(r['speedup_vs_fp16']):>6} {f(r['speedup_vs_sdpa']):>6}")
