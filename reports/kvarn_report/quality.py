"""Model-level quality (the `quality:` sweep section, docs/metrics.md "Model-level quality"):
how much worse the model is, per method, at equal effective bits.

Reads the `quality.*` summary rows (llama.cpp's statistics with bootstrap CIs over windows) and
the case records' per-window means (paired bootstrap between methods, stats.paired_bootstrap).
Draws "KLD vs effective bits", "KLD vs context position" per model with CI bands, and the
per-layer sensitivity bars; writes the llama.cpp-style table per model.  Everything is None /
empty when the run has no quality rows."""

from __future__ import annotations

import math
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import stats, style
from . import figures
from .figures import Figure
from .load import MethodKey, RunData

import matplotlib.pyplot as plt  # noqa: E402  (style selected the Agg backend)

HEADING = "How much worse is the model, per method, at equal effective bits"
# (metric suffix, column title, format)
COLUMNS = [
    ("kld.mean", "mean KLD", "{:.4g}"),
    ("kld.median", "median KLD", "{:.3g}"),
    ("kld.p90", "p90 KLD", "{:.3g}"),
    ("kld.p99", "p99 KLD", "{:.3g}"),
    ("kld.max", "max KLD", "{:.3g}"),
    ("ppl_ref", "PPL fp16", "{:.4g}"),
    ("ppl", "PPL", "{:.4g}"),
    ("ppl_ratio", "PPL ratio", "{:.5f}"),
    ("same_top1", "same top-1 %", "{:.2f}"),
]
POS = re.compile(r"^quality\.pos(\d+)-(\d+)\.kld\.mean$")


def has_quality(run: RunData) -> bool:
    return any(r.scope == "quality" for r in run.rows)


def models(run: RunData) -> List[str]:
    return list(dict.fromkeys(r.data for r in run.rows if r.scope == "quality"))


def _cell(run: RunData, k: MethodKey, model: str, metric: str) -> Tuple[float, float, float]:
    """(value, ci_lo, ci_hi) of one whole-model quality metric; NaN where absent."""
    def one(m: str) -> float:
        for r in run.rows:
            if (r.metric == m and r.data == model and r.layer < 0
                    and run.case_method.get(r.case_id) == k):
                return r.value
        return math.nan
    return one(metric), one(metric + ".ci_lo"), one(metric + ".ci_hi")


def _eff_bits(run: RunData, k: MethodKey, model: str) -> float:
    for r in run.rows:
        if r.scope == "quality" and r.data == model and run.case_method.get(r.case_id) == k:
            return r.eff_bits
    return math.nan


def _scope(run: RunData, k: MethodKey, model: str) -> str:
    """`quality.` (rows reading a quantized token) when the method has them, else all rows
    (the fp16 method reads no quantized token)."""
    v, _, _ = _cell(run, k, model, "quality.kld.mean")
    return "quality." if not math.isnan(v) else "quality.all_rows."


def _window_means(run: RunData, k: MethodKey, model: str) -> Dict[int, float]:
    for cid, case in run.cases.items():
        if run.case_method.get(cid) != k:
            continue
        for m in (case.get("quality") or {}).get("models", []):
            if m.get("model") != model or "stats" not in m:
                continue
            wm = m["stats"].get("window_means") or {}
            vals = wm.get("kld") or []
            if all(v is None for v in vals):  # no quantized row (fp16): all rows
                vals = (m["stats"].get("window_means_all_rows") or {}).get("kld") or []
            return {i: float(v) for i, v in enumerate(vals) if v is not None}
    return {}


def _methods(run: RunData, model: str) -> List[MethodKey]:
    out = [k for k in run.methods if not math.isnan(_cell(run, k, model, "quality.all_rows.kld.mean")[0])]
    return sorted(out, key=lambda k: (_eff_bits(run, k, model), k.label))


def _fmt(v: float, f: str) -> str:
    return "–" if v is None or math.isnan(v) else f.format(v)


def _fmt_ci(c: Tuple[float, float, float], f: str) -> str:
    v, lo, hi = c
    if math.isnan(v):
        return "–"
    if math.isnan(lo) or math.isnan(hi):
        return _fmt(v, f)
    return f"{_fmt(v, f)} [{_fmt(lo, f)}, {_fmt(hi, f)}]"


def _rival(run: RunData, k: MethodKey, model: str, ms: List[MethodKey]) -> str:
    """Paired bootstrap over windows of mean KLD against the method nearest in effective bits."""
    b = _eff_bits(run, k, model)
    others = [o for o in ms if o != k and o.family != "fp16" and not math.isnan(_eff_bits(run, o, model))]
    if k.family == "fp16" or not others or math.isnan(b):
        return "–"
    o = min(others, key=lambda o: (abs(_eff_bits(run, o, model) - b), o.label))
    p = stats.paired_bootstrap(_window_means(run, k, model), _window_means(run, o, model))
    if p.verdict.startswith("n < 2"):
        return f"vs {o.label}: untested (n < 2)"
    word = {"a lower": "lower", "b lower": "higher", "not significant": "not significantly different"}[p.verdict]
    return (f"vs {o.label} ({_eff_bits(run, o, model):.2f} b): {word}, "
            f"Δ {p.diff.mean:.3g} [{p.diff.lo:.3g}, {p.diff.hi:.3g}]")


def table_rows(run: RunData, model: str) -> Tuple[List[str], List[List[str]]]:
    head = ["method", "eff. bits"] + [c[1] for c in COLUMNS] + ["paired (mean KLD)"]
    body = []
    ms = _methods(run, model)
    for k in ms:
        sc = _scope(run, k, model)
        cells = [k.label + ("" if sc == "quality." else " (all rows)"), _fmt(_eff_bits(run, k, model), "{:.3f}")]
        for suffix, _, f in COLUMNS:
            cells.append(_fmt_ci(_cell(run, k, model, sc + suffix), f))
        cells.append(_rival(run, k, model, ms))
        body.append(cells)
    return head, body


def _note(run: RunData, model: str) -> str:
    q = run.resolved.get("quality") or {}
    win = next((m.get("window") for m in q.get("models", []) if m.get("name") == model), q.get("window"))
    n = None
    size = None
    for case in run.cases.values():
        for m in (case.get("quality") or {}).get("models", []):
            if m.get("model") == model and "windows" in m:
                n = m["windows"]
                size = (m.get("fp16_reference") or {}).get("bytes")
    return (f"{model}: {n} windows of {win} tokens, block {q.get('block')}, current token "
            f"{q.get('current_token')}; statistics over predictions that read at least one quantized "
            f"token (llama.cpp's definitions, pooled over tokens), 95 % bootstrap CIs over windows "
            f"({q.get('resamples')} resamples, seed {run.resolved.get('seed')}); effective bits at the "
            f"window length, model level (fp16 sink/windows and boundary layers included); "
            f"fp16 log-probs cached in the run directory: {size} bytes. Paired: bootstrap of the "
            f"per-window mean-KLD difference against the method nearest in effective bits.")


def markdown(run: RunData) -> str:
    if not has_quality(run):
        return ""
    out = []
    for model in models(run):
        head, body = table_rows(run, model)
        out += [f"### {model}", "", "| " + " | ".join(head) + " |",
                "|" + "|".join([":---"] + ["---:"] * (len(head) - 2) + [":---"]) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
        out += ["", _note(run, model), ""]
        lay = layer_markdown(run, model)
        if lay:
            out += [lay, ""]
    return "\n".join(out)


def html(run: RunData) -> str:
    import html as h
    if not has_quality(run):
        return ""
    out = []
    for model in models(run):
        head, body = table_rows(run, model)
        out.append(f"<h3>{h.escape(model)}</h3><table class=\"results small\"><tr>"
                   + "".join(f"<th>{h.escape(c)}</th>" for c in head) + "</tr>")
        for row in body:
            tds = [("<td class=\"m\">" if i in (0, len(row) - 1) else "<td>") + h.escape(c) + "</td>"
                   for i, c in enumerate(row)]
            out.append("<tr>" + "".join(tds) + "</tr>")
        out.append(f"</table><p>{h.escape(_note(run, model))}</p>")
    return "\n".join(out)


def _layer_values(run: RunData, k: MethodKey, model: str):
    vals: Dict[int, List[float]] = {}
    for r in run.rows:
        if r.data != model or r.layer < 0 or run.case_method.get(r.case_id) != k:
            continue
        for suffix, idx in (("", 0), (".ci_lo", 1), (".ci_hi", 2)):
            if r.metric == "quality.layer.kld.mean" + suffix:
                vals.setdefault(r.layer, [math.nan] * 3)[idx] = r.value
    return dict(sorted(vals.items()))


def layer_markdown(run: RunData, model: str) -> str:
    lines = []
    for k in _methods(run, model):
        v = _layer_values(run, k, model)
        if v:
            cells = ", ".join(f"L{l}: {_fmt_ci(tuple(x), '{:.3g}')}" for l, x in v.items())
            lines.append(f"Per-layer sensitivity, {k.label} on one layer at a time (mean KLD, all rows): {cells}")
    return "\n\n".join(lines)


def fig_bits(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    ms_all = models(run)
    if not ms_all:
        return None
    fig, axes = plt.subplots(1, len(ms_all), figsize=(5.2 * len(ms_all), 3.8), squeeze=False)
    for ax, model in zip(axes[0], ms_all):
        for k in _methods(run, model):
            if k.family == "fp16":
                continue
            b = _eff_bits(run, k, model)
            v, lo, hi = _cell(run, k, model, "quality.kld.mean")
            if math.isnan(v) or math.isnan(b):
                continue
            err = None if math.isnan(lo) else [[v - lo], [hi - v]]
            st = styles.get(k, {"color": "k", "marker": "o"})
            ax.errorbar([b], [v], yerr=err, fmt=st["marker"], color=st["color"], capsize=3, label=k.label)
        ax.set_yscale("log")
        ax.set_xlabel("effective bits / element at the window length (model level)")
        ax.set_ylabel("mean KLD vs fp16 (nats / token)")
        ax.set_title(model)
        ax.legend(fontsize=7)
    stem = "quality_kld_vs_bits"
    style.save(fig, out_dir, stem)
    return Figure(stem, "Model KLD against fp16 vs effective bits",
                  "Mean per-token KL divergence of the model's next-token distribution from the fp16 "
                  "run, quantizer in the loop, over predictions that read a quantized token; error bars: "
                  "95 % bootstrap CI over windows. Lower-left is better: at equal effective bits, the "
                  "lower point costs the model less.",
                  f"figures/{stem}.png", f"figures/{stem}.pdf", ms_all)


def fig_position(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    ms_all = models(run)
    if not ms_all:
        return None
    fig, axes = plt.subplots(1, len(ms_all), figsize=(5.2 * len(ms_all), 3.8), squeeze=False)
    drawn = False
    for ax, model in zip(axes[0], ms_all):
        for k in _methods(run, model):
            if k.family == "fp16":
                continue
            pts = []
            for r in run.rows:
                m = POS.match(r.metric)
                if m and r.data == model and run.case_method.get(r.case_id) == k:
                    lo_pos, hi_pos = int(m.group(1)), int(m.group(2))
                    ci = _cell(run, k, model, r.metric)
                    pts.append(((lo_pos + hi_pos) / 2, ci[0], ci[1], ci[2]))
            if not pts:
                continue
            pts.sort()
            x = np.array([p[0] for p in pts])
            y = np.array([p[1] for p in pts])
            lo = np.array([p[2] for p in pts])
            hi = np.array([p[3] for p in pts])
            st = styles.get(k, {"color": "k", "marker": "o"})
            ax.plot(x, y, marker=st["marker"], color=st["color"], label=k.label, ms=4)
            if not np.isnan(lo).all():
                ax.fill_between(x, lo, hi, color=st["color"], alpha=0.18, lw=0)
            drawn = True
        positive = all(v > 0 for ln in ax.get_lines() for v in ln.get_ydata())
        ax.set_yscale("log" if positive and ax.get_lines() else "linear")
        ax.set_xlabel("context position (bucket centre, tokens)")
        ax.set_ylabel("mean KLD vs fp16 (nats / token)")
        ax.set_title(model)
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None
    stem = "quality_kld_vs_position"
    style.save(fig, out_dir, stem)
    return Figure(stem, "KLD vs context position",
                  "Mean per-token KLD against fp16 per position bucket of the window (all predictions "
                  "of the bucket, fp16-only rows included: the first bucket holds KVarN's sink), bands: "
                  "95 % bootstrap CI over windows. A rising curve is error accumulating with context.",
                  f"figures/{stem}.png", f"figures/{stem}.pdf", ms_all)


def fig_layers(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    panels = [(model, k, _layer_values(run, k, model)) for model in models(run) for k in _methods(run, model)]
    panels = [p for p in panels if p[2]]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), squeeze=False)
    for ax, (model, k, v) in zip(axes[0], panels):
        layers = list(v)
        y = np.array([v[l][0] for l in layers])
        lo = np.array([v[l][1] for l in layers])
        hi = np.array([v[l][2] for l in layers])
        err = None if np.isnan(lo).any() else [y - lo, hi - y]
        ax.bar(layers, y, yerr=err, color=styles.get(k, {"color": "C0"})["color"], capsize=2)
        ax.set_xlabel("layer quantized (all others fp16)")
        ax.set_ylabel("mean KLD vs fp16")
        ax.set_title(f"{model}: {k.label}", fontsize=9)
        ax.set_xticks(layers)
    stem = "quality_per_layer"
    style.save(fig, out_dir, stem)
    return Figure(stem, "Per-layer sensitivity",
                  "Model KLD against fp16 with the method on one layer at a time (every other layer fp16), "
                  "over all predictions of the first windows; error bars: 95 % bootstrap CI over windows. "
                  "It shows where the error enters, and whether fp16 boundary layers are justified.",
                  f"figures/{stem}.png", f"figures/{stem}.pdf", [p[0] for p in panels])


def build_figures(run: RunData, out_dir: str) -> List[Figure]:
    """The quality figures, first in the report (they answer its first question)."""
    if not has_quality(run):
        return []
    return figures.build_all(run, out_dir, [fig_bits, fig_position, fig_layers])


def _quality_figs(figs: List[Figure]) -> List[Figure]:
    return [f for f in figs if f.id.startswith("quality_")]


def section_html(run: RunData, figs: List[Figure]) -> List[str]:
    """The report's first section (HTML lines); empty without quality rows."""
    import html as h
    if not has_quality(run):
        return []
    out = [f"<h2>{h.escape(HEADING)}</h2>"]
    for f in _quality_figs(figs)[:2]:
        out.append(f"<figure><img src=\"{h.escape(f.png)}\" alt=\"{h.escape(f.title)}\">"
                   f"<figcaption><b>{h.escape(f.title)}.</b> {h.escape(f.caption)}</figcaption></figure>")
    out.append(html(run))
    return out


def section_markdown(run: RunData, figs: List[Figure]) -> List[str]:
    """The report's first section (Markdown lines); empty without quality rows."""
    if not has_quality(run):
        return []
    out = [f"## {HEADING}", ""]
    for f in _quality_figs(figs)[:2]:
        out += [f"![{f.title}]({f.png})", "", f"**{f.title}.** {f.caption}", ""]
    return out + [markdown(run), ""]
