#!/usr/bin/env python3
"""PyTorch SDPA (flash backend, fp16, contiguous K/V, enable_gqa) decode anchor, same shapes as
bench/gpu_decode_bench.cu. Writes JSON: list of {hq, hkv, batch, ctx, time_s, backend}."""
import argparse, json, time
import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--budget", type=float, default=60.0)
args = ap.parse_args()
t0 = time.time()
res = []
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for hq, hkv in [(32, 8), (64, 8)]:
    for batch in [1, 8, 32, 128]:
        for ctx in [1024, 2048, 4096, 16384, 32768, 65536, 131072]:
            kv_bytes = batch * hkv * ctx * 128 * 4
            if kv_bytes > 40e9 or time.time() - t0 > args.budget:
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
                if kv_bytes < 200e6:
                    flush.fill_(i & 255)
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record(); run(); b.record(); b.synchronize()
                ts.append(a.elapsed_time(b) * 1e-3)
            ts.sort()
            res.append(dict(hq=hq, hkv=hkv, batch=batch, ctx=ctx, time_s=ts[len(ts) // 2],
                            kv_bytes=kv_bytes, backend=backend))
            del q, k, v
            torch.cuda.empty_cache()
json.dump(res, open(args.out, "w"), indent=1)
print(f"sdpa: {len(res)} shapes in {time.time() - t0:.0f} s")
