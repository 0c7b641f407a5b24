"""A planted run directory for the matched-budget, bootstrap and heatmap tests: known effective
bits, per-prompt values with a planted difference and a null one, and two data parts' layer ×
query-head matrices."""

import json
import os

import h5py
import numpy as np

PROMPTS = [f"p{i:02d}" for i in range(20)]
BASE = np.linspace(0.01, 0.05, len(PROMPTS))  # prompt-to-prompt spread shared by every method
SIGN = np.array([1.0 if i % 2 == 0 else -1.0 for i in range(len(PROMPTS))])
# method -> (spec, family, effective bits, steady-state bits, per-prompt decode KL)
PLANTED = {
    "fp16": ("fp16", "fp16", 16.0, 16.0, np.zeros(len(PROMPTS))),
    "kivi_a": ("kivi:bits=2,group=64", "kivi", 3.0, 2.5, BASE * 2.0),
    "kvarn_a": ("kvarn:k=4,v=2,g=128", "kvarn", 3.1, 3.375, BASE),  # planted: half of kivi_a
    "kivi_b": ("kivi:bits=4,group=64", "kivi", 4.0, 4.5, BASE + 0.002 * SIGN),
    "kvarn_b": ("kvarn:k=4,v=4,g=128", "kvarn", 4.1, 4.375, BASE - 0.002 * SIGN),  # null: same mean
}
PARTS = {"fixture": ((8, 4), [0, 1, 2, 3]), "smollm2": ((6, 3), [0, 3, 6])}
# Tile units ((sequence, layer, KV head) slabs) of the headline attention KL: the same planted
# difference (kvarn_a = half of kivi_a) and null pair (kivi_b, kvarn_b) as the prompts.
UNITS = [f"s0/l{i // 2}/h{i % 2}" for i in range(16)]
UNIT_BASE = np.linspace(0.02, 0.1, len(UNITS))
UNIT_SIGN = np.array([1.0 if i % 2 == 0 else -1.0 for i in range(len(UNITS))])
UNIT_VALUES = {"fp16": np.zeros(len(UNITS)), "kivi_a": UNIT_BASE * 2.0, "kvarn_a": UNIT_BASE,
               "kivi_b": UNIT_BASE + 0.004 * UNIT_SIGN, "kvarn_b": UNIT_BASE - 0.004 * UNIT_SIGN}
HEADLINE = "attention.headline.kl.mean"


def planted_ci(method):
    """The interval the planted rows record for the headline (the engine's, not recomputed)."""
    m = float(UNIT_VALUES[method].mean())
    return 0.9 * m, 1.1 * m
MODEL = "m1"


def write_planted_run(run_dir, with_effective_bits=True):
    os.makedirs(os.path.join(run_dir, "cases"))
    os.makedirs(os.path.join(run_dir, "arrays"))
    with open(os.path.join(run_dir, "resolved.json"), "w") as f:
        json.dump({"name": "planted", "data": {"tiles": [{"name": n} for n in PARTS]},
                   "accumulation": {"models": [{"name": MODEL}]}}, f)
    with open(os.path.join(run_dir, "provenance.json"), "w") as f:
        json.dump({"git_commit": "abc", "git": {"run_time": {"commit": "abc", "dirty": False}},
                   "sets": ["output=/tmp/x"]}, f)
    rows = []
    for i, (method, (spec, fam, eff, steady, per_prompt)) in enumerate(PLANTED.items()):
        cid = f"c{i:03d}-{method}"
        base = dict(case_id=cid, method=method, spec=spec, family=fam, bits_per_element=steady,
                    layer="all", head="all")
        if with_effective_bits:
            base["effective_bits"] = eff
        kl = float(per_prompt.mean()) * 0.1
        head = float(UNIT_VALUES[method].mean())
        lo, hi = planted_ci(method)
        for part in PARTS:
            rows.append(dict(base, data=part, metric="attention.kl.mean", scope="attention", value=kl))
            rows.append(dict(base, data=part, metric=HEADLINE, scope="attention", value=head, ci_lo=lo, ci_hi=hi,
                             ci_units=len(UNITS)))
        units = {part: {HEADLINE: {u: float(v) for u, v in zip(UNITS, UNIT_VALUES[method])}} for part in PARTS}
        rows.append(dict(base, data=MODEL, metric="decode.kl.mean", scope="decode", value=float(per_prompt.mean())))
        prompts = [{"prompt_id": p, "summary": {"decode.kl.mean": float(v)}} for p, v in zip(PROMPTS, per_prompt)]
        with open(os.path.join(run_dir, "cases", cid + ".json"), "w") as f:
            json.dump({"case_id": cid, "units": units,
                       "accumulation": {"models": [{"model": MODEL, "prompts": prompts}]}}, f)
        with h5py.File(os.path.join(run_dir, "arrays", cid + ".h5"), "w") as f:
            for j, (part, (shape, q_heads)) in enumerate(PARTS.items()):
                g = f["/"] if j == 0 else f.create_group(part)
                ga = g.create_group("attention")
                ga["kl_layer_head"] = (kl + 1e-4) * (1 + np.arange(shape[0] * shape[1]).reshape(shape))
                ga.attrs["layers"] = np.arange(shape[0])
                ga.attrs["q_heads"] = np.array(q_heads)
    with open(os.path.join(run_dir, "summary.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return run_dir
