"""Bootstrap confidence intervals over prompts and the paired bootstrap of method differences
(docs/metrics.md, "Confidence intervals").  numpy only; every resampling draws from one seeded
generator so the same run gives the same report."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np

SEED = 20260  # recorded in the report beside every interval
RESAMPLES = 4000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int


def bootstrap_ci(values: Sequence[float], seed: int = SEED, resamples: int = RESAMPLES,
                 level: float = LEVEL) -> Optional[Interval]:
    """Percentile bootstrap interval of the mean of `values`; None with fewer than two values."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return Interval(float(x.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1 - a)), int(x.size))


@dataclass(frozen=True)
class Paired:
    diff: Interval  # mean of a - b over the shared prompts
    verdict: str  # "a lower", "b lower", "not significant" or "n < 2: untested"


def paired_bootstrap(a: Dict[str, float], b: Dict[str, float], seed: int = SEED,
                     resamples: int = RESAMPLES, level: float = LEVEL) -> Paired:
    """Paired bootstrap of mean(a - b) over the prompts both have (same prompts resampled for
    both methods).  Significant when the interval excludes zero."""
    shared = sorted(set(a) & set(b))
    d = [a[p] - b[p] for p in shared if not (math.isnan(a[p]) or math.isnan(b[p]))]
    ci = bootstrap_ci(d, seed, resamples, level)
    if ci is None:
        mean = float(np.mean(d)) if d else math.nan
        return Paired(Interval(mean, math.nan, math.nan, len(d)), "n < 2: untested")
    if ci.lo > 0:
        verdict = "b lower"
    elif ci.hi < 0:
        verdict = "a lower"
    else:
        verdict = "not significant"
    return Paired(ci, verdict)
