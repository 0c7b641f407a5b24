"""Comparisons at matched bit budget (docs/reports.md): pairs of methods whose effective bits
lie within ±0.15 bit of each other, and each method curve's error read off at common budgets by
linear interpolation between its measured points."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import stats
from .load import MethodKey, RunData

TOLERANCE = 0.15  # bits/element
BUDGET_STEP = 0.5  # common budgets: multiples of this inside at least two curves' ranges
REFERENCE_FAMILIES = ("fp16",)
# Spec keys that set the budget (bit widths, groups, windows, scale format): methods that differ
# only in these lie on one error-vs-bits curve.
BUDGET_KEYS = {"k", "v", "bits", "k_bits", "v_bits", "g", "group", "k_group", "v_group", "scales",
               "sink", "recent", "residual"}
# (headline metric, label, all-rows metric shown beside it or None). The headline covers the rows
# that read at least one quantized token (docs/metrics.md, "Position buckets"); runs without it
# fall back to the all-rows metric.
TILES_METRICS = [("attention.headline.kl.mean", "Attention KL, rows reading quantized tokens (nats)",
                  "attention.kl.mean"),
                 ("attention.kl.mean", "Attention KL (nats)", None)]
TILES_METRIC = TILES_METRICS[1][:2]
MODEL_METRICS = [("decode.kl.headline", "Decode KL, steps reading quantized tokens (nats)", "decode.kl.mean"),
                 ("decode.kl.mean", "Decode KL (nats)", None),
                 ("accumulation.mae_accumulated.final.headline", "MAE acc. (final block, quantized layers)",
                  "accumulation.mae_accumulated.final"),
                 ("accumulation.mae_accumulated.final", "MAE acc. (final)", None)]


@dataclass
class Point:
    key: MethodKey
    bits: float  # effective (or steady-state where the run has no effective bits)
    steady: float
    error: float
    prompts: Dict[str, float] = field(default_factory=dict)  # per-unit (prompt / slab) values
    ci: Optional[stats.Interval] = None
    all_rows: float = math.nan  # the all-rows value beside a headline metric


@dataclass
class Pair:
    a: Point
    b: Point
    test: Optional[stats.Paired]  # None without per-prompt values


def matched_pairs(points: Sequence[Point], tol: float = TOLERANCE) -> List[Pair]:
    """Every pair of compressed methods whose budgets differ by at most `tol` bits, the cheaper
    one first, in order of budget."""
    pts = sorted((p for p in points if p.key.family not in REFERENCE_FAMILIES and not math.isnan(p.bits)),
                 key=lambda p: (p.bits, p.key.label))
    out = []
    for i, a in enumerate(pts):
        for b in pts[i + 1:]:
            if b.bits - a.bits <= tol + 1e-9:
                test = stats.paired_bootstrap(a.prompts, b.prompts) if a.prompts and b.prompts else None
                out.append(Pair(a, b, test))
    return out


def curve_key(key: MethodKey) -> str:
    """The curve a method lies on: its family and the spec parameters that do not set the budget
    (rotation, iterations, boundary layers ...)."""
    spec = key.spec or key.method
    fam, _, params = spec.partition(":")
    rest = [kv for kv in params.split(",") if kv and kv.split("=", 1)[0] not in BUDGET_KEYS]
    return fam + (" " + ",".join(sorted(rest)) if rest else "")


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Linear interpolation of y at x between the measured points (sorted by x); NaN outside
    their range.  Several points at one x are averaged."""
    by_x: Dict[float, List[float]] = {}
    for a, b in zip(xs, ys):
        if not (math.isnan(a) or math.isnan(b)):
            by_x.setdefault(a, []).append(b)
    if not by_x:
        return math.nan
    px = sorted(by_x)
    py = [float(np.mean(by_x[a])) for a in px]
    if x < px[0] - 1e-9 or x > px[-1] + 1e-9:
        return math.nan
    return float(np.interp(x, px, py))


def curves(points: Sequence[Point]) -> Dict[str, List[Point]]:
    out: Dict[str, List[Point]] = {}
    for p in points:
        if p.key.family not in REFERENCE_FAMILIES and not (math.isnan(p.bits) or math.isnan(p.error)):
            out.setdefault(curve_key(p.key), []).append(p)
    return {k: sorted(v, key=lambda p: p.bits) for k, v in out.items()}


def common_budgets(cs: Dict[str, List[Point]], step: float = BUDGET_STEP) -> List[float]:
    """Multiples of `step` covered by at least two curves with two or more points."""
    ranges = [(v[0].bits, v[-1].bits) for v in cs.values() if len(v) >= 2]
    if len(ranges) < 2:
        return []
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    grid = np.arange(math.ceil(lo / step) * step, hi + 1e-9, step)
    return [float(x) for x in grid if sum(1 for a, b in ranges if a - 1e-9 <= x <= b + 1e-9) >= 2]


# ------------------------------------------------------------------ one section per data / model


@dataclass
class Section:
    title: str
    metric: str
    metric_label: str
    effective: bool  # False: the run has no effective bits, the steady-state bits stand in
    points: List[Point]
    all_rows_metric: Optional[str] = None
    unit: str = "prompts"

    @property
    def bits_label(self) -> str:
        return "eff. bits" if self.effective else "steady-state bits (no effective bits in this run)"


def _first_present(run: RunData, data: str, choices):
    for metric, label, beside in choices:
        if any(not math.isnan(run.value(k, metric, data)) for k in run.methods):
            return metric, label, beside
    return None


def tile_files(run: RunData) -> List[str]:
    """The tiles files of the run (data of the attention rows), in row order."""
    out: List[str] = []
    for r in run.rows:
        if r.scope == "attention" and r.data not in out:
            out.append(r.data)
    return out


def sections(run: RunData) -> List[Section]:
    """One section per tiles file (D differs between files: never pooled) and per model and
    model metric, each on its headline metric with the all-rows metric beside it."""
    out = []
    for data in tile_files(run):
        pick = _first_present(run, data, TILES_METRICS)
        if pick:
            out.append(_section(run, f"Tiles {data}", data, *pick, unit="(sequence, layer, KV head) slabs"))
    for name, head_dim in run.accumulation_models():
        title = name + (f" (head_dim {head_dim})" if head_dim else "")
        for group in (MODEL_METRICS[:2], MODEL_METRICS[2:]):
            pick = _first_present(run, name, group)
            if pick:
                out.append(_section(run, title, name, *pick))
    return [s for s in out if s.points]


def _section(run: RunData, title: str, data: Optional[str], metric: str, label: str,
             beside: Optional[str] = None, unit: str = "prompts") -> Section:
    pts, effective = [], True
    for k in run.methods:
        b, eff = run.budget(k, data)
        v = run.value(k, metric, data)
        if math.isnan(b) or math.isnan(v):
            continue
        effective = effective and eff
        units = run.unit_values(k, data, metric) if data else {}
        rec = run.interval(k, metric, data) if data else None
        ci = (stats.Interval(v, rec[0], rec[1], rec[2]) if rec is not None
              else stats.bootstrap_ci(list(units.values())))
        all_rows = run.value(k, beside, data) if beside else math.nan
        pts.append(Point(k, b, run.bits(k, data), v, units, ci, all_rows))
    return Section(title, metric, label, effective, pts, beside, unit)


# ------------------------------------------------------------------ rendering


def _f(v: float, d: int = 2) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.{d}f}"


def _e(v: float) -> str:
    return "–" if v is None or math.isnan(v) else ("0" if v == 0 else f"{v:.3g}")


def _with_ci(p: Point) -> str:
    beside = "" if math.isnan(p.all_rows) else f"; all rows {_e(p.all_rows)}"
    if p.ci is None:
        return _e(p.error) + (f" (n = {len(p.prompts)}{beside})" if p.prompts else (f" ({beside[2:]})" if beside else ""))
    return f"{_e(p.error)} [{_e(p.ci.lo)}, {_e(p.ci.hi)}]" + (f" ({beside[2:]})" if beside else "")


def _verdict(pr: Pair) -> str:
    t = pr.test
    if t is None:
        return "no per-unit data"
    if t.verdict == "a lower":
        return f"{pr.a.key.label} lower (significant)"
    if t.verdict == "b lower":
        return f"{pr.b.key.label} lower (significant)"
    return t.verdict


def pair_rows(sec: Section) -> Tuple[List[str], List[List[str]]]:
    head = ["Method A", "A eff. bits", "A steady bits", "Method B", "B eff. bits", "B steady bits",
            f"A {sec.metric_label} [95% CI]", f"B {sec.metric_label} [95% CI]", "A − B [95% CI]", "Ordering"]
    rows = []
    for pr in matched_pairs(sec.points):
        diff = "–"
        if pr.test is not None:
            d = pr.test.diff
            diff = _e(d.mean) + ("" if math.isnan(d.lo) else f" [{_e(d.lo)}, {_e(d.hi)}]")
        rows.append([pr.a.key.label, _f(pr.a.bits), _f(pr.a.steady), pr.b.key.label, _f(pr.b.bits),
                     _f(pr.b.steady), _with_ci(pr.a), _with_ci(pr.b), diff, _verdict(pr)])
    return head, rows


def not_significant(sec: Section) -> List[str]:
    """The matched pairs whose ordering the paired bootstrap does not support (or cannot test)."""
    out = []
    for pr in matched_pairs(sec.points):
        if pr.test is None or pr.test.verdict in ("not significant", "n < 2: untested"):
            why = "untested" if pr.test is None or pr.test.verdict.startswith("n <") else "CI of A − B includes 0"
            out.append(f"{pr.a.key.label} vs {pr.b.key.label} ({why})")
    return out


def significance_text(sec: Section) -> str:
    pairs = matched_pairs(sec.points)
    ns = not_significant(sec)
    if not pairs:
        return ""
    if not ns:
        return f"Every ordering of the {len(pairs)} matched pairs is significant (paired bootstrap, 95 %)."
    return (f"Not significant ({len(ns)} of {len(pairs)} matched pairs; read these orderings as ties): "
            + "; ".join(ns) + ".")


def interp_rows(sec: Section) -> Tuple[List[str], List[List[str]]]:
    cs = curves(sec.points)
    budgets = common_budgets(cs)
    names = [n for n, v in cs.items() if len(v) >= 2]
    if not budgets:
        return [], []
    head = ["Budget (bits)"] + names
    rows = [[_f(x)] + [_e(interpolate([p.bits for p in cs[n]], [p.error for p in cs[n]], x)) for n in names]
            for x in budgets]
    return head, rows


def curve_members(sec: Section) -> List[str]:
    return [f"{n}: " + "; ".join(f"{p.key.label} ({_f(p.bits)} eff., {_f(p.steady)} steady)" for p in v)
            for n, v in curves(sec.points).items() if len(v) >= 2]


def note(sec: Section) -> str:
    bits = ("effective bits/element (as stored at the measured length)" if sec.effective else
            "steady-state bits/element: this run records no effective bits")
    beside = (f" Beside each value: the same metric over all rows (`{sec.all_rows_metric}`), which rows "
              "reading only fp16 tokens dilute." if sec.all_rows_metric else "")
    return (f"Pairs of compressed methods within ±{TOLERANCE} bit of each other in {bits}; the metric is "
            f"{sec.metric_label} (`{sec.metric}`), lower is better.{beside} Intervals are percentile "
            f"bootstrap 95 % CIs over {sec.unit} (the engine's, seeded by the config seed, where the row "
            f"records one; else {stats.RESAMPLES} resamples, seed {stats.SEED}); the ordering is a paired "
            f"bootstrap over the {sec.unit} both methods share, significant when the interval of A − B "
            "excludes 0. “–” or “n = 1”: too few units for an interval.")


INTERP_NOTE = (f"Each curve (a family with fixed non-budget parameters) read off by linear interpolation "
               f"of the error between its measured points at budgets (multiples of {BUDGET_STEP} bit) that "
               "at least two curves span; “–” outside a curve's measured range.")


def _md(head: List[str], rows: List[List[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in head) + " |", "|" + "|".join([":---"] + ["---:"] * (len(head) - 1)) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _html(head: List[str], rows: List[List[str]], text_cols=(0,)) -> str:
    e = html.escape
    out = ['<table class="results small">', "<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(f'<td class="m">{e(c)}</td>' if i in text_cols else f"<td>{e(c)}</td>"
                             for i, c in enumerate(r)) + "</tr>" for r in rows]
    out.append("</tbody></table>")
    return "\n".join(out) + "\n"


def markdown(run: RunData) -> str:
    parts = []
    for sec in sections(run):
        parts += [f"### {sec.title}: {sec.metric_label}", ""]
        head, rows = pair_rows(sec)
        parts += [_md(head, rows) if rows else f"No two methods lie within ±{TOLERANCE} bit.", "", note(sec), ""]
        if significance_text(sec):
            parts += [significance_text(sec), ""]
        ih, ir = interp_rows(sec)
        if ir:
            parts += ["Interpolated at common budgets:", "", _md(ih, ir), INTERP_NOTE, ""]
            parts += [f"- {m}" for m in curve_members(sec)] + [""]
    return "\n".join(parts)


def to_html(run: RunData) -> str:
    e = html.escape
    parts = []
    for sec in sections(run):
        parts.append(f"<h3>{e(sec.title)}: {e(sec.metric_label)}</h3>")
        head, rows = pair_rows(sec)
        parts.append(_html(head, rows, (0, 3, 9)) if rows else f"<p>No two methods lie within ±{TOLERANCE} bit.</p>")
        parts.append(f"<p>{e(note(sec))}</p>")
        if significance_text(sec):
            parts.append(f"<p>{e(significance_text(sec))}</p>")
        ih, ir = interp_rows(sec)
        if ir:
            parts += ["<p>Interpolated at common budgets:</p>", _html(ih, ir), f"<p>{e(INTERP_NOTE)}</p><ul>"]
            parts += [f"<li>{e(m)}</li>" for m in curve_members(sec)] + ["</ul>"]
    return "\n".join(parts)
