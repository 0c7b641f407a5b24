"""The main comparison table (Markdown, HTML, LaTeX/booktabs) and the full metric listing."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .load import ACCUMULATION_SCOPES, MethodKey, RunData


@dataclass
class Column:
    header: str  # plain text
    latex: str  # LaTeX header
    metric: Optional[str]  # None: bits per element (EFFECTIVE / STEADY)
    better: str  # "min" or "max"
    kind: str  # "bits", "sci" or "frac"


EFFECTIVE, STEADY = "effective", "steady"
EFFECTIVE_COLUMN = Column("Eff. bits/el", r"Eff.\ bits\,$\downarrow$", None, "min", EFFECTIVE)
STEADY_COLUMN = Column("Steady bits/el", r"Steady bits", None, "none", STEADY)
# A run without effective bits: its steady-state bits stand in, labelled as such.
FALLBACK_COLUMN = Column("Bits/el (steady state)", r"Bits/el.\ (steady)\,$\downarrow$", None, "min", STEADY)

MAIN_COLUMNS = [
    Column("K NMSE", r"K NMSE\,$\downarrow$", "key.end_to_end.nmse", "min", "sci"),
    Column("V NMSE", r"V NMSE\,$\downarrow$", "value.end_to_end.nmse", "min", "sci"),
    # Headline: query rows that read at least one quantized token; the all-rows mean beside it.
    Column("Attn KL, quant. rows (nats)", r"Attn.\ KL (q.\ rows)\,$\downarrow$", "attention.headline.kl.mean",
           "min", "sci"),
    Column("Attn KL, all rows (nats)", r"Attn.\ KL (all)\,$\downarrow$", "attention.kl.mean", "min", "sci"),
    Column("Top-1 overlap", r"Top-1\,$\uparrow$", "attention.top1_overlap", "max", "frac"),
    Column("Output NMSE", r"Out.\ NMSE\,$\downarrow$", "attention.output_nmse", "min", "sci"),
]

# Error accumulation (docs/metrics.md §5), one table per model: a model's rows are never averaged
# with another model's.
ACCUMULATION_COLUMNS = [
    Column("MAE acc. final, quant. layers", r"MAE acc.\ (q.\ layers)\,$\downarrow$",
           "accumulation.mae_accumulated.final.headline", "min", "sci"),
    Column("MAE acc. (final)", r"MAE acc.\,$\downarrow$", "accumulation.mae_accumulated.final", "min", "sci"),
    Column("MAE static (final)", r"MAE static\,$\downarrow$", "accumulation.mae_static.final", "min", "sci"),
    Column("NMSE acc. (final)", r"NMSE acc.\,$\downarrow$", "accumulation.nmse_accumulated.final", "min", "sci"),
    Column("Decode KL, quant. steps", r"Decode KL (q.)\,$\downarrow$", "decode.kl.headline", "min", "sci"),
    Column("Decode KL (nats)", r"Decode KL\,$\downarrow$", "decode.kl.mean", "min", "sci"),
    Column("Top-1 agreement", r"Top-1\,$\uparrow$", "decode.top1_agreement", "max", "frac"),
    Column("1st divergence (step)", r"1st div.\,$\uparrow$", "decode.first_divergence", "max", "num"),
]

REFERENCE_FAMILIES = ("fp16",)


@dataclass
class Table:
    methods: List[MethodKey]
    columns: List[Column]
    values: List[List[float]]  # [method][column]
    bold: List[List[bool]]
    note: str


def bits_columns(run: RunData) -> List[Column]:
    return [EFFECTIVE_COLUMN, STEADY_COLUMN] if run.has_effective_bits() else [FALLBACK_COLUMN]


def _bits_value(run: RunData, k: MethodKey, c: Column, data: Optional[str] = None) -> float:
    return run.effective_bits(k, data) if c.kind == EFFECTIVE else run.bits(k, data)


def _best_flags(values: List[List[float]], methods: List[MethodKey], columns: List[Column]) -> List[List[bool]]:
    candidates = [i for i, m in enumerate(methods) if m.family not in REFERENCE_FAMILIES]
    if not candidates:
        candidates = list(range(len(methods)))
    flags = [[False] * len(columns) for _ in methods]
    for j, c in enumerate(columns):
        if c.better not in ("min", "max"):
            continue
        vals = [(i, values[i][j]) for i in candidates if not math.isnan(values[i][j])]
        if len(vals) < 2:
            continue
        best = min(v for _, v in vals) if c.better == "min" else max(v for _, v in vals)
        for i, v in vals:
            if v == best or abs(v - best) <= 1e-12 * max(abs(best), 1e-300):
                flags[i][j] = True
    return flags


def main_table(run: RunData) -> Table:
    cols = bits_columns(run) + [c for c in MAIN_COLUMNS
                                if any(not math.isnan(run.value(k, c.metric)) for k in run.methods)]
    values = []
    for k in run.methods:
        values.append([_bits_value(run, k, c) if c.metric is None else run.value(k, c.metric) for c in cols])
    flags = _best_flags(values, run.methods, cols)
    note = (_bits_note(run) + " Mean over layers, heads and cases; “quant. rows”: query rows that read at "
            "least one quantized token (the headline; rows reading only an fp16 sink or window dilute the "
            "all-rows mean). Arrows give the better direction; bold marks the best "
            "value among the compressed methods (FP16 is the uncompressed reference and is not ranked). "
            "“–” means the metric is undefined or was not measured for that method.")
    return Table(run.methods, cols, values, flags, note)


CI_METRIC = "decode.kl.mean"
CI_COLUMN = Column("Decode KL 95% CI", r"Decode KL 95\,\% CI", CI_METRIC, "none", "text")


def _ci_text(run: RunData, k: MethodKey, model: str) -> str:
    """Bootstrap 95 % CI over prompts of the model's decode KL ("" without per-prompt values;
    "n = 1" with one prompt)."""
    from . import stats

    vals = list(run.prompt_values(k, model, CI_METRIC).values())
    ci = stats.bootstrap_ci(vals)
    if ci is None:
        return f"n = {len(vals)}" if vals else ""
    return f"[{ci.lo:.2e}, {ci.hi:.2e}] (n = {ci.n})"


def _bits_note(run: RunData) -> str:
    if run.has_effective_bits():
        return ("Eff. bits: bits/element as stored at the measured length (fp16 sink, windows, boundary "
                "layers and metadata included); steady bits: the long-context limit.")
    return ("Bits/el: steady-state bits/element; this run records no effective bits (as stored at the "
            "measured length), so fp16 sinks, windows and boundary layers are not counted.")


def accumulation_tables(run: RunData) -> List[Tuple[str, Table]]:
    """[(model title, table)] of the error-accumulation summary, one per model (config order)."""
    out = []
    for name, head_dim in run.accumulation_models():
        grid = {(k, c.metric): run.value(k, c.metric, name) for k in run.methods for c in ACCUMULATION_COLUMNS}
        cols = [c for c in ACCUMULATION_COLUMNS if any(not math.isnan(grid[k, c.metric]) for k in run.methods)]
        methods = [k for k in run.methods if any(not math.isnan(grid[k, c.metric]) for c in cols)]
        if not cols or not methods:
            continue
        bcols = bits_columns(run)
        values = [[_bits_value(run, k, c, name) for c in bcols] + [grid[k, c.metric] for c in cols] for k in methods]
        cis = {k: _ci_text(run, k, name) for k in methods}
        cols = bcols + cols
        if any(cis.values()):
            cols.append(CI_COLUMN)
            for row, k in zip(values, methods):
                row.append(cis[k] or "–")
        note = (_bits_note(run) + " Model-level bits average the fp16 boundary layers over all layers. Last pseudo-decode block (final context) for MAE/NMSE, averaged over layers and prompts; "
                "decode columns are means over the teacher-forced (KL, top-1) and greedy free-running "
                "(first divergence; = decode steps when none) steps. “quant. layers” / “quant. steps”: only the "
                "layers / steps that read at least one quantized token (TurboQuant's fp16 boundary layers and "
                "FP16 read none). Bold: best compressed method.")
        if CI_COLUMN in cols:
            from . import stats

            note += (f" Decode KL 95% CI: percentile bootstrap over prompts ({stats.RESAMPLES} resamples, "
                     f"seed {stats.SEED}).")
        title = name + (f" (head_dim {head_dim})" if head_dim else "")
        out.append((title, Table(methods, cols, values, _best_flags(values, methods, cols), note)))
    return out


def accumulation_markdown(run: RunData) -> str:
    parts = []
    for title, t in accumulation_tables(run):
        parts += [f"### {title}", "", to_markdown(t), t.note, ""]
    return "\n".join(parts)


# ------------------------------------------------------------------ formatting


def fmt_plain(v, kind: str) -> str:
    if isinstance(v, str):  # a preformatted cell (confidence intervals)
        return v
    if math.isnan(v):
        return "–"
    if kind in ("bits", EFFECTIVE, STEADY):
        return f"{v:.2f}"
    if kind == "frac":
        return f"{v:.3f}"
    if kind == "num":
        return f"{v:.4g}"
    if v == 0:
        return "0"
    return f"{v:.2e}"


def fmt_html(v: float, kind: str) -> str:
    s = fmt_plain(v, kind)
    if kind == "sci" and "e" in s:
        mant, exp = s.split("e")
        return f"{mant}×10<sup>{int(exp)}</sup>"
    return html.escape(s)


def fmt_latex(v: float, kind: str) -> str:
    s = fmt_plain(v, kind)
    if s == "–":
        return "--"
    if kind == "sci" and "e" in s:
        mant, exp = s.split("e")
        return f"${mant}\\times10^{{{int(exp)}}}$"
    return s


def latex_escape(s: str) -> str:
    rep = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
           "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "×": r"$\times$",
           "–": "--"}
    return "".join(rep.get(ch, ch) for ch in s)


def _arrow(c: Column) -> str:
    return {"min": " ↓", "max": " ↑"}.get(c.better, "")


def to_markdown(t: Table) -> str:
    head = ["Method"] + [c.header + _arrow(c) for c in t.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":---"] + ["---:"] * len(t.columns)) + "|"]
    for i, m in enumerate(t.methods):
        cells = [m.label.replace("|", "\\|")]
        for j, c in enumerate(t.columns):
            s = fmt_plain(t.values[i][j], c.kind)
            cells.append(f"**{s}**" if t.bold[i][j] else s)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_html(t: Table) -> str:
    out = ['<table class="results">', "<thead><tr><th>Method</th>"]
    for c in t.columns:
        out.append(f"<th>{html.escape(c.header)}{_arrow(c)}</th>")
    out.append("</tr></thead><tbody>")
    for i, m in enumerate(t.methods):
        out.append(f"<tr><td class=\"m\">{html.escape(m.label)}</td>")
        for j, c in enumerate(t.columns):
            s = fmt_html(t.values[i][j], c.kind)
            out.append(f"<td><b>{s}</b></td>" if t.bold[i][j] else f"<td>{s}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "\n".join(out) + "\n"


def to_latex(t: Table, caption: str, label: str = "tab:kvarn-main") -> str:
    """A booktabs table (needs \\usepackage{booktabs})."""
    lines = [
        "% Generated by kvarn-report (reports/kvarn_report); needs \\usepackage{booktabs}.",
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        f"\\caption{{{latex_escape(caption)}}}",
        f"\\label{{{label}}}",
        "\\begin{tabular}{l" + "r" * len(t.columns) + "}",
        "\\toprule",
        "Method & " + " & ".join(c.latex for c in t.columns) + " \\\\",
        "\\midrule",
    ]
    prev_fam = None
    for i, m in enumerate(t.methods):
        if prev_fam is not None and m.family != prev_fam:
            lines.append("\\addlinespace")
        prev_fam = m.family
        cells = [latex_escape(m.label)]
        for j, c in enumerate(t.columns):
            s = fmt_latex(t.values[i][j], c.kind)
            if t.bold[i][j]:
                s = f"{{\\boldmath{s}}}" if s.startswith("$") else f"\\textbf{{{s}}}"
            cells.append(s)
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ all metrics (appendix)


def all_metrics(run: RunData):
    """(metrics, methods, values[metric][method]) for every metric in the summary; accumulation and
    decode metrics of a run with several models are listed per model ("metric [model]")."""
    models = [n for n, _ in run.accumulation_models()]
    names, vals = [], []
    for m in run.metrics():
        split = []
        if len(models) > 1 and any(r.metric == m and r.scope in ACCUMULATION_SCOPES for r in run.rows):
            split = [(f"{m} [{d}]", [run.value(k, m, d) for k in run.methods]) for d in models]
            split = [(n, v) for n, v in split if any(not math.isnan(x) for x in v)]
        # rows without a model name (older runs) stay pooled
        for n, v in split or [(m, [run.value(k, m) for k in run.methods])]:
            names.append(n)
            vals.append(v)
    return names, run.methods, vals


def _fmt_any(v: float) -> str:
    if math.isnan(v):
        return "–"
    if v == 0:
        return "0"
    if 1e-2 <= abs(v) < 1e4:
        return f"{v:.4g}"
    return f"{v:.2e}"


def all_metrics_markdown(run: RunData) -> str:
    metrics, methods, vals = all_metrics(run)
    if not metrics:
        return ""
    lines = ["| Metric | " + " | ".join(m.label for m in methods) + " |",
             "|:---|" + "|".join(["---:"] * len(methods)) + "|"]
    for mi, name in enumerate(metrics):
        lines.append(f"| `{name}` | " + " | ".join(_fmt_any(v) for v in vals[mi]) + " |")
    return "\n".join(lines) + "\n"


def all_metrics_html(run: RunData) -> str:
    metrics, methods, vals = all_metrics(run)
    if not metrics:
        return ""
    out = ['<table class="results small">', "<thead><tr><th>Metric</th>"]
    out += [f"<th>{html.escape(m.label)}</th>" for m in methods]
    out.append("</tr></thead><tbody>")
    for mi, name in enumerate(metrics):
        out.append(f"<tr><td class=\"m\"><code>{html.escape(name)}</code></td>"
                   + "".join(f"<td>{html.escape(_fmt_any(v))}</td>" for v in vals[mi]) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ ITL slope / break-even (GPU)


def itl_markdown(run: RunData) -> str:
    """ITL slope and break-even context vs FP16 per (method, batch, Hq, Hkv) from throughput.json,
    fitted by scripts/gpu_summary.py's itl_fits (one implementation); "" without GPU data."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "scripts", "gpu_summary.py")
    points = []
    for e in run.throughput:
        try:
            points.append(dict(method=str(e["method"]), batch=int(e["batch"]), hq=int(e["hq"]),
                               hkv=int(e["hkv"]), context=int(e["context"]), time_us=float(e["time_us"])))
        except (KeyError, TypeError, ValueError):
            continue
    if not points or not os.path.isfile(path):
        return ""
    spec = importlib.util.spec_from_file_location("kvarn_gpu_summary", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    num = lambda v, p: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    be = lambda c, why: f"{c:,.0f}" if c is not None else (why or "–")  # noqa: E731
    lines = ["| Method | Batch | Hq/Hkv | ITL slope (µs / 1k tok) | Intercept (µs) | R² | "
             "Break-even ctx (fit) | Break-even ctx (measured) |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|"]
    for f in mod.itl_fits(points):
        lines.append(f"| {f['method']} | {f['batch']} | {f['hq']}/{f['hkv']} | "
                     f"{num(f['itl_slope_us_per_1k_tokens'], 2)} | {num(f['intercept_us'], 1)} | "
                     f"{num(f['r2'], 4)} | {be(f['break_even_context_fit'], f['break_even_reason_fit'])} | "
                     f"{be(f['break_even_context_measured'], f['break_even_reason_measured'])} |")
    return "\n".join(lines) + "\n"
