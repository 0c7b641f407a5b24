"""report.html and report.md: the same content, two formats.  Images are referenced relatively so
the report directory can be moved or zipped as a whole."""

from __future__ import annotations

import html
import json
import os
from typing import Any, List, Tuple

from . import budget, quality, stats, tables
from .figures import Figure
from .load import RunData


def _s(v: Any) -> str:
    if v is None or v == "":
        return "unknown"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(_s(x) for x in v) or "none"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _label(k: str) -> str:
    return k.replace("_", " ").capitalize()


def readable_rows(label: str, v: Any) -> List[Tuple[str, str]]:
    """One (label, text) row per scalar of a nested value: dicts become "label › key" rows, lists
    of scalars one comma-separated row, lists of objects "label [i] › key" rows."""
    if isinstance(v, dict) and v:
        out: List[Tuple[str, str]] = []
        for k in sorted(v):
            out += readable_rows(f"{label} › {k.replace('_', ' ')}", v[k])
        return out
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        out = []
        for i, x in enumerate(v):
            out += readable_rows(f"{label} [{i}]", x)
        return out
    return [(label, _s(v))]


def provenance_items(run: RunData) -> List[Tuple[str, str]]:
    p = run.provenance
    items = [
        ("Git commit", _s(p.get("git_commit"))),
        ("Uncommitted changes (dirty)", _s(p.get("git_dirty"))),
        ("Date", _s(p.get("date"))),
        ("CPU", _s(p.get("cpu"))),
        ("GPU", _s(p.get("gpu") or "none")),
        ("Build type", _s(p.get("build_type"))),
        ("Compiler", _s(p.get("compiler"))),
        ("Seed", _s(p.get("seed"))),
        ("Command", _s(p.get("command"))),
    ]
    libs = p.get("libraries")
    if isinstance(libs, dict) and libs:
        items.append(("Libraries", ", ".join(f"{k} {v}" for k, v in sorted(libs.items()))))
    for k in sorted(p):  # anything else the engine recorded (driver, hostname ...)
        if k not in ("git_commit", "git_dirty", "date", "cpu", "gpu", "build_type", "compiler", "seed",
                     "command", "libraries"):
            items += readable_rows(_label(k), p[k])
    items.append(("Bootstrap (report)", f"{stats.RESAMPLES} resamples, seed {stats.SEED}, "
                                         f"{int(stats.LEVEL * 100)} % percentile intervals over prompts"))
    return items


def config_items(run: RunData) -> List[Tuple[str, str]]:
    r = run.resolved
    items = []
    data = r.get("data")
    if isinstance(data, dict):
        items += readable_rows("Data", data)
    elif data is not None:
        items.append(("Data", _s(data)))
    methods = r.get("methods")
    if isinstance(methods, list):
        items.append(("Methods (config)", ", ".join(_s(m) if not isinstance(m, str) else m for m in methods)))
    items.append(("Methods (results)", ", ".join(k.label for k in run.methods) or "none"))
    items.append(("Cases", str(len(run.case_method))))
    metrics = r.get("metrics")
    if metrics is not None:
        items += readable_rows("Metrics (config)", metrics)
    items.append(("Summary rows", str(len(run.rows))))
    return items


def _title(run: RunData) -> str:
    return f"kvarn-eval report: {run.resolved.get('name') or os.path.basename(run.run_dir.rstrip('/'))}"


MAIN_CAPTION = "Main results per method."
BUDGET_HEADING = "At matched budget"
ACCUMULATION_HEADING = "Error accumulation per model"

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table.kv td{padding:2px 12px 2px 0;vertical-align:top}table.kv td:first-child{color:#555;white-space:nowrap}
table.results{border-collapse:collapse;margin:.6em 0;font-variant-numeric:tabular-nums}
table.results th,table.results td{padding:4px 10px;text-align:right;border-bottom:1px solid #e5e5e5}
table.results th{border-bottom:2px solid #444;background:#fafafa}table.results td.m,table.results th:first-child{text-align:left}
table.small{font-size:.85em}figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.92em;color:#333;margin-top:.4em}.note{color:#7a4b00}.desc{color:#444}
code{font-size:.9em}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.8em}
"""


def write_html(run: RunData, figs: List[Figure], table: tables.Table, out_dir: str) -> str:
    e = html.escape
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>{e(_title(run))}</title>", f"<style>{CSS}</style></head><body>",
         f"<h1>{e(_title(run))}</h1>"]
    if run.resolved.get("description"):
        h.append(f"<p class=\"desc\">{e(str(run.resolved['description']))}</p>")
    h += quality.section_html(run, figs)  # the model-level answer comes first
    h.append("<h2>Provenance</h2><table class=\"kv\">")
    h += [f"<tr><td>{e(k)}</td><td><code>{e(v)}</code></td></tr>" for k, v in provenance_items(run)]
    h.append("</table>")
    h.append("<h2>Configuration</h2><table class=\"kv\">")
    h += [f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in config_items(run)]
    h.append("</table>")
    if run.resolved:
        h.append("<details><summary>Resolved configuration (resolved.json)</summary><pre>"
                 + e(json.dumps(run.resolved, indent=2, sort_keys=True)) + "</pre></details>")
    h.append("<h2>Main results</h2>")
    h.append(tables.to_html(table))
    h.append(f"<p>{e(table.note)} LaTeX: <a href=\"tables/main.tex\">tables/main.tex</a>.</p>")
    mb = budget.to_html(run)
    if mb:
        h.append(f"<h2>{BUDGET_HEADING}</h2>")
        h.append(mb)
    acc = tables.accumulation_tables(run)
    if acc:
        h.append(f"<h2>{ACCUMULATION_HEADING}</h2>")
        for title, t in acc:
            h += [f"<h3>{e(title)}</h3>", tables.to_html(t), f"<p>{e(t.note)}</p>"]
    itl = tables.itl_markdown(run)
    if itl:
        h.append(f"<h2>{ITL_HEADING}</h2><pre>{e(itl)}</pre>")
    h.append("<h2>Figures</h2>")
    if not figs:
        h.append("<p class=\"note\">No figure could be drawn from this run; see the notes below.</p>")
    for i, f in enumerate(figs, 1):
        h.append(f"<figure id=\"{f.id}\"><img src=\"{e(f.png)}\" alt=\"{e(f.title)}\">"
                 f"<figcaption><b>Figure {i}: {e(f.title)}.</b> {e(f.caption)} "
                 f"(<a href=\"{e(f.pdf)}\">PDF</a>)</figcaption></figure>")
    if run.notes:
        h.append("<h2>Notes</h2><ul>")
        h += [f"<li class=\"note\">{e(n)}</li>" for n in run.notes]
        h.append("</ul>")
    am = tables.all_metrics_html(run)
    if am:
        h.append("<h2>All metrics</h2><p>Every metric of the summary, averaged like the main table.</p>")
        h.append(am)
    h.append("</body></html>")
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(h) + "\n")
    return path


ITL_HEADING = "Decode ITL slope and break-even context vs our FP16 kernel (GPU benchmark)"


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def write_markdown(run: RunData, figs: List[Figure], table: tables.Table, out_dir: str) -> str:
    m = [f"# {_title(run)}", ""]
    if run.resolved.get("description"):
        m += [str(run.resolved["description"]), ""]
    m += quality.section_markdown(run, figs)  # the model-level answer comes first
    m += ["## Provenance", "", "| | |", "|:---|:---|"]
    m += [f"| {k} | `{_md_escape(v)}` |" for k, v in provenance_items(run)]
    m += ["", "## Configuration", "", "| | |", "|:---|:---|"]
    m += [f"| {k} | {_md_escape(v)} |" for k, v in config_items(run)]
    if run.resolved:
        m += ["", "<details><summary>Resolved configuration (resolved.json)</summary>", "", "```json",
              json.dumps(run.resolved, indent=2, sort_keys=True), "```", "", "</details>"]
    m += ["", "## Main results", "", tables.to_markdown(table), table.note + " LaTeX: `tables/main.tex`.", ""]
    mb = budget.markdown(run)
    if mb:
        m += [f"## {BUDGET_HEADING}", "", mb]
    acc = tables.accumulation_markdown(run)
    if acc:
        m += [f"## {ACCUMULATION_HEADING}", "", acc]
    itl = tables.itl_markdown(run)
    if itl:
        m += [f"## {ITL_HEADING}", "", itl]
    m += ["## Figures", ""]
    if not figs:
        m += ["No figure could be drawn from this run; see the notes below.", ""]
    for i, f in enumerate(figs, 1):
        m += [f"### Figure {i}: {f.title}", "", f"![{f.title}]({f.png})", "", f"{f.caption} ([PDF]({f.pdf}))", ""]
    if run.notes:
        m += ["## Notes", ""] + [f"- {n}" for n in run.notes] + [""]
    am = tables.all_metrics_markdown(run)
    if am:
        m += ["## All metrics", "", "Every metric of the summary, averaged like the main table.", "", am]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(m).rstrip("\n") + "\n")
    return path
