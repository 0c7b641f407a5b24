"""Paired bootstrap of two methods of a finished run on the units they share (docs/metrics.md,
"Confidence intervals"):

    python3 -m kvarn_report.paired RUN_DIR DATA METRIC SPEC_A SPEC_B

DATA is a tiles file stem (units: (sequence, layer, KV head) slabs from the case records'
`units`) or a model directory name (units: prompts); METRIC a summary metric
(attention.headline.kl.mean, key.end_to_end.nmse, decode.kl.mean, ...); SPEC_A / SPEC_B a method
name or canonical spec as in the summary.  Prints both values with their CIs and A − B with its
paired 95 % CI and verdict."""

from __future__ import annotations

import math
import sys
from typing import List, Optional

from . import stats
from .load import MethodKey, RunData, load_run


def find_method(run: RunData, name: str) -> MethodKey:
    for k in run.methods:
        if name in (k.method, k.spec, k.label):
            return k
    raise SystemExit(f"no method {name!r} in the run (have: {', '.join(k.spec or k.method for k in run.methods)})")


def describe(run: RunData, data: str, metric: str, a: str, b: str) -> str:
    ka, kb = find_method(run, a), find_method(run, b)
    lines = []
    ua, ub = run.unit_values(ka, data, metric), run.unit_values(kb, data, metric)
    for k, u in ((ka, ua), (kb, ub)):
        v = run.value(k, metric, data)
        rec = run.interval(k, metric, data)
        ci = (stats.Interval(v, rec[0], rec[1], rec[2]) if rec else stats.bootstrap_ci(list(u.values())))
        ci_txt = f"[{ci.lo:.4g}, {ci.hi:.4g}] over {ci.n} units" if ci else "no CI"
        lines.append(f"{k.spec or k.method}: {metric} = {v:.4g} {ci_txt}; eff. bits "
                     f"{run.effective_bits(k, data):.3f}")
    t = stats.paired_bootstrap(ua, ub)
    d = t.diff
    lines.append(f"A - B = {d.mean:.4g}" + ("" if math.isnan(d.lo) else f" [{d.lo:.4g}, {d.hi:.4g}]")
                 + f" over {d.n} shared units: {t.verdict} (seed {stats.SEED}, {stats.RESAMPLES} resamples)")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    print(describe(load_run(args[0]), *args[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
