"""kvarn-eval report generator: a run directory in, report.html / report.md / figures / tables out.

Entry points: `kvarn-report RUN_DIR [--out DIR]` (installed) or `python3 -m kvarn_report ...`
(see reports/README.md, docs/reports.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

__all__ = ["main", "build_report"]


def build_report(run_dir: str, out_dir: Optional[str] = None, quiet: bool = False) -> dict:
    """Build the report; returns {"html", "md", "figures", "tables", "notes"} (paths absolute)."""
    # The deterministic-output settings must precede any matplotlib import.
    os.environ.setdefault("SOURCE_DATE_EPOCH", "0")
    from . import budget, figures, load, quality, retrieval, tables, writers

    run = load.load_run(run_dir)
    out = os.path.abspath(out_dir or os.path.join(run_dir, "report"))
    fig_dir = os.path.join(out, "figures")
    tab_dir = os.path.join(out, "tables")
    os.makedirs(fig_dir, exist_ok=True)
    os.makedirs(tab_dir, exist_ok=True)

    figs = quality.build_figures(run, fig_dir)  # quality first
    figs += figures.build_all(run, fig_dir, figures.BUILDERS + retrieval.BUILDERS)
    table = tables.main_table(run)
    caption = writers.MAIN_CAPTION + " " + table.note
    written = []
    for name, text in (
        ("main.md", tables.to_markdown(table)),
        ("main.html", tables.to_html(table)),
        ("main.tex", tables.to_latex(table, caption)),
        ("all_metrics.md", tables.all_metrics_markdown(run)),
        ("accumulation.md", tables.accumulation_markdown(run)),
        ("matched_budget.md", budget.markdown(run)),
        ("quality.md", quality.markdown(run)),
        ("retrieval.md", retrieval.markdown(run)),
    ):
        if not text:  # no accumulation block in this run
            continue
        p = os.path.join(tab_dir, name)
        with open(p, "w", encoding="utf-8") as fh:
            fh.write(text)
        written.append(p)
    html_path = writers.write_html(run, figs, table, out)
    md_path = writers.write_markdown(run, figs, table, out)
    if not quiet:
        print(f"kvarn-report: {len(figs)} figure(s), {len(run.methods)} method(s) -> {html_path}")
        for n in run.notes:
            print(f"  note: {n}")
    return {
        "html": html_path,
        "md": md_path,
        "figures": [os.path.join(out, f.png) for f in figs] + [os.path.join(out, f.pdf) for f in figs],
        "tables": written,
        "notes": list(run.notes),
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="kvarn-report",
        description="Write report.html, report.md, figures (PNG+PDF) and LaTeX tables for a kvarn-eval run directory.",
    )
    ap.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by `kvarn-eval sweep`")
    ap.add_argument("--out", metavar="DIR", help="output directory (default: RUN_DIR/report)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    a = ap.parse_args(argv)
    from .load import ReportError

    try:
        build_report(a.run_dir, a.out, a.quiet)
    except ReportError as e:
        print(f"kvarn-report: error: {e}", file=sys.stderr)
        return 2
    return 0
