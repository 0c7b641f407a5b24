"""The report's figures.  Each builder returns a `Figure` or None (with a note) when its data
is absent, so any subset of the run directory still produces a report."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import style
from .load import MethodKey, RunData

import matplotlib.pyplot as plt  # noqa: E402  (style selected the Agg backend)
from matplotlib.colors import LogNorm  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

STAGES = [
    ("rotation", "Rotation"),
    ("quant_normalized", "Quantization\n(normalized domain)"),
    ("quant_rotated", "Quantization\n(rotated domain)"),
    ("end_to_end", "End to end"),
]
KL = "attention.kl.mean"
OUT_NMSE = "attention.output_nmse"


@dataclass
class Figure:
    id: str
    title: str
    caption: str
    png: str  # path relative to the report directory
    pdf: str
    panels: List[str] = field(default_factory=list)  # titles of per-model panels, if any


def stage_metric(run: RunData, stream: str, stage: str) -> Optional[str]:
    cands = [f"{stream}.stage.{stage}.nmse"]
    if stage == "end_to_end":
        cands = [f"{stream}.end_to_end.nmse", f"{stream}.stage.end_to_end.nmse"]
    for c in cands:
        if run.has_metric(c):
            return c
    return None


def _positive_range(vals: Sequence[float]) -> Optional[Tuple[float, float]]:
    pos = [v for v in vals if v is not None and not math.isnan(v) and v > 0]
    if not pos:
        return None
    return min(pos), max(pos)


def _log_limits(lo: float, hi: float) -> Tuple[float, float]:
    return 10 ** (math.floor(math.log10(lo)) - 0.3), 10 ** (math.ceil(math.log10(hi)) + 0.15)


MAX_LABELLED = 8  # with more methods, only Pareto-optimal points get a text label


def _legend_below(fig, handles, labels, ncol: int) -> None:
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False, bbox_to_anchor=(0.5, -0.01))


def _legend_auto(fig, last_ax, handles, labels) -> None:
    """Legend below the panels for a few entries, in columns right of the last panel for many;
    also runs the final tight_layout."""
    if len(labels) <= 8:
        _legend_below(fig, handles, labels, ncol=min(len(labels), 7))
        fig.tight_layout(rect=(0, 0.08 + 0.04 * ((len(labels) - 1) // 7), 1, 1))
    else:
        ncol = 1 if len(labels) <= 18 else 2
        last_ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                       ncol=ncol, fontsize=8)
        fig.tight_layout()


_OFFSETS = [(7, 0, "left", "center"), (-7, 0, "right", "center"), (7, 5, "left", "bottom"), (7, -5, "left", "top"), (-7, 5, "right", "bottom"), (-7, -5, "right", "top"),
            (7, 16, "left", "bottom"), (7, -16, "left", "top"), (-7, 16, "right", "bottom"),
            (-7, -16, "right", "top"), (0, 10, "center", "bottom"), (0, -10, "center", "top"),
            (14, 28, "left", "bottom"), (14, -28, "left", "top"), (-14, 28, "right", "bottom"),
            (-14, -28, "right", "top")]


def place_labels(fig, ax, xy: List[Tuple[float, float]], labels: List[str], fontsize: float = 8,
                 marker_pt: float = 4.5, avoid: Sequence[Tuple[float, float]] = ()) -> None:
    """Greedy non-overlapping point labels: for each point, the first candidate offset whose text
    stays inside the axes and overlaps neither earlier labels nor any marker (else the least bad).
    Call after the layout is final (tight_layout), since overlap is judged in display space."""
    renderer = fig.canvas.get_renderer()
    scale = fig.dpi / 72.0
    pts_disp = [ax.transData.transform(p) for p in xy]
    r = marker_pt * scale
    obstacles = [(x - r, y - r, x + r, y + r) for x, y in pts_disp]
    obstacles += [(x - r, y - r, x + r, y + r) for x, y in (ax.transData.transform(p) for p in avoid)]
    for line in ax.get_lines():  # keep labels off drawn lines (Pareto fronts, guides)
        path = line.get_transform().transform(np.column_stack(line.get_data()).astype(float)) \
            if len(line.get_xdata()) else np.zeros((0, 2))
        if line.get_drawstyle() == "steps-post" and len(path) > 1:
            st = [path[0]]
            for a, b in zip(path[:-1], path[1:]):
                st += [(b[0], a[1]), b]
            path = np.array(st)
        for a, b in zip(path[:-1], path[1:]):
            n = int(max(abs(b[0] - a[0]), abs(b[1] - a[1])) // (3 * scale)) + 1
            for t in np.linspace(0, 1, n + 1):
                px, py = a[0] + (b[0] - a[0]) * t, a[1] + (b[1] - a[1]) * t
                obstacles.append((px - 1.5, py - 1.5, px + 1.5, py + 1.5))
    axbox = ax.get_window_extent(renderer)
    placed = []

    def overlap(a, b):
        w = min(a[2], b[2]) - max(a[0], b[0])
        h = min(a[3], b[3]) - max(a[1], b[1])
        return w * h if (w > 0 and h > 0) else 0.0

    # label the crowded points first so that they get the best slots
    def crowd(i):
        return -sum(1 for j in range(len(xy)) if j != i and
                    abs(pts_disp[i][0] - pts_disp[j][0]) + abs(pts_disp[i][1] - pts_disp[j][1]) < 60 * scale)

    for i in sorted(range(len(xy)), key=lambda i: (crowd(i), i)):
        best = None
        grow = max(1.0, (marker_pt + 2.5) / 7.0)
        for dx0, dy, ha, va in _OFFSETS:
            dx = dx0 * grow
            t = ax.annotate(labels[i], xy[i], xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                            fontsize=fontsize, color="0.12")
            bb = t.get_window_extent(renderer)
            box = (bb.x0 - 1, bb.y0 - 1, bb.x1 + 1, bb.y1 + 1)
            cost = sum(overlap(box, o) for o in placed) + sum(overlap(box, o) for o in obstacles)
            outside = (max(0, axbox.x0 - box[0]) + max(0, box[2] - axbox.x1) +
                       max(0, axbox.y0 - box[1]) + max(0, box[3] - axbox.y1))
            cost += outside * 50
            t.remove()
            if best is None or cost < best[0] - 1e-9:
                best = (cost, dx, dy, ha, va, box)
            if cost == 0:
                break
        _, dx, dy, ha, va, box = best
        if abs(dy) > 12 or abs(dx) > 8 * grow:  # far from its point: a thin leader line keeps it attached
            ax.annotate(labels[i], xy[i], xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                        fontsize=fontsize, color="0.12",
                        arrowprops=dict(arrowstyle="-", color="0.55", linewidth=0.6, shrinkA=0, shrinkB=4))
        else:
            ax.annotate(labels[i], xy[i], xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                        fontsize=fontsize, color="0.12")
        placed.append(box)


# ------------------------------------------------------------------ 1. per-stage error


def fig_stage_errors(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    streams = [("key", "Keys"), ("value", "Values")]
    table: Dict[str, Dict[str, Dict[MethodKey, float]]] = {}
    stages_present = []
    for stage, _ in STAGES:
        per_stream = {}
        for stream, _ in streams:
            m = stage_metric(run, stream, stage)
            if m:
                per_stream[stream] = {k: run.value(k, m) for k in run.methods}
        if per_stream:
            table[stage] = per_stream
            stages_present.append(stage)
    if not stages_present:
        run.notes.append("Figure 'per-stage error' skipped: no *.stage.*.nmse or *.end_to_end.nmse metrics.")
        return None
    methods = run.methods
    streams = [(s_, t_) for s_, t_ in streams if any(s_ in table[st] for st in stages_present)]
    allv = [v for st in table.values() for s in st.values() for v in s.values()]
    rng = _positive_range(allv)
    ylim = None
    if rng:
        lo, hi = _log_limits(*rng)
        # Round-off-level values (e.g. 1e-14 for a rotation) would squash the quantization errors:
        # keep at most ~7 decades and print smaller values as numbers at the bottom of the axis.
        if hi / lo > 1e8:
            lo = 10 ** math.floor(math.log10(hi / 1e7))
        ylim = (lo, hi)
    fig, axes = plt.subplots(1, len(streams), figsize=(6 * len(streams), 4.8), sharey=True, squeeze=False)
    axes = axes[0]
    n = len(methods)
    width = 0.8 / max(n, 1)
    clipped_any = False
    for ax, (stream, title) in zip(axes, streams):
        x = np.arange(len(stages_present))
        for i, k in enumerate(methods):
            xs, ys, small = [], [], []
            for j, stage in enumerate(stages_present):
                v = table[stage].get(stream, {}).get(k, math.nan)
                xpos = x[j] - 0.4 + width * (i + 0.5)
                if math.isnan(v):
                    continue
                if ylim is None or v < ylim[0]:
                    small.append((xpos, v))
                else:
                    xs.append(xpos)
                    ys.append(v)
            st = styles[k]
            ax.bar(xs, ys, width=width * 0.92, color=st["color"], edgecolor="white", linewidth=0.4 if n < 12 else 0.1)
            if ylim:
                for xp, v in small:  # zero or below the axis: print the value instead of a bar
                    txt = "0" if v <= 0 else f"{v:.0e}".replace("e-0", "e-")
                    clipped_any = clipped_any or v > 0
                    ax.text(xp, ylim[0] * 1.3, txt, ha="center", va="bottom", fontsize=7, color=st["color"],
                            fontweight="bold", rotation=90)
        ax.set_xticks(x)
        ax.set_xticklabels([dict(STAGES)[s] for s in stages_present])
        ax.set_title(f"{title}: error introduced by each stage")
        if ylim:
            ax.set_yscale("log")
            ax.set_ylim(*ylim)
        ax.grid(axis="x", visible=False)
    axes[0].set_ylabel("NMSE  ‖x̂ − x‖² / ‖x‖²  (log scale)")
    from matplotlib.patches import Patch

    h = [Patch(facecolor=styles[k]["color"], label=k.label) for k in methods]
    l = [k.label for k in methods]
    ncol = min(len(l), 6 if len(streams) > 1 else 3)
    _legend_below(fig, h, l, ncol=ncol)
    fig.tight_layout(rect=(0, 0.08 + 0.045 * ((len(l) - 1) // ncol), 1, 1))
    style.save(fig, out_dir, "stage_errors")
    return Figure(
        "stage_errors",
        "Per-stage error by method",
        "Normalized mean squared error (NMSE, ‖x̂−x‖²/‖x‖², dimensionless, log scale) introduced by each "
        "stage of the pipeline, keys left and values right. “Rotation” is the round-off of the "
        "orthogonal transform alone, “normalized domain” and “rotated domain” are the quantization "
        "errors measured where the quantizer works, and “end to end” compares the reconstructed "
        "cache with the original. Lower is better; a stage a method does not have has no bar. Values "
        "too small for the axis (round-off, or exactly “0”) are printed as numbers at its bottom "
        "instead of a bar.",
        "figures/stage_errors.png",
        "figures/stage_errors.pdf",
    )


# ------------------------------------------------------------------ 2. KL vs bits Pareto


def pareto_min(points: List[Tuple[float, float]]) -> List[int]:
    """Indices of points on the lower-left front (fewer bits and lower error)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    best = math.inf
    front = []
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


BITS_AXIS = {
    True: "Effective bits per element, as stored\n(K+V, fp16 windows and metadata incl.; log scale)",
    False: "Steady-state bits per element\n(no effective bits in this run; log scale)",
}


def fig_kl_pareto(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    panels = [(KL, "Attention KL divergence (nats, log scale)", "Attention KL vs. storage")]
    if run.has_metric(OUT_NMSE):
        panels.append((OUT_NMSE, "Attention output NMSE (log scale)", "Attention output error vs. storage"))
    if not run.has_metric(KL):
        run.notes.append(f"Figure 'attention KL vs bits' skipped: no '{KL}' metric in the summary.")
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 5.0), squeeze=False)
    pending = []
    effective = all(run.budget(k)[1] for k in run.methods if not math.isnan(run.budget(k)[0]))
    for ax, (metric, ylabel, title) in zip(axes[0], panels):
        pts, keys = [], []
        for k in run.methods:
            b, v = run.budget(k)[0], run.value(k, metric)
            if not (math.isnan(b) or math.isnan(v)) and b > 0:
                pts.append((b, v))
                keys.append(k)
        rng = _positive_range([p[1] for p in pts])
        if not pts or not rng:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
            continue
        lo, hi = _log_limits(*rng)
        floor = lo * 1.6
        drawn = [(b, v if v > 0 else floor) for b, v in pts]
        front = pareto_min(pts)
        fx = [drawn[i][0] for i in front]
        fy = [drawn[i][1] for i in front]
        ax.plot(fx, fy, drawstyle="steps-post", color="0.35", linestyle="--", linewidth=1.2,
                label="Pareto front", zorder=1)
        for i, k in enumerate(keys):
            st = styles[k]
            ax.scatter([drawn[i][0]], [drawn[i][1]], s=70, color=st["color"], marker=st["marker"],
                       edgecolor="black" if i in front else "none", linewidth=0.8, zorder=3, label=k.label)
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        bx = [p[0] for p in pts]
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(bx) / 1.25, max(bx) * 1.6)
        ticks = [t for t in (1, 1.5, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32) if min(bx) / 1.25 <= t <= max(bx) * 1.6]
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(BITS_AXIS[effective])
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        show = range(len(keys)) if len(keys) <= MAX_LABELLED else sorted(front)
        pending.append((ax, drawn, [drawn[i] for i in show],
                        [keys[i].label + (" (= 0)" if pts[i][1] <= 0 else "") for i in show]))
    h, l = axes[0][0].get_legend_handles_labels()
    _legend_auto(fig, axes[0][-1], h, l)
    for ax, every, drawn, labels in pending:
        place_labels(fig, ax, drawn, labels, avoid=every)
    style.save(fig, out_dir, "kl_pareto")
    extra = " The right panel shows the error of the attention output in the same way." if len(panels) > 1 else ""
    return Figure(
        "kl_pareto",
        "Attention KL against bits per element",
        "Each point is one method: x is its storage per cached element (keys and values together, "
        + ("as stored at the measured length: fp16 sink, windows and boundary layers, scales, zero points "
           "and other metadata included" if effective else
           "steady state: this run records no effective bits, so fp16 sinks and windows are not counted")
        + "), y the mean KL divergence "
        "between the FP16 attention distribution and the one computed from the quantized cache (nats, "
        "log scale). Down and to the left is better; the dashed step line is the Pareto front and "
        "methods on it are outlined in black. A method with exactly zero divergence (the FP16 "
        "reference) is drawn at the bottom of the axis and labelled “(= 0)”." + extra
        + (f" With more than {MAX_LABELLED} methods only the Pareto-optimal points carry a text label; "
           "the legend names the others." if len(run.methods) > MAX_LABELLED else ""),
        "figures/kl_pareto.png",
        "figures/kl_pareto.pdf",
    )


# ------------------------------------------------------------------ 3. context length


def _method_series(run: RunData, x_name: str, y_names: Sequence[str]):
    out = []
    for k in run.methods:
        x = run.method_array(k, x_name)
        ys = [run.method_array(k, y) for y in y_names]
        if x is None or all(y is None for y in ys):
            continue
        x = np.ravel(x)
        ys = [None if y is None or np.ravel(y).shape != x.shape else np.ravel(y) for y in ys]
        out.append((k, x, ys))
    return out


def _model_panels(run: RunData, x_name: str, y_names: Sequence[str]):
    """[(panel title, series)]: one panel per model of the accumulation block (its arrays under
    `accumulation_models/<name>/`), in config order; a run without per-model groups gives one
    untitled panel of the root arrays.  Models without any of the arrays get no panel."""
    panels = []
    for name, head_dim in run.accumulation_models():
        pre = f"accumulation_models/{name}/"
        series = _method_series(run, pre + x_name, [pre + y for y in y_names])
        if series:
            panels.append((name + (f" (head_dim {head_dim})" if head_dim else ""), series))
    if not panels:
        series = _method_series(run, x_name, y_names)
        if series:
            panels.append(("", series))
    return panels


def _panel_grid(n: int, height: float):
    fig, axes = plt.subplots(n, 1, figsize=(8.5, height * n), squeeze=False)
    return fig, [row[0] for row in axes]


def _panel_note(panels) -> str:
    titles = [t for t, _ in panels if t]
    return f" One panel per model: {'; '.join(titles)}." if titles else ""


def fig_context(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    panels = _model_panels(run, "accumulation/context_len", ["accumulation/mae_static", "accumulation/mae_accumulated"])
    if not panels:
        run.notes.append("Figure 'error vs context length' skipped: no accumulation/context_len with "
                         "accumulation/mae_static or mae_accumulated arrays in arrays/*.h5.")
        return None
    fig, axes = _panel_grid(len(panels), 5.0 if len(panels) == 1 else 4.2)
    drawn = {}  # method -> its series over all panels (for the "(= 0)" legend label)
    # Runs with accumulation.static_replay false have no static side: draw and describe it only when present.
    has_static = any(ys is not None for _, series in panels for _, _, (ys, _) in series)
    for ax, (title, series) in zip(axes, panels):
        allx, ally = [], []
        for k, x, (ys, ya) in series:
            st = styles[k]
            drawn.setdefault(k, []).extend(y for y in (ys, ya) if y is not None)
            for y, ls in ((ys, "-"), (ya, "--")):
                if y is None:
                    continue
                m = np.isfinite(y) & (y > 0)
                ax.plot(x[m], y[m], linestyle=ls, color=st["color"], marker=st["marker"], markersize=4, linewidth=1.5)
                allx += list(x[m])
                ally += list(y[m])
        if ally:
            ax.set_yscale("log")
        if allx and max(allx) / max(min(allx), 1) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xlabel("Context length (tokens)")
        ax.set_ylabel("Attention output MAE vs. FP16 (log scale)")
        ax.set_title(title or ("Error against context length: static vs. accumulated quantization" if has_static
                               else "Error against context length: accumulated quantization"))

    def lab(k, ys):
        vals = np.concatenate([y[np.isfinite(y)] for y in ys] or [np.zeros(0)])
        return k.label + (" (= 0, not drawn)" if vals.size and not np.any(vals > 0) else "")

    mh = [Line2D([], [], color=styles[k]["color"], marker=styles[k]["marker"], label=lab(k, ys))
          for k, ys in sorted(drawn.items(), key=lambda kv: run.methods.index(kv[0]))]
    sh = ([Line2D([], [], color="0.3", linestyle="-", label="static (quantized once)")] if has_static else []) + \
        [Line2D([], [], color="0.3", linestyle="--", label="accumulated (pseudo-decode)")]
    leg = axes[0].legend(handles=mh, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="Method")
    axes[0].add_artist(leg)
    axes[-1].legend(handles=sh, loc="lower left", bbox_to_anchor=(1.01, 0.0), frameon=False, title="Line style")
    fig.tight_layout()
    style.save(fig, out_dir, "context_error")
    return Figure(
        "context_error",
        "Error against context length (pseudo-decode)",
        "Mean absolute error of the attention output against the FP16 reference as the context grows "
        "(x: tokens in the cache, log₂ scale when it spans a wide range; y: log scale). " +
        ("Solid lines quantize the whole context at once (static); dashed lines append tokens one chunk "
         "at a time as a decoder would, so the error that the streaming cache accumulates shows as the "
         "gap between a method's two lines. " if has_static else
         "Dashed lines append tokens one chunk at a time as a decoder would (accumulated); this run "
         "left out the static replay (accumulation.static_replay: false). ") +
        "Lower is better." + _panel_note(panels),
        "figures/context_error.png",
        "figures/context_error.pdf",
        [t for t, _ in panels if t],
    )


# ------------------------------------------------------------------ 4. decode step


def _smooth(y: np.ndarray, w: int) -> np.ndarray:
    if w <= 1 or len(y) < w:
        return y
    k = np.ones(w) / w
    pad = np.concatenate([np.full(w // 2, y[0]), y, np.full(w - 1 - w // 2, y[-1])])
    return np.convolve(pad, k, mode="valid")


def fig_decode(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    panels = [(t, [(k, x, ys) for k, x, ys in s if ys[0] is not None])
              for t, s in _model_panels(run, "decode/step", ["decode/kl"])]
    panels = [(t, s) for t, s in panels if s]
    if not panels:
        run.notes.append("Figure 'KL vs decode step' skipped: no decode/step and decode/kl arrays in arrays/*.h5.")
        return None
    fig, axes = _panel_grid(len(panels), 4.8 if len(panels) == 1 else 4.0)
    smoothed = False
    for ax, (title, series) in zip(axes, panels):
        for k, x, (y,) in series:
            st = styles[k]
            y = np.where(np.isfinite(y), y, np.nan)
            if not np.any(y > 0):  # exactly zero (the FP16 reference): nothing to draw on a log axis
                ax.plot([], [], color=st["color"], linewidth=1.6, label=k.label + " (= 0, not drawn)")
                continue
            w = max(1, len(y) // 60) if len(y) > 200 else 1
            if w > 1:
                smoothed = True
                ax.plot(x, y, color=st["color"], alpha=0.18, linewidth=0.6)
            ax.plot(x, _smooth(np.nan_to_num(y, nan=0.0), w), color=st["color"], linewidth=1.6, label=k.label)
        if any(np.any(y[0] > 0) for _, _, y in series):
            ax.set_yscale("log")
        ax.set_xlabel("Decode step (generated tokens)")
        ax.set_ylabel("Next-token KL(FP16 ‖ method) (nats, log scale)")
        ax.set_title(title or "Divergence from the FP16 reference during decoding")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="Method")
    fig.tight_layout()
    style.save(fig, out_dir, "decode_kl")
    return Figure(
        "decode_kl",
        "Divergence against decode step",
        "KL divergence between the next-token distributions of the model with the FP16 cache and "
        "with the quantized cache at each decode step (nats, log scale), teacher-forced on the FP16 "
        "run's greedy tokens after the pseudo-decoded context, so the quantized cache keeps growing "
        "(docs/metrics.md §5). A curve that rises with the step shows error building up over a long "
        "generation; lower is better."
        + (" Long series are shown as a moving average (bold) over the raw values (faint)." if smoothed else "")
        + _panel_note(panels),
        "figures/decode_kl.png",
        "figures/decode_kl.pdf",
        [t for t, _ in panels if t],
    )


# ------------------------------------------------------------------ 5. layer x head heatmaps


HEATMAP = "attention/kl_layer_head"


def heatmap_parts(run: RunData) -> List[Tuple[str, str]]:
    """(data name, array prefix) of every data part with a layer × query-head KL matrix: the first
    tiles file's at the root of arrays/*.h5, the others in a group named after the file."""
    tiles = (run.resolved.get("data") or {}).get("tiles") if isinstance(run.resolved.get("data"), dict) else None
    first = str(tiles[0].get("name")) if tiles and isinstance(tiles[0], dict) and tiles[0].get("name") else ""
    prefixes = set()
    for c in sorted(run.case_method):
        for name in run.arrays(c) or {}:
            if name.endswith(HEATMAP) and not name.startswith("accumulation_models/"):
                prefixes.add(name[: -len(HEATMAP)])
    return [(first if p == "" else p.rstrip("/"), p) for p in sorted(prefixes, key=lambda p: (p != "", p))]


def _heatmap_panels(run: RunData):
    """[(data part, method, matrix, layer labels, query-head labels)], from the arrays of every
    data part, else from the per-layer/head summary rows of every data; and the source."""
    panels = []
    parts = heatmap_parts(run)
    for part, pre in parts:
        for k in run.methods:
            m = run.method_array(k, pre + HEATMAP)
            if m is None or m.ndim != 2:
                continue
            layers = run.method_array(k, pre + "attention@layers")
            qh = run.method_array(k, pre + "attention@q_heads")
            panels.append((part, k, m, layers, qh))
    if panels:
        return panels, "arrays/*.h5 (attention/kl_layer_head of every data part)"
    datas = sorted({r.data for r in run.rows if r.metric == KL and r.layer >= 0 and r.head >= 0})
    for d in datas:
        for k in run.methods:
            m = run.layer_head(k, KL, d if len(datas) > 1 else None)
            if m is not None:
                panels.append((d if len(datas) > 1 else "", k, m, None, None))
    return panels, "per-layer/head summary rows"


def _ticks(ax, labels, n: int, axis: str) -> None:
    step = max(1, n // (8 if axis == "x" else 10))
    idx = list(range(0, n, step))
    set_ticks, set_labels = (ax.set_xticks, ax.set_xticklabels) if axis == "x" else (ax.set_yticks, ax.set_yticklabels)
    set_ticks(idx)
    if labels is not None and np.ravel(labels).size == n:
        set_labels([f"{int(v)}" for v in np.ravel(labels)[idx]])


def fig_heatmaps(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    panels, src = _heatmap_panels(run)
    shown, skipped_zero = [], []
    for part, k, m, layers, qh in panels:
        if np.any(np.isfinite(m) & (m > 0)):
            shown.append((part, k, m, layers, qh))
        else:
            skipped_zero.append(k.label + (f" ({part})" if part else ""))
    if not shown:
        run.notes.append("Figure 'per-layer × head KL heatmaps' skipped: no attention/kl_layer_head arrays "
                         f"and no per-layer/head '{KL}' rows with a nonzero value.")
        return None
    allv = np.concatenate([m[np.isfinite(m) & (m > 0)] for _, _, m, _, _ in shown])
    norm = LogNorm(vmin=float(allv.min()), vmax=float(allv.max()))
    if norm.vmin == norm.vmax:
        norm = LogNorm(vmin=norm.vmin / 2, vmax=norm.vmax * 2)
    n = len(shown)
    ncols = min(4, n)
    nrows = int(math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols + 1.2, 3.2 * nrows), squeeze=False)
    cmap = plt.get_cmap("magma_r").copy()
    cmap.set_bad("#d9d9d9")
    im = None
    for idx, (part, k, m, layers, qh) in enumerate(shown):
        ax = axes[idx // ncols][idx % ncols]
        show = np.where(np.isfinite(m) & (m > 0), m, np.nan)
        im = ax.imshow(np.ma.masked_invalid(show), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest",
                       origin="upper")
        L, H = m.shape
        title = "\n".join(textwrap.wrap(k.label, 34)) + (f"\n{part}" if part else "")
        ax.set_title(title, color=styles[k]["color"], fontweight="bold", fontsize=8.5)
        ax.set_xlabel("Query head")
        ax.set_ylabel("Layer")
        _ticks(ax, qh, H, "x")
        _ticks(ax, layers, L, "y")
        ax.grid(False)
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    if skipped_zero and n < nrows * ncols:
        axes[-1][-1].text(0.5, 0.5, "Zero divergence everywhere\n(not shown):\n" + "\n".join(skipped_zero),
                          transform=axes[-1][-1].transAxes, ha="center", va="center", fontsize=9, color="0.3")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    cax = fig.add_axes((0.915, 0.12, 0.018, 0.76))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("Attention KL (nats, log colour scale)")
    cb.ax.grid(False)
    style.save(fig, out_dir, "kl_heatmaps")
    note = ""
    if skipped_zero:
        note = " Not shown because their divergence is zero everywhere: " + ", ".join(skipped_zero) + "."
    parts = sorted({p for p, *_ in shown if p})
    part_note = f" One panel per method and data part ({', '.join(parts)})." if len(parts) > 1 else ""
    return Figure(
        "kl_heatmaps",
        "Per-layer × query-head attention KL",
        "Mean attention KL divergence (nats) for every measured layer (rows, first at the top) and query "
        "head (columns; tick labels are the model's layer and query-head indices), one panel per method, "
        f"from {src}.{part_note} All panels share one logarithmic colour scale, so colours compare across "
        "methods: darker is a larger divergence. Grey cells have no value or exactly zero divergence. "
        "Hot rows or columns point at layers or heads that the method handles badly (outlier channels, "
        "attention sinks)." + note,
        "figures/kl_heatmaps.png",
        "figures/kl_heatmaps.pdf",
        parts,
    )


# ------------------------------------------------------------------ 5b. model error vs budget, with CIs


def fig_model_budget(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    """Per tiles file and per model: the headline error against effective bits with bootstrap
    95 % CIs over units (slabs, prompts) and the Pareto front."""
    from . import budget, stats

    secs = [s_ for s_ in budget.sections(run) if any(p.error > 0 for p in s_.points)]
    if not secs:
        if run.accumulation_models():
            run.notes.append("Figure 'model error vs bits' skipped: no accumulation/decode summary rows.")
        return None
    fig, axes = _panel_grid(len(secs), 4.6)
    with_ci = False
    for ax, sec in zip(axes, secs):
        drawn = [p for p in sec.points if p.error > 0 and p.bits > 0]
        front = pareto_min([(p.bits, p.error) for p in drawn])
        if len(front) >= 2:
            ax.plot([drawn[i].bits for i in front], [drawn[i].error for i in front], drawstyle="steps-post",
                    color="0.35", linestyle="--", linewidth=1.0, zorder=1)
        for p in sec.points:
            if p.error <= 0 or p.bits <= 0:
                continue
            st = styles[p.key]
            yerr = None
            if p.ci is not None:
                with_ci = True
                yerr = [[max(0.0, p.error - p.ci.lo)], [max(0.0, p.ci.hi - p.error)]]
            ax.errorbar([p.bits], [p.error], yerr=yerr, fmt=st["marker"], color=st["color"], markersize=7,
                        capsize=3, elinewidth=1.0, label=p.key.label)
        ax.set_yscale("log")
        ax.set_xlabel(BITS_AXIS[sec.effective].replace("; log scale", ""))
        ax.set_ylabel(sec.metric_label + " (log scale)")
        ax.set_title(sec.title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    style.save(fig, out_dir, "model_budget")
    ci_txt = ("Whiskers are percentile bootstrap 95 % confidence intervals over units: (sequence, layer, KV "
              "head) slabs for tiles files, prompts for models (the engine's intervals, seeded by the config "
              f"seed; else {stats.RESAMPLES} resamples, seed {stats.SEED}); overlapping whiskers alone do not "
              "decide an ordering, the paired tests in the matched-budget tables do." if with_ci else
              "No whiskers: the run has fewer than two units (prompts, slabs) per method, so no interval "
              "can be given.")
    return Figure(
        "model_budget",
        "Headline error against effective bits, with confidence intervals",
        "Each point is one method on one tiles file or model: x its bits per element (effective: as "
        "stored at the measured length, fp16 sink, windows, boundary layers averaged over all layers and "
        "metadata included, where the run records them), y the headline metric named on the axis (rows "
        "or steps that read at least one quantized token; the all-rows values are in the tables). "
        "Down and to the left is better; the dashed step line is the Pareto front; methods at equal x "
        "are compared in the matched-budget tables. "
        + ci_txt + " Methods with exactly zero error (FP16) are not drawn." + _panel_note([(s_.title, 0) for s_ in secs]),
        "figures/model_budget.png",
        "figures/model_budget.pdf",
        [s_.title for s_ in secs],
    )


# ------------------------------------------------------------------ 6. capacity x throughput


def _gmean(v: List[float]) -> float:
    v = [x for x in v if x is not None and not math.isnan(x) and x > 0]
    return float(np.exp(np.mean(np.log(v)))) if v else math.nan


def throughput_points(run: RunData):
    """Per method: (capacity ×, throughput ×, ranges) aggregated over benchmark shapes."""
    def f(e, name):
        try:
            return float(e.get(name)) if e.get(name) is not None else math.nan
        except (TypeError, ValueError):
            return math.nan

    shape = lambda e: (e.get("batch"), e.get("context"), e.get("hq"), e.get("hkv"))  # noqa: E731
    fp16 = {shape(e): e for e in run.throughput if str(e.get("method")).lower() in ("fp16", "fp16_sdpa", "fp16_ref")}
    by_method: Dict[str, List[Tuple[float, float]]] = {}
    order: List[str] = []
    for e in run.throughput:
        name = str(e.get("method"))
        ref = fp16.get(shape(e))
        cap = math.nan
        if ref is not None and f(e, "bytes_per_token") > 0 and f(ref, "bytes_per_token") > 0:
            cap = f(ref, "bytes_per_token") / f(e, "bytes_per_token")
        elif ref is not None and f(e, "bytes") > 0 and f(ref, "bytes") > 0:
            cap = f(ref, "bytes") / f(e, "bytes")
        spd = f(e, "speedup_vs_fp16")
        if math.isnan(spd) and ref is not None and f(e, "time_us") > 0:
            spd = f(ref, "time_us") / f(e, "time_us")
        if name.lower() == "fp16":
            cap, spd = 1.0, 1.0
        if name not in by_method:
            order.append(name)
        by_method.setdefault(name, []).append((cap, spd))
    out = []
    for name in order:
        caps = [c for c, _ in by_method[name] if not math.isnan(c)]
        spds = [s for _, s in by_method[name] if not math.isnan(s)]
        if not caps or not spds:
            continue
        out.append((name, _gmean(caps), (min(caps), max(caps)), _gmean(spds), (min(spds), max(spds)),
                    len(by_method[name])))
    return out


def match_method(run: RunData, name: str) -> Optional[MethodKey]:
    for k in run.methods:
        if name in (k.method, k.spec, k.label):
            return k
    return None


def pareto_max(points: List[Tuple[float, float]]) -> List[int]:
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    best = -math.inf
    front = []
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def fig_throughput(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    if not run.throughput:
        run.notes.append("Figure 'capacity × throughput' skipped: the run has no throughput.json "
                         "(GPU benchmarks were not part of this sweep).")
        return None
    pts = throughput_points(run)
    if not pts:
        run.notes.append("Figure 'capacity × throughput' skipped: throughput.json has no FP16 baseline "
                         "or speedup values to normalize against.")
        return None
    acc_metric = KL if run.has_metric(KL) else None
    accs = []
    for name, *_ in pts:
        k = match_method(run, name)
        accs.append(run.value(k, acc_metric) if (k is not None and acc_metric) else math.nan)
    # one colour scale for the whole run (not just the benchmarked methods), so a lone method is
    # not painted "best" by construction
    pos = [a for a in accs if not math.isnan(a) and a > 0]
    if pos and acc_metric:
        pos += [v for v in (run.value(k, acc_metric) for k in run.methods) if not math.isnan(v) and v > 0]
    fig, ax = plt.subplots(figsize=(8.6, 5.6))
    norm = LogNorm(vmin=min(pos), vmax=max(pos) if max(pos) > min(pos) else min(pos) * 10) if pos else None
    cmap = plt.get_cmap("RdYlGn_r")
    xy = [(p[1], p[3]) for p in pts]
    front = pareto_max(xy)
    fr = sorted(front, key=lambda i: xy[i][0])
    if len(fr) > 1:
        ax.plot([xy[i][0] for i in fr], [xy[i][1] for i in fr], linestyle="--", color="0.45", linewidth=1.1,
                zorder=1, label="Pareto front")
    ax.axvline(1.0, color="0.6", linewidth=0.8, zorder=0)
    ax.axhline(1.0, color="0.6", linewidth=0.8, zorder=0)
    sc = None
    labels = []
    for i, (name, cap, crng, spd, srng, nshapes) in enumerate(pts):
        k = match_method(run, name)
        label = k.label if k else name
        marker = styles[k]["marker"] if k else "o"
        edge = styles[k]["color"] if k else "0.3"
        a = accs[i]
        if nshapes > 1:
            ax.errorbar([cap], [spd], xerr=[[max(0.0, cap - crng[0])], [max(0.0, crng[1] - cap)]],
                        yerr=[[max(0.0, spd - srng[0])], [max(0.0, srng[1] - spd)]],  # gmean rounding
                        fmt="none", ecolor="0.6", elinewidth=0.8, capsize=2, zorder=2)
        if norm is not None and not math.isnan(a):
            sc = ax.scatter([cap], [spd], c=[max(a, norm.vmin)], cmap=cmap, norm=norm, s=140, marker=marker,
                            edgecolor=edge, linewidth=2.0, zorder=3)
            acc_txt = "KL = 0" if a <= 0 else f"KL {a:.1e}"
        else:
            ax.scatter([cap], [spd], facecolor="white", s=140, marker=marker, edgecolor=edge, linewidth=2.0, zorder=3)
            acc_txt = "KL n/a"
        labels.append(f"{label}\n{acc_txt}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}×")
    ax.xaxis.set_major_formatter(fmt)
    ax.yaxis.set_major_formatter(fmt)
    xs = [p[0] for p in xy]
    ys = [p[1] for p in xy]
    ax.set_xlim(min(xs) / 1.25, max(xs) * 1.9)
    ax.set_ylim(min(ys) / 1.3, max(ys) * 1.3)
    ax.set_xlabel("KV-cache capacity vs. FP16 (× tokens in the same memory, log₂)")
    ax.set_ylabel("Attention throughput vs. FP16 (× speedup, log₂)")
    ax.set_title("Capacity × throughput, coloured by accuracy")
    if sc is not None:
        cb = fig.colorbar(sc, ax=ax, pad=0.02)
        cb.set_label("Attention KL vs. FP16 (nats, log; lower is better)")
        cb.ax.grid(False)
    if len(fr) > 1:
        ax.legend(loc="upper left", frameon=False)
    fig.tight_layout()
    place_labels(fig, ax, xy, labels, marker_pt=6.5)
    style.save(fig, out_dir, "capacity_throughput")
    shapes = sorted({(e.get("batch"), e.get("context"), e.get("hq"), e.get("hkv")) for e in run.throughput},
                    key=str)
    return Figure(
        "capacity_throughput",
        "Capacity × throughput with accuracy",
        "GPU attention benchmark. x: how many more tokens fit in the same KV-cache memory than with FP16 "
        "(FP16 bytes per token ÷ the method's bytes per token); y: attention speed-up over the FP16 "
        f"kernel. Both are geometric means over the {len(shapes)} benchmarked shape(s) (batch, context, "
        "query heads, KV heads); grey whiskers show the range. Colour is the attention KL divergence "
        "of the same method from this run's accuracy results (green: close to FP16, red: far; white: not "
        "measured) and the marker outline is the method's family colour. Up and to the right "
        "is better; the dashed line joins the Pareto-optimal methods, and the thin lines mark FP16 (1×, 1×).",
        "figures/capacity_throughput.png",
        "figures/capacity_throughput.pdf",
    )


BUILDERS: List[Callable] = [fig_stage_errors, fig_kl_pareto, fig_context, fig_decode, fig_heatmaps,
                            fig_model_budget, fig_throughput]


def build_all(run: RunData, out_dir: str, builders: Optional[List[Callable]] = None) -> List[Figure]:
    style.apply_style()
    styles = style.method_styles(run.methods)
    figs = []
    for b in BUILDERS if builders is None else builders:
        try:
            f = b(run, styles, out_dir)
        except Exception as e:  # one broken figure must not lose the report
            plt.close("all")
            run.notes.append(f"Figure {b.__name__} failed: {type(e).__name__}: {e}")
            f = None
        if f is not None:
            figs.append(f)
    return figs
