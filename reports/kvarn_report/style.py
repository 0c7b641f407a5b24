"""Colours, markers, matplotlib settings and deterministic saving."""

from __future__ import annotations

import colorsys
import os
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from .load import MethodKey  # noqa: E402

# One base colour per family, kept across every figure of every report.
FAMILY_COLORS: Dict[str, str] = {
    "fp16": "#4d4d4d",
    "fp8": "#1f77b4",
    "kivi": "#ff7f0e",
    "quarot": "#9467bd",
    "turboquant": "#2ca02c",
    "rtn": "#8c564b",
    "varn": "#e377c2",
    "kvarn": "#d62728",
}
_SPARE = ["#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]

RC = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.hashsalt": "kvarn-report",
    "pdf.fonttype": 42,  # TrueType in PDFs (editable text, accepted by paper venues)
    "ps.fonttype": 42,
    "path.simplify": True,
}


def apply_style() -> None:
    matplotlib.rcParams.update(RC)


def family_color(fam: str, families: List[str]) -> str:
    if fam in FAMILY_COLORS:
        return FAMILY_COLORS[fam]
    unknown = sorted(f for f in families if f not in FAMILY_COLORS)
    return _SPARE[unknown.index(fam) % len(_SPARE)] if fam in unknown else _SPARE[0]


def method_styles(methods: List[MethodKey]) -> Dict[MethodKey, Dict[str, str]]:
    """Colour (family hue, shaded within the family) and marker per method."""
    fams = sorted({m.family for m in methods})
    out: Dict[MethodKey, Dict[str, str]] = {}
    for fam in fams:
        members = [m for m in methods if m.family == fam]
        base = mcolors.to_rgb(family_color(fam, fams))
        h, l, s = colorsys.rgb_to_hls(*base)
        n = len(members)
        for i, m in enumerate(members):
            # spread lightness from darker to lighter around the base colour
            li = l if n == 1 else min(0.78, max(0.22, l - 0.18 + 0.36 * i / (n - 1)))
            rgb = colorsys.hls_to_rgb(h, li, s)
            out[m] = {"color": mcolors.to_hex(rgb), "marker": _MARKERS[i % len(_MARKERS)]}
    return out


def save(fig, out_dir: str, stem: str) -> List[str]:
    """PNG and PDF with metadata stripped so the bytes do not depend on the date or version."""
    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, stem + ".png")
    pdf = os.path.join(out_dir, stem + ".pdf")
    fig.savefig(png, format="png", metadata={"Software": None}, bbox_inches="tight", pad_inches=0.08)
    fig.savefig(
        pdf,
        format="pdf",
        metadata={"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None},
        bbox_inches="tight",
        pad_inches=0.08,
    )
    plt.close(fig)
    return [png, pdf]
