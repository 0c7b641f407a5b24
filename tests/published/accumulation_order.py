#!/usr/bin/env python3
"""How much the accumulation order of the published fp16 rotation matters, on real tiles.

Upstream rotates fp16 K/V by a dense fp16 GEMM (entries +-fp16(1/sqrt(D)), fp32 accumulation in
an order cuBLAS/torch choose) and stores fp16. kvarn-eval's default computes the
order-independent representative fp16_RNE(c * S) with S exact. This script counts, on every full
tile of the given tile files, how often three concrete fp32 accumulation orders give a different
fp16 element and a different KVarN code (the full tile pipeline of kvarn_published.py run on
each rotated tile):
  sequential  acc += c*h_ij*x_j for j = 0..D-1 in fp32 (the products are exact in fp32)
  pairwise    the FWHT butterflies on the products c*x_j in fp32 (a pairwise tree)
  torch       torch.matmul of fp16 tensors on the CPU (torch's own kernel and order)
and, for comparison, the exact-scale arithmetic (rotation=hadamard_exact):
  exact_scale fp32 FWHT of x, times fp32(1/sqrt(D)), rounded to fp16
A differing record means any differing byte (codes, scales, zero points).

Usage: accumulation_order.py [--bits K V] [--group G] TILES.h5 ...   (prints a markdown table)
"""
import argparse
import math
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvarn_published as kp  # noqa: E402

F32 = np.float32


def exact_rotation(x):
    """Exact representative (vectorized int64 version of kp.rotate_published)."""
    g, d = x.shape
    c_bits = int(kp.f16_bits(np.array([1.0 / math.sqrt(d)]))[0])
    c = kp.f16_value(np.array([c_bits], dtype=np.uint16))[0]
    s = x.astype(np.float64) @ kp.sylvester(d)  # exact
    # c * s in float64 is exact when it fits 53 bits; else fall back to the integer rounding.
    prod = s * float(c)
    exact = np.abs(s * 16777216.0) < 2.0 ** 42  # 11-bit c times < 2^42 stays below 2^53
    out = kp.f16_bits(np.zeros_like(prod, dtype=F32))
    # float64 -> fp16 in one rounding: via the integer routine where the float64 product is exact
    for idx in zip(*np.nonzero(~exact)):
        out[idx] = kp.fp16_bits_of_exact(int(s[idx] * 16777216.0) * ((c_bits & 0x3FF) | 0x400),
                                         ((c_bits >> 10) & 0x1F) - 25 - 24)
    # prod is exact here, and float64 -> float16 conversion in numpy rounds once (RNE).
    out[exact] = prod[exact].astype(np.float16).view(np.uint16)
    return kp.f16_value(out)


def sequential_fp32(x, c):
    g, d = x.shape
    h = kp.sylvester(d).astype(F32)
    cx = (x * F32(c)).astype(F32)  # exact: 11-bit times 11-bit significands
    acc = np.zeros((g, d), dtype=F32)
    for j in range(d):
        acc = acc + cx[:, j:j + 1] * h[j:j + 1, :]
    return kp.f16_value(kp.f16_bits(acc))


def pairwise_fp32(x, c):
    return kp.f16_value(kp.f16_bits(fwht_fp32((x * F32(c)).astype(F32))))


def fwht_fp32(y):
    d = y.shape[1]
    h = 1
    while h < d:
        y = y.reshape(y.shape[0], d // (2 * h), 2, h)
        a, b = y[:, :, 0, :].copy(), y[:, :, 1, :].copy()
        y[:, :, 0, :], y[:, :, 1, :] = a + b, a - b
        y = y.reshape(-1, d)
        h *= 2
    return y


def exact_scale_fp32(x, c):
    del c  # the exact 1/sqrt(D), not the fp16 entry
    s = F32(1.0 / math.sqrt(x.shape[1]))
    return kp.f16_value(kp.f16_bits(fwht_fp32(x.astype(F32)) * s))


def torch_fp16(x, c):
    import torch
    d = x.shape[1]
    hm = torch.tensor(kp.sylvester(d) * float(c), dtype=torch.float16)
    return torch.matmul(torch.tensor(x, dtype=torch.float16), hm).to(torch.float32).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tiles", nargs="+")
    ap.add_argument("--bits", nargs=2, type=int, default=[4, 2])
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    orders = {"sequential": sequential_fp32, "pairwise": pairwise_fp32, "torch": torch_fp16,
              "exact_scale": exact_scale_fp32}
    kb, vb = args.bits
    print("| tiles | D | order | fp16 elements differing | codes differing | records differing |")
    print("|---|---|---|---|---|---|")
    for path in args.tiles:
        # per order: elements, differing elements, codes, differing codes, differing records
        stats = {o: [0, 0, 0, 0, 0] for o in orders}
        ntiles, d = 0, 0
        with h5py.File(path, "r") as f:
            for seq in sorted(f["sequences"].keys()):
                k_all, v_all = f["sequences"][seq]["k"][...], f["sequences"][seq]["v"][...]
                layers, heads, tokens, d = k_all.shape
                c = kp.f16_value(kp.f16_bits(np.array([1.0 / math.sqrt(d)])))[0]
                for li in range(layers):
                    for hh in range(heads):
                        for t0 in range(0, tokens - args.group + 1, args.group):
                            ntiles += 1
                            x = [np.asarray(a[li, hh, t0:t0 + args.group, :], dtype=F32)
                                 for a in (k_all, v_all)]
                            ref = [exact_rotation(t) for t in x]
                            ref_rec = kp.record_of_rotated(ref[0], ref[1], kb, vb)
                            lay = code_bytes(d, args.group, kb, vb)
                            for o, fn in orders.items():
                                y = [fn(t, c) for t in x]
                                st = stats[o]
                                st[0] += sum(t.size for t in y)
                                de = sum(int(np.sum(kp.f16_bits(a) != kp.f16_bits(b)))
                                         for a, b in zip(y, ref))
                                st[1] += de
                                st[2] += 2 * args.group * d
                                if de == 0:
                                    continue
                                rec = kp.record_of_rotated(y[0], y[1], kb, vb)
                                st[3] += count_code_diffs(rec, ref_rec, lay, kb, vb)
                                st[4] += rec != ref_rec
        for o, (ne, de, nc, dc, nr) in stats.items():
            print(f"| {os.path.basename(path)} | {d} | {o} | {de} / {ne} ({100.0 * de / ne:.4f} %)"
                  f" | {dc} / {nc} ({100.0 * dc / nc:.4f} %) | {nr} / {ntiles} |")
    return 0


def code_bytes(d, g, kb, vb):
    """(K codes start, end), (V codes start, end) byte ranges of the record."""
    k_end = d * ((g + 8 // kb - 1) // (8 // kb))
    v_start = k_end + 2 * d + 2 * d + 2 * g
    v_end = v_start + g * ((d + 8 // vb - 1) // (8 // vb))
    return (0, k_end), (v_start, v_end)


def count_code_diffs(a, b, lay, kb, vb):
    """Number of differing codes between two records."""
    n = 0
    for (lo, hi), bits in zip(lay, (kb, vb)):
        xa = np.frombuffer(a[lo:hi], dtype=np.uint8)
        xb = np.frombuffer(b[lo:hi], dtype=np.uint8)
        for j in range(8 // bits):
            m = (1 << bits) - 1
            n += int(np.sum(((xa >> (bits * j)) & m) != ((xb >> (bits * j)) & m)))
    return n


if __name__ == "__main__":
    sys.exit(main())
