#!/usr/bin/env python3
"""PyTorch SDPA (flash backend, fp16, contiguous K/V, enable_gqa) decode anchor from Python, same
shapes as bench/gpu_decode_bench.cu. bench/sdpa_bench.cpp (kvarn_sdpa_bench) measures the same
through libtorch and is what `scripts/gpu.sh bench` uses; this script is the fallback and the
cross-check (--shapes). Writes JSON: list of {hq, hkv, batch, ctx, time_s, kv_bytes, backend,
source}. Timing: eager, CUDA events, median of 25 repetitions (7 above 20 GB); before every
repetition the L2 is flushed by reading a buffer of three times its size. The output is checked
after timing: finite, and over constant K rows equal to the V channel pattern (uniform attention)."""
import argparse, json, os, sys, time
import torch
import torch.nn.functional as F


def parse_shapes(text):
    """'HQ,HKV,B,CTX HQ,HKV,B,CTX ...' -> set of 4-tuples (bad input: one clear error)."""
    out = set()
    for item in text.split():
        try:
            hq, hkv, b, ctx = (int(x) for x in item.split(","))
        except ValueError:
            sys.exit(f"gpu_sdpa.py: --shapes: '{item}' is not HQ,HKV,B,CTX (four integers)")
        out.add((hq, hkv, b, ctx))
    return out


ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--budget", type=float, default=60.0, help="no new shape after this many seconds")
ap.add_argument("--max-kv-gib", type=float, default=100.0,
                help="skip shapes whose K+V exceed this (default 100, as gpu_decode_bench)")
ap.add_argument("--shapes", default="", help="only these shapes: 'HQ,HKV,B,CTX ...'")
args = ap.parse_args()
only = parse_shapes(args.shapes) if args.shapes else None
t0 = time.time()
res = []
l2 = torch.cuda.get_device_properties(0).L2_cache_size
flush = torch.randint(0, 1 << 30, ((3 * l2 + 3) // 4,), dtype=torch.int32, device="cuda")
chan = torch.arange(128, device="cuda", dtype=torch.float32)
for hq, hkv in [(32, 8), (64, 8)]:
    for batch in [1, 8, 32, 128]:
        for ctx in [1024, 2048, 4096, 16384, 32768, 65536, 131072]:
            kv_bytes = batch * hkv * ctx * 128 * 4
            if only is not None and (hq, hkv, batch, ctx) not in only:
                continue
            if kv_bytes > args.max_kv_gib * (1 << 30) or time.time() - t0 > args.budget:
                continue
            q = torch.randn(batch, hq, 1, 128, device="cuda", dtype=torch.float16)
            k = torch.randn(batch, hkv, ctx, 128, device="cuda", dtype=torch.float16)
            v = torch.randn_like(k)
            backend = "flash"
            def run():
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            try:
                run()
            except Exception:
                backend = "default"
                def run():
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                run()
            for _ in range(2):
                run()
            reps = 7 if kv_bytes > 20e9 else 25
            ts = []
            for i in range(reps):
                flush.sum()  # read 3x L2
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record(); run(); b.record(); b.synchronize()
                ts.append(a.elapsed_time(b) * 1e-3)
            ts.sort()
            if not torch.isfinite(run()).all():
                sys.exit(f"gpu_sdpa.py: non-finite output at hq{hq} b{batch} ctx{ctx}")
            k.copy_((0.8 * torch.sin(0.37 * chan + 0.3) + 0.1).half().expand_as(k))
            vp = (0.8 * torch.sin(0.37 * chan + 1.1) + 0.1).half()
            v.copy_(vp.expand_as(v))
            err = (run().float() - vp.float()).abs().max().item()
            if err > 4e-3 * vp.float().abs().max().item() + 1e-4:
                sys.exit(f"gpu_sdpa.py: closed-form output off by {err} at hq{hq} b{batch} ctx{ctx}")
            res.append(dict(hq=hq, hkv=hkv, batch=batch, ctx=ctx, time_s=ts[len(ts) // 2],
                            kv_bytes=kv_bytes, backend=backend, closed_form_max_err=err,
                            source=f"python torch {torch.__version__}"))
            del q, k, v
            torch.cuda.empty_cache()
tmp = f"{args.out}.tmp.{os.getpid()}"
with open(tmp, "w") as f:
    json.dump(res, f, indent=1)
os.replace(tmp, args.out)
print(f"sdpa (python): {len(res)} shapes in {time.time() - t0:.0f} s")
