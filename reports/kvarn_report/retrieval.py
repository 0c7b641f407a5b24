"""Retrieval with the quantized cache in the loop (docs/metrics.md §10): passkey accuracy heatmaps
per method (needle depth x prompt length) and the tables with binomial 95 % intervals (passkey
cells, induction copy), read from the `retrieval` block of the case records."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import style
from .figures import Figure
from .load import MethodKey, RunData

import matplotlib.pyplot as plt  # noqa: E402  (style selected the Agg backend)


def _task(run: RunData, task: str) -> List[Tuple[MethodKey, Dict[str, Any]]]:
    """[(method, the case record's retrieval.<task> block)] in the report's method order; skipped
    methods are left out with a note."""
    by_key: Dict[MethodKey, Dict[str, Any]] = {}
    for cid, case in run.cases.items():
        block = (case.get("retrieval") or {}).get(task)
        key = run.case_method.get(cid)
        if not isinstance(block, dict) or key is None:
            continue
        if "skipped" in block:
            run.notes.append(f"Retrieval {task}: {key.label} skipped on {block.get('model')}: {block['skipped']}")
            continue
        if isinstance(block.get("cells"), list):
            by_key[key] = block
    return [(k, by_key[k]) for k in run.methods if k in by_key]


def _ci(cell: Dict[str, Any], name: str = "wilson") -> str:
    lo, hi = (cell.get(name) or [math.nan, math.nan])[:2]
    return f"[{lo:.2f}, {hi:.2f}]"


def _grid(cells: List[Dict[str, Any]], row: str, col: str):
    rows = sorted({c[row] for c in cells})
    cols = sorted({c[col] for c in cells})
    acc = np.full((len(rows), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in rows]
    for c in cells:
        i, j = rows.index(c[row]), cols.index(c[col])
        acc[i, j] = c["accuracy"]
        text[i][j] = f"{c['successes']}/{c['trials']}"
    return rows, cols, acc, text


def fig_passkey(run: RunData, styles, out_dir: str) -> Optional[Figure]:
    methods = _task(run, "passkey")
    if not methods:
        return None
    n = len(methods)
    ncol = min(n, 4)
    nrow = (n + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol + 0.8, 2.9 * nrow), squeeze=False)
    im = None
    for ax in axes.flat[n:]:
        ax.axis("off")
    for idx, (ax, (key, block)) in enumerate(zip(axes.flat, methods)):
        depths, lengths, acc, text = _grid(block["cells"], "depth", "length")
        im = ax.imshow(acc, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="upper")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8,
                        color="white" if (np.isnan(acc[i, j]) or acc[i, j] < 0.5) else "black")
        ax.set_xticks(range(len(lengths)))
        ax.set_xticklabels([str(x) for x in lengths])
        ax.set_yticks(range(len(depths)))
        ax.set_yticklabels([f"{d:g}" for d in depths])
        ax.set_xlabel("Prompt length (tokens)")
        if idx % ncol == 0:  # one depth label per row of panels
            ax.set_ylabel("Needle depth")
        ax.grid(False)
        ax.set_title(key.label, fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=list(axes.flat), shrink=0.8, label="Passkey accuracy")
    style.save(fig, out_dir, "retrieval_passkey")
    plt.close(fig)
    model = methods[0][1].get("model", "")
    return Figure(
        "retrieval_passkey",
        "Passkey retrieval with the quantized cache",
        f"Exact-match accuracy of a random digit passkey planted at a depth of a filler haystack "
        f"({model}), one panel per method: rows are the needle depth (0: start of the haystack, "
        "1: right before the question), columns the prompt length in tokens; each cell reads "
        "successes/trials. The prompt was prefilled through the method's cache in pseudo-decode "
        "blocks and answered greedily with the same cache (docs/metrics.md §10). The 95 % "
        "intervals are in tables/retrieval.md; with few trials per cell they are wide.",
        "figures/retrieval_passkey.png",
        "figures/retrieval_passkey.pdf",
    )


BUILDERS = [fig_passkey]


def passkey_table(run: RunData) -> List[str]:
    methods = _task(run, "passkey")
    if not methods:
        return []
    out = ["### Passkey retrieval", "",
           "| method | length | depth | eff. bits | accuracy | k/n | Wilson 95 % | Clopper-Pearson 95 % | = fp16 output |",
           "|---|---|---|---|---|---|---|---|---|"]
    for key, block in methods:
        for c in sorted(block["cells"], key=lambda c: (c["length"], c["depth"])):
            out.append(f"| {key.label} | {c['length']} | {c['depth']:g} | {c['effective_bits']:.2f} | "
                       f"{c['accuracy']:.2f} | {c['successes']}/{c['trials']} | {_ci(c)} | "
                       f"{_ci(c, 'clopper_pearson')} | {c.get('fp16_agreement', math.nan):.2f} |")
        a = block.get("all") or {}
        if a:
            out.append(f"| **{key.label}** | all | all | | **{a['accuracy']:.2f}** | "
                       f"{a['successes']}/{a['trials']} | {_ci(a)} | {_ci(a, 'clopper_pearson')} | |")
    out += ["", "Accuracy: the first digit run of the greedy answer equals the passkey. "
            "Effective bits: the method's model-level bits per element at that length.", ""]
    return out


def induction_table(run: RunData) -> List[str]:
    methods = _task(run, "induction")
    if not methods:
        return []
    out = ["### Induction copy", "",
           "| method | span | distance | tokens | eff. bits | accuracy | Wilson 95 % | fp16 accuracy | exact copies |",
           "|---|---|---|---|---|---|---|---|---|"]
    for key, block in methods:
        for c in sorted(block["cells"], key=lambda c: (c["span"], c["distance"])):
            out.append(f"| {key.label} | {c['span']} | {c['distance']} | {c['tokens']} | "
                       f"{c['effective_bits']:.2f} | {c['accuracy']:.3f} | {_ci(c)} | "
                       f"{c['fp16_accuracy']:.3f} | {c['exact_copies']}/{c['sequences']} |")
        a = block.get("all") or {}
        if a:
            out.append(f"| **{key.label}** | all | all | | | **{a['accuracy']:.3f}** | {_ci(a)} | | |")
    out += ["", "Accuracy: fraction of the span's last occurrence's tokens (after its first) that the "
            "greedy argmax predicts, teacher forced, over all trials' tokens (the interval treats "
            "tokens as independent, so it is optimistic for tokens of one sequence).", ""]
    return out


def markdown(run: RunData) -> str:
    parts = passkey_table(run) + induction_table(run)
    return "\n".join(parts)
