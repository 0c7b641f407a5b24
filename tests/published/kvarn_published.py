#!/usr/bin/env python3
"""KVarN tile records by the published arithmetic, computed independently of the C++ code.

Emulates, with numpy only, one KVarN tile of the published implementation (kvarn-upstream.md
section 3) and writes the record bytes that tests/core/test_kvarn_published.cpp compares with
kvarn_encode_record:

  rotation  fp16 inputs times the dense fp16 matrix +-c, c = fp16(1/sqrt(D)), stored as fp16.
            Computed exactly: S = H x in float64 (a dense product of fp16 values; every partial
            sum is a multiple of 2^-24 below 2^49, so float64 is exact in any order), then c * S
            in Python integers and one round-to-nearest-even to fp16. This is the
            order-independent representative of upstream's fp16 GEMM (fp32 accumulation in an
            unspecified order).
  VarN      section 3.2: log-domain Sinkhorn, columns then rows, best imbalance kept, clamps
            [1e-3, 1e3] on std and [-0.3, 10] on log scales, in fp32. Upstream's torch reductions
            have no fixed order; here every std uses the project's documented canonical order
            (eight interleaved partial sums, tree ((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7)), two-pass
            unbiased std) and log/exp are evaluated by the documented double-precision
            polynomials, so that the result is one exact, reproducible value.
  RTN       section 3.3: per row lo = min, scale = max((hi - lo) / (2^b - 1), 1e-10),
            q = clamp(round_half_even((x - lo) / scale)); scale absorption; fp16 fields.
  record    section 3.4 layout: K codes [D, G/PACK] channel-major packed along tokens (low bits =
            even index), s_col_K, zp_K, s_row_K, V codes [G, D/PACK], s_col_V, s_row_V, zp_V;
            padded to 8 B (D <= 128) or to a power-of-two per-token slot (D > 128).

Usage:
  kvarn_published.py            write tests/golden/kvarn_published/{records.bin,manifest.json}
  kvarn_published.py --check    recompute and compare with the committed files (exit 1 on change)
"""
import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "golden", "kvarn_published")
F32 = np.float32

# Tiles: real D = 128 KV from the fixture model, and one synthetic D = 512 tile (the published
# head sizes whose 1/sqrt(D) is not a power of two).
CASES = [
    {"name": "fixture_s0_l0_h0_t0_k4v2_g128", "file": "data/tiles/fixture_heldout.h5",
     "seq": 0, "layer": 0, "head": 0, "first_token": 0, "k": 4, "v": 2, "g": 128},
    {"name": "fixture_s1_l3_h1_t256_k4v2_g128", "file": "data/tiles/fixture_heldout.h5",
     "seq": 1, "layer": 3, "head": 1, "first_token": 256, "k": 4, "v": 2, "g": 128},
    {"name": "fixture_s0_l2_h1_t128_k4v4_g128", "file": "data/tiles/fixture_heldout.h5",
     "seq": 0, "layer": 2, "head": 1, "first_token": 128, "k": 4, "v": 4, "g": 128},
    {"name": "fixture_s1_l1_h0_t64_k4v2_g64", "file": "data/tiles/fixture_heldout.h5",
     "seq": 1, "layer": 1, "head": 0, "first_token": 64, "k": 4, "v": 2, "g": 64},
    {"name": "synthetic_d512_k4v2_g128", "synthetic": {"seed": 512, "d": 512},
     "k": 4, "v": 2, "g": 128},
]


# ---- fp16 ----------------------------------------------------------------------------------

def fp16_bits_of_exact(num, exp):
    """fp16 bits (RNE, overflow to inf) of the exact value num * 2^exp (num a Python int)."""
    sign = 0x8000 if num < 0 else 0
    a = -num if num < 0 else num
    if a == 0:
        return sign
    top = a.bit_length() - 1 + exp  # floor(log2 |value|)
    ulp_exp = max(top, -14) - 10  # fp16 spacing at that magnitude (subnormals: 2^-24)
    sh = ulp_exp - exp
    if sh <= 0:
        q = a << -sh
    else:
        q, rem = a >> sh, a & ((1 << sh) - 1)
        half = 1 << (sh - 1)
        if rem > half or (rem == half and (q & 1)):
            q += 1
    value = q * 2.0 ** ulp_exp  # exact in float64
    if value > 65504.0:  # rounded past the largest fp16
        return sign | 0x7C00
    return sign | int(np.array([value], dtype=np.float16).view(np.uint16)[0])


def f16_bits(x):
    """RNE fp16 bits of float32 values (numpy's conversion rounds to nearest even)."""
    return np.asarray(x, dtype=F32).astype(np.float16).view(np.uint16)


def f16_value(bits):
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(F32)


# ---- rotation ------------------------------------------------------------------------------

def sylvester(d):
    i = np.arange(d)
    parity = np.vectorize(lambda v: bin(v).count("1") & 1)(np.bitwise_and.outer(i, i))
    return np.where(parity == 1, -1.0, 1.0)


def rotate_published(rows):
    """rows [G, D] fp16 values -> fp16 values of (fp16 rows) @ (+-fp16(1/sqrt(D)))."""
    g, d = rows.shape
    c_bits = int(f16_bits(np.array([1.0 / math.sqrt(d)]))[0])
    c_mant = (c_bits & 0x3FF) | 0x400
    c_exp = ((c_bits >> 10) & 0x1F) - 25
    x = f16_value(f16_bits(rows)).astype(np.float64)
    s = x @ sylvester(d)  # exact (see module docstring); H is symmetric
    out = np.empty((g, d), dtype=np.uint16)
    for idx, v in np.ndenumerate(s):
        s24 = int(v * 16777216.0)  # exact integer
        assert s24 == v * 16777216.0
        out[idx] = fp16_bits_of_exact(s24 * c_mant, c_exp - 24)
    if np.any((out & 0x7C00) == 0x7C00):
        raise ValueError("rotated value beyond the fp16 range")
    return f16_value(out)


# ---- canonical fp32 statistics and portable log/exp -----------------------------------------

def combine8(p):
    """p [..., 8] float32 -> ((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7))."""
    return ((p[..., 0] + p[..., 4]) + (p[..., 2] + p[..., 6])) + \
           ((p[..., 1] + p[..., 5]) + (p[..., 3] + p[..., 7]))


def lane_sums(x):
    """Sums along the last axis (length a multiple of 8): lane i % 8, sequential in i."""
    n = x.shape[-1]
    p = np.zeros(x.shape[:-1] + (8,), dtype=F32)
    for k in range(n // 8):
        p = p + x[..., 8 * k:8 * k + 8]
    return combine8(p)


def canonical_std(x):
    """Unbiased two-pass std of every row of x (float32), canonical order."""
    n = x.shape[-1]
    mean = lane_sums(x) / F32(n)
    dev = x - mean[..., None]
    return np.sqrt(lane_sums(dev * dev) / F32(n - 1)).astype(F32)


def bits_double(u):
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def double_bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def portable_log(x):
    """ln of a positive float32, by the documented double polynomial (2 atanh series)."""
    ln2, sqrt_half = 0.69314718055994530942, 0.70710678118654752440
    d = float(x)
    u = double_bits(d)
    e = ((u >> 52) & 0x7FF) - 1023
    m = bits_double((u & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)
    if m > 2.0 * sqrt_half:
        m *= 0.5
        e += 1
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = 1.0 / 25.0
    for k in (23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3):
        p = p * s2 + 1.0 / k
    p = p * s2 + 1.0
    return F32(float(e) * ln2 + 2.0 * s * p)


def portable_exp(x):
    """e^x of a float32 by the documented double polynomial (Cody-Waite reduction, 13 terms)."""
    ln2_hi, ln2_lo = 0.693147180369123816490, 1.90821492927058770002e-10
    inv_ln2, shift = 1.44269504088896338700, 6755399441055744.0
    d = float(x)
    kf = d * inv_ln2
    kf = (kf + shift) - shift
    k = int(kf)
    r = (d - kf * ln2_hi) - kf * ln2_lo
    p = 1.0 / 6227020800.0
    for f in (479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0,
              24.0, 6.0):
        p = p * r + 1.0 / f
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    return F32(p * bits_double((k + 1023) << 52))


# ---- VarN (section 3.2) ----------------------------------------------------------------------

STD_MIN, STD_MAX, LOG_MIN, LOG_MAX, FLOOR = F32(1e-3), F32(1e3), F32(-0.3), F32(10.0), F32(1e-8)


def ratio(s):
    return F32(np.max(s) / max(np.min(s), FLOOR))


def update(log_s, stds):
    out_log = np.empty_like(log_s)
    out = np.empty_like(log_s)
    for i, (ls, sd) in enumerate(zip(log_s, stds)):
        lg = portable_log(min(max(sd, STD_MIN), STD_MAX))
        out_log[i] = min(max(F32(ls + lg), LOG_MIN), LOG_MAX)
        out[i] = portable_exp(out_log[i])
    return out_log, out


def varn(t, iters=8):
    """t [R, C] float32 -> (balanced, s_row [R], s_col [C])."""
    r, c = t.shape
    log_sc, log_sr = np.zeros(c, F32), np.zeros(r, F32)
    sc, sr = np.ones(c, F32), np.ones(r, F32)
    best_sc, best_sr = sc.copy(), sr.copy()
    col_std = canonical_std(t.T)
    best = F32(ratio(col_std) + ratio(canonical_std(t)))
    for _ in range(iters):
        log_sc, sc = update(log_sc, col_std)
        a = (t / sc[None, :]).astype(F32)
        row_std = canonical_std((a / sr[:, None]).astype(F32))
        log_sr, sr = update(log_sr, row_std)
        cur = (a / sr[:, None]).astype(F32)
        row_std, col_std = canonical_std(cur), canonical_std(cur.T)
        imb = F32(ratio(col_std) + ratio(row_std))
        if imb <= best:
            best, best_sc, best_sr = imb, sc.copy(), sr.copy()
    balanced = ((t / best_sc[None, :]).astype(F32) / best_sr[:, None]).astype(F32)
    return balanced, best_sr, best_sc


# ---- RTN, absorption, packing, record (sections 3.3, 3.4) ------------------------------------

def rtn(x, bits):
    qmax = F32((1 << bits) - 1)
    rows = x.shape[0]
    # First index among equal extremes (the sign of a zero minimum reaches the zero point).
    lo = x[np.arange(rows), np.argmin(x, axis=1)]
    hi = x[np.arange(rows), np.argmax(x, axis=1)]
    scale = np.maximum(((hi - lo) / qmax).astype(F32), F32(1e-10)).astype(F32)
    y = ((x - lo[:, None]) / scale[:, None]).astype(F32)
    y = np.minimum(np.maximum(y, F32(0)), qmax)
    return np.rint(y).astype(np.uint8), scale, lo  # rint: ties to even


def pack(codes, bits):
    """codes [rows, n] -> [rows, ceil(n / (8 // bits))] bytes, index j at bits * (j % pf)."""
    pf = 8 // bits
    rows, n = codes.shape
    nb = (n + pf - 1) // pf
    out = np.zeros((rows, nb), dtype=np.uint32)
    for j in range(n):
        out[:, j // pf] |= codes[:, j].astype(np.uint32) << (bits * (j % pf))
    return out.astype(np.uint8)


def layout(d, g, kb, vb):
    pk, pv = 8 // kb, 8 // vb
    k_codes = d * ((g + pk - 1) // pk)
    v_codes = g * ((d + pv - 1) // pv)
    end = k_codes + 2 * d + 2 * d + 2 * g + v_codes + 2 * d + 2 * g + 2 * g
    if d <= 128:
        aligned = (end + 7) // 8 * 8
    else:
        slot = 1
        while slot < (end + g - 1) // g:
            slot <<= 1
        aligned = slot * g
    return end, aligned


def record(k_rows, v_rows, kb, vb):
    """k_rows, v_rows [G, D] fp16 values -> record bytes."""
    return record_of_rotated(rotate_published(k_rows), rotate_published(v_rows), kb, vb)


def record_of_rotated(kr, vr, kb, vb):
    """Record bytes of rotated fp16 tiles kr, vr [G, D]."""
    g, d = kr.shape
    # K oriented [D, G] (rows = channels), V [G, D] (rows = tokens).
    kbal, k_s_chan, k_s_tok = varn(np.ascontiguousarray(kr.T))
    vbal, v_s_tok, v_s_chan = varn(vr)
    kq, k_scale, k_lo = rtn(kbal, kb)
    vq, v_scale, v_lo = rtn(vbal, vb)
    parts = [
        pack(kq, kb).tobytes(),
        f16_bits(k_s_chan * k_scale).tobytes(),  # s_col_K
        f16_bits(k_s_chan * k_lo).tobytes(),     # zp_K
        f16_bits(k_s_tok).tobytes(),             # s_row_K
        pack(vq, vb).tobytes(),
        f16_bits(v_s_chan).tobytes(),            # s_col_V
        f16_bits(v_s_tok * v_scale).tobytes(),   # s_row_V
        f16_bits(v_s_tok * v_lo).tobytes(),      # zp_V
    ]
    rec = b"".join(parts)
    end, aligned = layout(d, g, kb, vb)
    assert len(rec) == end, (len(rec), end)
    return rec + bytes(aligned - end)


# ---- inputs ----------------------------------------------------------------------------------

def splitmix64(state):
    """One step of SplitMix64: (new state, output)."""
    mask = (1 << 64) - 1
    state = (state + 0x9E3779B97F4A7C15) & mask
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return state, z ^ (z >> 31)


def synthetic_tile(seed, g, d):
    """Non-zero fp16 rows [G, D] from SplitMix64 (the C++ test generates the same values):
    u = next output, i = (u >> 40) % 4001 - 2000 (row-major, K first, then V);
    K[t][c] = i * 2^-9 * (16 if c % 37 == 0 else 1)   (outlier channels), exact in fp16;
    V[t][c] = fp16(i * 2^-11 * (1 + t % 4))           (token scales)."""
    state, k, v = seed, np.empty((g, d), F32), np.empty((g, d), F32)
    for arr, is_key in ((k, True), (v, False)):
        for t in range(g):
            for c in range(d):
                state, u = splitmix64(state)
                i = (u >> 40) % 4001 - 2000
                if is_key:
                    arr[t, c] = F32(i * 2.0 ** -9 * (16 if c % 37 == 0 else 1))
                else:
                    arr[t, c] = F32(i * 2.0 ** -11 * (1 + t % 4))
    return f16_value(f16_bits(k)), f16_value(f16_bits(v))


def case_inputs(case):
    g = case["g"]
    if "synthetic" in case:
        return synthetic_tile(case["synthetic"]["seed"], g, case["synthetic"]["d"])
    import h5py  # only needed for the real tiles
    with h5py.File(os.path.join(ROOT, case["file"]), "r") as f:
        seq = sorted(f["sequences"].keys())[case["seq"]]
        t0 = case["first_token"]
        k = f["sequences"][seq]["k"][case["layer"], case["head"], t0:t0 + g, :]
        v = f["sequences"][seq]["v"][case["layer"], case["head"], t0:t0 + g, :]
    return np.asarray(k, dtype=F32), np.asarray(v, dtype=F32)


def compute():
    manifest, blob = [], bytearray()
    for case in CASES:
        k, v = case_inputs(case)
        rec = record(k, v, case["k"], case["v"])
        entry = dict(case)
        entry.update({"head_dim": int(k.shape[1]), "offset": len(blob), "bytes": len(rec),
                      "sha256": hashlib.sha256(rec).hexdigest()})
        blob += rec
        manifest.append(entry)
    return {"format": "kvarn-published-records", "version": 1, "cases": manifest}, bytes(blob)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed files instead of writing them")
    args = ap.parse_args()
    manifest, blob = compute()
    text = json.dumps(manifest, indent=1) + "\n"
    mpath, bpath = os.path.join(OUT, "manifest.json"), os.path.join(OUT, "records.bin")
    if args.check:
        with open(mpath) as f:
            same_m = f.read() == text
        with open(bpath, "rb") as f:
            same_b = f.read() == blob
        if not (same_m and same_b):
            print(f"error: {OUT}: the script no longer reproduces the committed records "
                  f"(manifest {'same' if same_m else 'differs'}, bytes "
                  f"{'same' if same_b else 'differ'})", file=sys.stderr)
            return 1
        print(f"ok: {len(manifest['cases'])} records reproduced")
        return 0
    os.makedirs(OUT, exist_ok=True)
    for path, data, mode in ((bpath, blob, "wb"), (mpath, text, "w")):
        tmp = path + ".tmp"
        with open(tmp, mode) as f:
            f.write(data)
        os.replace(tmp, path)
    print(f"wrote {bpath} ({len(blob)} bytes) and {mpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
