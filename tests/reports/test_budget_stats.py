"""Matched-budget comparison, interpolation, bootstrap intervals, the paired significance test and
the per-part heatmaps, on closed forms and the planted run (planted.py, conftest.py)."""

import math
import os

import numpy as np
from kvarn_report import budget, figures, load, stats, style, writers
from kvarn_report.load import MethodKey

from planted import HEADLINE, MODEL, PARTS, PLANTED, UNITS, planted_ci


def key(name, fam="kvarn"):
    return MethodKey(name, f"{fam}:k=4", fam, name)


def test_matched_pairs_within_tolerance(check):
    pts = [budget.Point(key(n, f), b, b, 1.0) for n, f, b in
           [("ref", "fp16", 16.0), ("a", "kivi", 2.0), ("b", "kvarn", 2.1), ("c", "kvarn", 2.3),
            ("d", "kivi", 3.0), ("e", "turboquant", 3.15), ("f", "kvarn", 3.4)]]
    got = {(p.a.key.method, p.b.key.method) for p in budget.matched_pairs(pts)}
    # 0.1 and exactly 0.15 apart match; 0.2, 0.25, 0.3 apart and the FP16 reference do not.
    check(got == {("a", "b"), ("d", "e")}, f"matched pairs {got}")


def test_interpolation_at_known_budget(check):
    check(math.isclose(budget.interpolate([2.0, 4.0], [0.4, 0.2], 3.0), 0.3), "midpoint of a line")
    check(math.isclose(budget.interpolate([4.0, 2.0, 6.0], [0.2, 0.4, 0.1], 5.0), 0.15), "unsorted points")
    check(math.isnan(budget.interpolate([2.0, 4.0], [0.4, 0.2], 4.5)), "outside the measured range is NaN")
    pts = [budget.Point(MethodKey(n, s, s.split(":")[0], n), b, b, e) for n, s, b, e in
           [("k2", "kivi:bits=2", 2.2, 0.4), ("k4", "kivi:bits=4", 4.2, 0.2),
            ("v2", "kvarn:k=2,v=2,rotation=none", 2.6, 0.3), ("v4", "kvarn:k=4,v=4,rotation=none", 3.6, 0.1)]]
    cs = budget.curves(pts)
    check(sorted(cs) == ["kivi", "kvarn rotation=none"], f"curves {sorted(cs)}")
    check(budget.common_budgets(cs) == [3.0, 3.5], f"common budgets {budget.common_budgets(cs)}")
    check(math.isclose(budget.interpolate([p.bits for p in cs["kivi"]], [p.error for p in cs["kivi"]], 3.0), 0.32),
          "KIVI read off at 3.0 bits")


def test_bootstrap_ci_of_known_distribution(check):
    rng = np.random.default_rng(7)
    x = rng.normal(1.0, 1.0, 400)
    ci = stats.bootstrap_ci(x, seed=3)
    half = 1.96 / math.sqrt(400)
    check(ci.lo < x.mean() < ci.hi, "the interval holds the sample mean")
    check(abs((ci.hi - ci.lo) / 2 - half) < 0.15 * half, f"half width {(ci.hi - ci.lo) / 2} vs {half}")
    check(stats.bootstrap_ci(x, seed=3) == ci, "same seed, same interval")
    check(stats.bootstrap_ci([0.5]) is None, "one value has no interval")
    # coverage over repeated samples of a known distribution (exponential, mean 1)
    hits = sum(1 for s in range(200) if (lambda c: c.lo <= 1.0 <= c.hi)(
        stats.bootstrap_ci(np.random.default_rng(100 + s).exponential(1.0, 40), seed=s, resamples=1000)))
    check(0.86 <= hits / 200 <= 0.99, f"coverage {hits / 200}")


def test_paired_bootstrap_planted_and_null(check):
    ids = [f"p{i}" for i in range(20)]
    base = np.linspace(0.0, 1.0, 20)  # large spread between prompts, shared by both methods
    a = {p: v for p, v in zip(ids, base)}
    planted = {p: v + 0.05 for p, v in zip(ids, base)}
    check(stats.paired_bootstrap(a, planted).verdict == "a lower", "a planted +0.05 shift is found")
    check(stats.paired_bootstrap(planted, a).verdict == "b lower", "and in the other order")
    sign = [1 if i % 2 else -1 for i in range(20)]
    null = {p: v + 0.05 * s for p, v, s in zip(ids, base, sign)}
    r = stats.paired_bootstrap(a, null)
    check(r.verdict == "not significant", f"a zero-mean difference is not significant: {r}")
    check(stats.paired_bootstrap({"p0": 1.0}, {"p0": 2.0}).verdict == "n < 2: untested", "one prompt: untested")
    check(stats.paired_bootstrap(a, {"x": 1.0}).diff.n == 0, "no shared prompts")


def test_planted_run_matched_budget_sections(check, planted_run):
    run = load.load_run(planted_run)
    secs = {s.title: s for s in budget.sections(run)}
    check(set(secs) == {"Tiles fixture", "Tiles smollm2", MODEL}, f"sections {list(secs)}")
    sec = secs[MODEL]
    check(sec.effective, "the planted run records effective bits")
    pairs = {(p.a.key.method, p.b.key.method): p for p in budget.matched_pairs(sec.points)}
    check(set(pairs) == {("kivi_a", "kvarn_a"), ("kivi_b", "kvarn_b")}, f"pairs {set(pairs)}")
    check(pairs[("kivi_a", "kvarn_a")].test.verdict == "b lower", "planted difference: KVarN a lower")
    check(pairs[("kivi_b", "kvarn_b")].test.verdict == "not significant", "null pair not significant")
    kv = next(p for p in sec.points if p.key.method == "kvarn_a")
    check(math.isclose(kv.bits, 3.1) and math.isclose(kv.steady, 3.375), f"bits {kv.bits} / {kv.steady}")
    check(kv.ci is not None and kv.ci.lo < kv.error < kv.ci.hi and kv.ci.n == 20, f"CI {kv.ci}")
    md = budget.markdown(run)
    check("KVarN a lower (significant)".lower() in md.lower() or "kvarn_a lower (significant)" in md.lower(),
          "report names the significant ordering")
    check("not significant" in md and f"seed {stats.SEED}" in md, "report says not significant and the seed")
    from kvarn_report import tables

    (title, t), = tables.accumulation_tables(run)
    j = [c.header for c in t.columns].index("Decode KL 95% CI")
    row = t.values[t.methods.index(kv.key)]
    check(row[j] == f"[{kv.ci.lo:.2e}, {kv.ci.hi:.2e}] (n = 20)", f"accumulation table CI cell {row[j]!r}")
    check([c.header for c in t.columns][:2] == ["Eff. bits/el", "Steady bits/el"], "bits columns of the model table")


def test_planted_run_tiles_headline_cis_and_significance(check, planted_run):
    run = load.load_run(planted_run)
    secs = {s.title: s for s in budget.sections(run)}
    sec = secs["Tiles fixture"]
    check(sec.metric == HEADLINE and sec.all_rows_metric == "attention.kl.mean", f"metric {sec.metric}")
    kv = next(p for p in sec.points if p.key.method == "kvarn_a")
    lo, hi = planted_ci("kvarn_a")
    check(kv.ci is not None and math.isclose(kv.ci.lo, lo) and math.isclose(kv.ci.hi, hi) and kv.ci.n == len(UNITS),
          f"the row's recorded CI is used: {kv.ci}")
    check(len(kv.prompts) == len(UNITS) and not math.isnan(kv.all_rows), "per-unit values and the all-rows value")
    pairs = {(p.a.key.method, p.b.key.method): p for p in budget.matched_pairs(sec.points)}
    check(pairs[("kivi_a", "kvarn_a")].test.verdict == "b lower", "planted unit difference found")
    check(pairs[("kivi_b", "kvarn_b")].test.verdict == "not significant", "null unit pair not significant")
    txt = budget.significance_text(sec)
    check(txt.startswith("Not significant (1 of 2 matched pairs") and "KIVI b vs KVarN b" in txt
          and "KIVI a" not in txt, f"significance text {txt!r}")
    md = budget.markdown(run)
    check(txt in md and "all rows" in md and "slabs" in md, "the report prints the text, all rows and the unit")
    check(budget.significance_text(budget.Section("t", "m", "l", True, [])) == "", "no pairs: no text")


def test_planted_run_without_effective_bits_is_labelled(check, planted_run_steady):
    run = load.load_run(planted_run_steady)
    check(not run.has_effective_bits(), "no effective bits in the planted older run")
    sec = next(s for s in budget.sections(run) if s.title == MODEL)
    check(not sec.effective and "steady-state" in budget.note(sec), "fallback is labelled steady-state")
    pairs = {(p.a.key.method, p.b.key.method) for p in budget.matched_pairs(sec.points)}
    check(pairs == {("kvarn_b", "kivi_b")}, f"steady-state pairs {pairs}")  # 4.375 and 4.5


def test_heatmaps_draw_every_part_by_query_head(check, planted_run, tmp_path, drawn_figures):
    run = load.load_run(planted_run)
    drawn = drawn_figures
    fig = figures.fig_heatmaps(run, style.method_styles(run.methods), str(tmp_path / "figs"))
    check(fig is not None and fig.panels == sorted(PARTS), f"parts {fig and fig.panels}")
    axes = [ax for ax in drawn[0].axes if ax.images]
    check(len(axes) == len(PLANTED) * len(PARTS), f"{len(axes)} panels for {len(PLANTED)} methods × 2 parts")
    shapes = sorted({ax.images[0].get_array().shape for ax in axes})
    check(shapes == sorted(s for s, _ in PARTS.values()), f"matrix shapes {shapes}")
    check(all(ax.get_xlabel() == "Query head" for ax in axes), "columns are labelled as query heads")
    smol = [ax for ax in axes if ax.images[0].get_array().shape == (6, 3)]
    check(smol and [t.get_text() for t in smol[0].get_xticklabels()] == ["0", "3", "6"],
          "tick labels are the model's query-head indices")
    check("KV head" not in fig.caption and "query" in fig.caption, "the caption says query heads")


def test_provenance_is_readable_rows(check, planted_run):
    run = load.load_run(planted_run)
    items = dict(writers.provenance_items(run))
    check(items.get("Git › run time › commit") == "abc", f"nested provenance rows {list(items)}")
    check(items.get("Sets") == "output=/tmp/x", "a list of strings is one comma-separated row")
    check(not any(v.startswith("{") or v.startswith("[") for v in items.values()), "no raw JSON in a cell")
    check(f"seed {stats.SEED}" in items.get("Bootstrap (report)", ""), "the bootstrap seed is recorded")


def test_model_budget_figure_draws_ci_whiskers(check, planted_run, tmp_path, drawn_figures):
    run = load.load_run(planted_run)
    drawn = drawn_figures
    fig = figures.fig_model_budget(run, style.method_styles(run.methods), str(tmp_path / "figs"))
    check(fig is not None and fig.panels == ["Tiles fixture", "Tiles smollm2", MODEL], f"panels {fig and fig.panels}")
    check("Whiskers are percentile bootstrap 95 %" in fig.caption and f"seed {stats.SEED}" in fig.caption,
          "the caption names the intervals and the seed")
    tiles_ax = drawn[0].axes[0]
    lo, hi = planted_ci("kvarn_a")
    tseg = [s_ for c in tiles_ax.collections for s_ in c.get_segments() if math.isclose(s_[0][0], 3.1)]
    check(tseg and math.isclose(tseg[0][0][1], lo) and math.isclose(tseg[0][1][1], hi),
          f"tiles panel: KVarN a's whisker {tseg} spans the recorded CI")
    check(any(line.get_linestyle() == "--" for line in tiles_ax.get_lines()), "the Pareto front is drawn")
    ax = drawn[0].axes[2]
    # one vertical whisker per compressed method (FP16 is exactly zero and not drawn)
    whiskers = [c for c in ax.collections if c.get_segments()]
    check(len(whiskers) == len(PLANTED) - 1, f"{len(whiskers)} whisker sets")
    kv = next(p for p in next(s for s in budget.sections(run) if s.title == MODEL).points
              if p.key.method == "kvarn_a")
    seg = [s_ for c in whiskers for s_ in c.get_segments() if math.isclose(s_[0][0], 3.1)]
    check(seg and math.isclose(seg[0][0][1], kv.ci.lo) and math.isclose(seg[0][1][1], kv.ci.hi),
          f"KVarN a's whisker {seg} spans its CI {kv.ci}")
    check(ax.get_xlabel().startswith("Effective bits"), f"x axis {ax.get_xlabel()!r}")


def test_paired_command_on_planted_units(check, planted_run):
    from kvarn_report import paired

    run = load.load_run(planted_run)
    out = paired.describe(run, "fixture", HEADLINE, "kivi_a", "kvarn_a")
    check("over 16 shared units: b lower" in out, f"planted unit difference: {out}")
    lo, hi = planted_ci("kvarn_a")
    check(f"[{lo:.4g}, {hi:.4g}] over 16 units" in out, "the recorded CI is printed")
    null = paired.describe(run, "fixture", HEADLINE, "kivi_b", "kvarn_b")
    check("not significant" in null, f"null pair: {null}")
    check(paired.main([planted_run, MODEL, "decode.kl.mean", "kivi_a", "kvarn_a"]) == 0, "the command runs")
