#!/usr/bin/env python3
"""Joins the Google Benchmark JSON (kvarn_gpu_bench) with the SDPA JSON into one summary JSON and
prints a short table. usage: gpu_summary.py bench.json sdpa.json meta.json out.json [throughput.json]

summary["throughput"] (also written alone, a bare list, to throughput.json: the file
reports/kvarn_report reads from a run directory) holds one entry per decode case:
  method (canonical method name: fp16, fp8_e4m3, kvarn_k4v2_g128, kvarn_k4v4_g128,
  turboquant_4bit_nc, turboquant_3bit_nc, turboquant_k8v4), batch, context, hq, hkv,
  time_us (median), bytes (bytes the kernel reads: KV + query/output + block table),
  tb_s, pct_roofline (of the measured read bandwidth), speedup_vs_fp16 (our FP16 kernel, same
  shape), speedup_vs_sdpa (PyTorch SDPA flash, same shape; null where not measured),
  bytes_per_token (KV bytes read per token and KV head, sink/tail included),
  plus fmt, splits, kv_bytes, sdpa_time_us.
"""
import json, os, sys

METHOD = {"fp16": "fp16", "fp8": "fp8_e4m3", "k4v2": "kvarn_k4v2_g128", "k4v4": "kvarn_k4v4_g128",
          "tq4": "turboquant_4bit_nc", "tq3": "turboquant_3bit_nc", "tqk8v4": "turboquant_k8v4"}

bench = json.load(open(sys.argv[1]))
try:
    sdpa = json.load(open(sys.argv[2]))
except Exception:
    sdpa = []
meta = json.load(open(sys.argv[3]))
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
        rows[(fmt, hq, hkv, bs, ctx)] = dict(fmt=fmt, hq=hq, hkv=hkv, batch=bs, ctx=ctx, time_s=t,
                                             bytes_read=b["bytes_read"], TBps=b["TBps"],
                                             splits=b["splits"], kv_bytes=b.get("kv_bytes"))
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
# measured: one store launch of batch * Hkv tiles (what 128 generated tokens produce) vs 128 steps
store_cost = []
for (f, hq, hkv, bs, ctx), r in rows.items():
    if f == "k4v2" and hq == 32 and bs in store_launch:
        store_cost.append(dict(batch=bs, ctx=ctx, store_launch_us=store_launch[bs] * 1e6,
                               decode_128_us=128e6 * r["time_s"],
                               pct=100.0 * store_launch[bs] / (128 * r["time_s"])))
throughput = []
for r in sorted(rows.values(), key=lambda r: (r["hq"], r["batch"], r["ctx"], r["fmt"])):
    kvb = r.get("kv_bytes")
    throughput.append(dict(
        method=METHOD.get(r["fmt"], r["fmt"]), batch=r["batch"], context=r["ctx"], hq=r["hq"],
        hkv=r["hkv"], time_us=r["time_s"] * 1e6, bytes=r["bytes_read"], tb_s=r["TBps"],
        pct_roofline=r["pct_read_bw"], speedup_vs_fp16=r["speedup_vs_fp16"],
        speedup_vs_sdpa=r["speedup_vs_sdpa"],
        bytes_per_token=(kvb / (r["batch"] * r["hkv"] * r["ctx"]) if kvb else None),
        fmt=r["fmt"], splits=r["splits"], kv_bytes=kvb,
        sdpa_time_us=(r["sdpa_time_s"] * 1e6 if r["sdpa_time_s"] else None),
        roofline_read_tb_s=read_bw))
out = dict(meta=meta, read_TBps=read_bw, copy_TBps=copy_bw, store=store,
           decode=sorted(rows.values(), key=lambda r: (r["hq"], r["batch"], r["ctx"], r["fmt"])),
           sdpa=sdpa, throughput=throughput,
           store_launch_cost=sorted(store_cost, key=lambda e: (e["batch"], e["ctx"])))
json.dump(out, open(sys.argv[4], "w"), indent=1)
tp_path = sys.argv[5] if len(sys.argv) > 5 else os.path.join(os.path.dirname(os.path.abspath(sys.argv[4])), "throughput.json")
json.dump(throughput, open(tp_path, "w"), indent=1)
print(f"read {read_bw} TB/s  copy {copy_bw} TB/s  store {json.dumps({k: round(v['tiles_per_s']) for k, v in store.items()})}")
for e in sorted(store_cost, key=lambda e: (e["batch"], e["ctx"])):
    if e["ctx"] in (2048, 32768):
        print(f"store launch b{e['batch']} ctx{e['ctx']}: {e['store_launch_us']:.1f} us = {e['pct']:.2f} % of 128 steps")
print(f"{'fmt':5} {'hq':>3} {'B':>4} {'ctx':>6} {'us':>9} {'TB/s':>5} {'%rd':>4} {'xFP16':>6} {'xSDPA':>6}")
for r in out["decode"]:
    if r["hq"] != 32 or r["ctx"] not in (2048, 8192, 32768, 131072):
        continue
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"
    print(f"{r['fmt']:5} {r['hq']:>3} {r['batch']:>4} {r['ctx']:>6} {r['time_s']*1e6:>9.1f} "
          f"{r['TBps']:>5.2f} {f(r['pct_read_bw'], 0):>4} {f(r['speedup_vs_fp16']):>6} {f(r['speedup_vs_sdpa']):>6}")
