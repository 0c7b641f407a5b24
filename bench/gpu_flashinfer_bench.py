#!/usr/bin/env python3
"""FlashInfer paged decode (fp16, page size 16, NHD layout) as a second FP16 decode anchor, same
shapes and memory cap as bench/gpu_decode_bench.cu and bench/sdpa_bench.cpp.

FlashInfer (PyPI flashinfer-python) compiles its kernels at first use (JIT, needs nvcc and ninja).
Both of its decode paths are measured: the CUDA-core decode kernel and the tensor-core path
(use_tensor_cores=True); time_s is the faster one (both kept in the JSON). Timing: each step is
captured into a CUDA graph and replayed (eager where capture fails), CUDA events, median of 25
repetitions (7 above 20 GB); before every repetition the L2 is flushed by reading a buffer of three
times its size. After timing the output must be finite and, over constant K rows and a V channel
pattern, equal that pattern (uniform attention); a shape that fails is left out with its reason.

Writes JSON: list of {hq, hkv, batch, ctx, time_s, kv_bytes, backend, source, ...}, the format of
scripts/gpu_sdpa.py, plus a "failed" list when something could not run.
usage: gpu_flashinfer_bench.py --out FILE [--budget S] [--max-kv-gib G] [--shapes 'HQ,HKV,B,CTX ...']
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch

D, PAGE = 128, 16


def parse_shapes(text):
    out = set()
    for item in text.split():
        try:
            hq, hkv, b, ctx = (int(x) for x in item.split(","))
        except ValueError:
            sys.exit(f"gpu_flashinfer_bench.py: --shapes: '{item}' is not HQ,HKV,B,CTX")
        out.add((hq, hkv, b, ctx))
    return out


def pattern(phase):
    x = torch.arange(D, device="cuda", dtype=torch.float32)
    return (0.8 * torch.sin(0.37 * x + phase) + 0.1).half()


class Flush:
    """Reads a buffer of three times the L2 (a write would leave dirty lines to write back)."""

    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.buf = torch.randint(0, 1 << 30, ((3 * l2 + 3) // 4,), dtype=torch.int32,
                                 device="cuda")

    def __call__(self):
        self.buf.sum()


def time_median(fn, reps, flush):
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        flush()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    ts.sort()
    return ts[len(ts) // 2]


def measure(flashinfer, shape, tensor_cores, flush):
    hq, hkv, batch, ctx = shape
    pages = (ctx + PAGE - 1) // PAGE
    kv = torch.randn(batch * pages, 2, PAGE, hkv, D, device="cuda", dtype=torch.float16)
    q = torch.randn(batch, hq, D, device="cuda", dtype=torch.float16)
    indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * pages
    indices = torch.arange(batch * pages, device="cuda", dtype=torch.int32)
    last = torch.full((batch,), ctx - (pages - 1) * PAGE, device="cuda", dtype=torch.int32)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    w.plan(indptr, indices, last, hq, hkv, D, PAGE, q_data_type=torch.float16,
           kv_data_type=torch.float16)
    out = torch.empty_like(q)

    def run():
        w.run(q, kv, out=out)
        return out

    run()
    torch.cuda.synchronize()
    reps = 7 if 4 * batch * hkv * ctx * D > 20e9 else 25
    graph, how = None, "graph"
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
    except Exception as e:  # noqa: BLE001 - eager timing instead
        graph, how = None, f"eager ({type(e).__name__})"
    t = time_median(graph.replay if graph else run, reps, flush)
    if not torch.isfinite(out).all():
        raise RuntimeError("non-finite output")
    kv[:, 0].copy_(pattern(0.3).expand(batch * pages, PAGE, hkv, D))
    vp = pattern(1.1)
    kv[:, 1].copy_(vp.expand(batch * pages, PAGE, hkv, D))
    err = (run().float() - vp.float()).abs().max().item()
    if err > 4e-3 * vp.float().abs().max().item() + 1e-4:
        raise RuntimeError(f"closed-form output off by {err}")
    del kv, ws
    return t, how, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=120.0, help="no new shape after S seconds")
    ap.add_argument("--max-kv-gib", type=float, default=100.0)
    ap.add_argument("--shapes", default="")
    args = ap.parse_args()
    only = parse_shapes(args.shapes) if args.shapes else None
    t0 = time.time()
    res, failed = [], []
    try:
        import flashinfer
        version = flashinfer.__version__
    except Exception as e:  # noqa: BLE001 - written down, not raised
        failed.append(dict(stage="import", error=f"{type(e).__name__}: {e}"))
        flashinfer, version = None, None
    flush = Flush()
    for hq, hkv in [(32, 8), (64, 8)]:
        for batch in [1, 8, 32, 128]:
            for ctx in [1024, 2048, 4096, 16384, 32768, 65536, 131072]:
                shape = (hq, hkv, batch, ctx)
                kv_bytes = batch * hkv * ctx * D * 4
                if flashinfer is None or (only is not None and shape not in only):
                    continue
                if kv_bytes > args.max_kv_gib * (1 << 30) or time.time() - t0 > args.budget:
                    continue
                entry = dict(hq=hq, hkv=hkv, batch=batch, ctx=ctx, kv_bytes=kv_bytes,
                             backend="flashinfer", page_size=PAGE,
                             source=f"flashinfer {version}, torch {torch.__version__}")
                for tc in (False, True):
                    key = "tensor_cores" if tc else "cuda_cores"
                    try:
                        t, how, err = measure(flashinfer, shape, tc, flush)
                        entry[f"time_{key}_s"], entry[f"timing_{key}"] = t, how
                        entry[f"closed_form_max_err_{key}"] = err
                    except Exception as e:  # noqa: BLE001 - one shape, one path
                        msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                        failed.append(dict(shape=list(shape), path=key, error=msg))
                        print(f"flashinfer {shape} {key}: {msg}", flush=True)
                        if len(failed) == 1:
                            traceback.print_exc()
                    torch.cuda.empty_cache()
                times = [entry[k] for k in ("time_cuda_cores_s", "time_tensor_cores_s") if k in entry]
                if times:
                    entry["time_s"] = min(times)
                    res.append(entry)
                    print(f"flashinfer hq{hq} b{batch} ctx{ctx}: {entry['time_s'] * 1e6:.1f} us",
                          flush=True)
    tmp = f"{args.out}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, args.out)
    if failed:
        with open(args.out + ".failed.json", "w") as f:
            json.dump(failed, f, indent=1)
    print(f"flashinfer: {len(res)} shapes, {len(failed)} failures in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
