#!/usr/bin/env python3
"""Writes data/tiles/sample.h5: a small SYNTHETIC kvarn-tiles v1 file (docs/hdf5-schema.md).

Stand-in until real captures exist. It imitates the statistics that matter for KV quantization:
  * keys: a few channels with large per-channel mean offsets (outlier channels, placed in the
    low-frequency RoPE pairs as in real models), per-channel scales spread over ~1 decade,
    low-rank token structure, RoPE applied over positions (rotate_half convention), and a
    first-token attention "sink" with a much larger norm;
  * values: smaller and close to isotropic (low-rank + noise, no outlier channels);
  * queries (2 of the 4 query heads) built like keys, post-RoPE; pre-RoPE keys for sequence 0.
Deterministic (fixed seed, no timestamps): rerunning reproduces the same arrays.

Usage: python3 data/make_sample_tiles.py [--out data/tiles/sample.h5]
"""
import argparse
import json
import os

import h5py
import numpy as np

SEED = 20240607
MODEL = "synthetic-gqa-8l-2kv-4q-d128"
# An 8-layer model of which two middle layers are captured, so methods that keep boundary layers
# at fp16 (TurboQuant: first and last two) really quantize the sample.
NUM_LAYERS, NUM_KV_HEADS, NUM_Q_HEADS, HEAD_DIM = 8, 2, 4, 128
CAPTURED_LAYERS = [2, 5]
ROPE_THETA = 10000.0
SEQ_TOKENS = [300, 200]
Q_HEADS = [0, 2]  # captured query heads (one per KV group)
VOCAB = 49152


def rope(x, theta):
    """x: [..., T, D] -> rotated over positions 0..T-1, pairs (i, i + D/2) (HF rotate_half)."""
    t, d = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [D/2]
    ang = np.arange(t, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def head_params(rng, d):
    """Per (layer, head) structure shared by all sequences, like fixed projection weights."""
    mean = rng.normal(0.0, 0.3, d)
    # Outlier channels: the lowest-frequency RoPE pairs (indices near D/2 - 1 and D - 1).
    for c in rng.choice(np.arange(d // 2 - 12, d // 2), size=3, replace=False):
        sign = rng.choice([-1.0, 1.0])
        mean[c] = sign * rng.uniform(6.0, 12.0)
        mean[c + d // 2] = -sign * rng.uniform(3.0, 8.0)
    scale = np.exp(rng.normal(0.0, 0.6, d))  # per-channel spread
    basis = rng.normal(0.0, 1.0, (16, d)) / 4.0  # low-rank token structure
    sink = rng.normal(0.0, 1.0, d) * 8.0 + 3.0 * mean  # large-norm first token
    return mean, scale, basis, sink


def keys_pre_rope(rng, params, t):
    mean, scale, basis, sink = params
    z = rng.normal(0.0, 1.0, (t, basis.shape[0]))
    k = mean + (z @ basis) * scale + rng.normal(0.0, 0.35, (t, mean.size)) * scale
    k[0] = sink
    return k


def values(rng, t, d):
    basis = rng.normal(0.0, 1.0, (8, d)) / 6.0
    v = rng.normal(0.0, 1.0, (t, 8)) @ basis + rng.normal(0.0, 0.25, (t, d))
    v[0] *= 0.2  # the sink token's value is small
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "tiles", "sample.h5"))
    args = ap.parse_args()

    rng = np.random.default_rng(SEED)
    L, H, D = len(CAPTURED_LAYERS), NUM_KV_HEADS, HEAD_DIM
    k_params = [[head_params(rng, D) for _ in range(H)] for _ in range(L)]
    q_params = [[head_params(rng, D) for _ in Q_HEADS] for _ in range(L)]

    provenance = {
        "tool": "data/make_sample_tiles.py",
        "version": 1,
        "git_commit": None,
        "created": None,  # omitted on purpose: the file is reproducible byte for byte
        "prompts": "none (synthetic random tokens)",
        "settings": {"seed": SEED, "seq_tokens": SEQ_TOKENS, "q_heads": Q_HEADS,
                     "rope_theta": ROPE_THETA, "rope": "rotate_half"},
    }
    tmp = args.out + ".tmp"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with h5py.File(tmp, "w", track_order=False) as f:
        f.attrs["format"] = "kvarn-tiles"
        f.attrs["format_version"] = np.int32(1)
        f.attrs["model"] = MODEL
        f.attrs["num_layers"] = np.int32(NUM_LAYERS)
        f.attrs["num_kv_heads"] = np.int32(NUM_KV_HEADS)
        f.attrs["num_q_heads"] = np.int32(NUM_Q_HEADS)
        f.attrs["head_dim"] = np.int32(HEAD_DIM)
        f.attrs["rope_theta"] = np.float64(ROPE_THETA)
        f.attrs["source"] = "synthetic (data/make_sample_tiles.py)"
        f.attrs["provenance"] = json.dumps(provenance, sort_keys=True)
        f.create_dataset("layers", data=np.array(CAPTURED_LAYERS, dtype=np.int32), track_times=False)
        seqs = f.create_group("sequences")
        for s, t in enumerate(SEQ_TOKENS):
            k_pre = np.stack([np.stack([keys_pre_rope(rng, k_params[l][h], t) for h in range(H)])
                              for l in range(L)])
            v = np.stack([np.stack([values(rng, t, D) for _ in range(H)]) for _ in range(L)])
            q_pre = np.stack([np.stack([keys_pre_rope(rng, q_params[l][i], t) * 0.5
                                        for i in range(len(Q_HEADS))]) for l in range(L)])
            g = seqs.create_group(f"{s:06d}")
            g.attrs["num_tokens"] = np.int32(t)
            g.attrs["prompt_id"] = f"synthetic-{s}"
            g.create_dataset("token_ids", data=rng.integers(0, VOCAB, t, dtype=np.int32),
                             track_times=False)
            chunks = (1, 1, min(t, 256), D)
            opts = dict(chunks=chunks, compression="gzip", compression_opts=4, shuffle=True,
                        track_times=False)
            dk = g.create_dataset("k", data=rope(k_pre, ROPE_THETA).astype(np.float16), **opts)
            dk.attrs["post_rope"] = np.int32(1)
            g.create_dataset("v", data=v.astype(np.float16), **opts)
            if s == 0:
                dp = g.create_dataset("k_pre_rope", data=k_pre.astype(np.float16), **opts)
                dp.attrs["post_rope"] = np.int32(0)
            dq = g.create_dataset("q", data=rope(q_pre, ROPE_THETA).astype(np.float16), **opts)
            dq.attrs["post_rope"] = np.int32(1)
            dq.attrs["heads"] = np.array(Q_HEADS, dtype=np.int32)
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
