"""The report's model-level quality section: a planted run with `quality.*` rows and per-window
means; the section comes first, its table holds the llama.cpp statistics with CIs and the paired
verdict (planted difference detected, null not), and its three figures are drawn."""

import json
import os

import numpy as np
from kvarn_report import build_report, load, quality

MODEL = "fixture-long"
WINDOWS = 16
SPREAD = np.linspace(0.01, 0.03, WINDOWS)  # window-to-window spread shared by every method
SIGN = np.array([1.0 if i % 2 == 0 else -1.0 for i in range(WINDOWS)])
# method -> (spec, family, effective bits, per-window mean KLD); kvarn_a is half of kivi_a
# (planted difference), kvarn_b equals kivi_b on average (null).
PLANTED = {
    "fp16": ("fp16", "fp16", 16.0, np.zeros(WINDOWS)),
    "kivi_a": ("kivi:bits=2,group=64", "kivi", 3.0, SPREAD * 2.0),
    "kvarn_a": ("kvarn:k=4,v=2,g=128", "kvarn", 3.1, SPREAD),
    "kivi_b": ("kivi:bits=4,group=64", "kivi", 4.0, SPREAD + 0.002 * SIGN),
    "kvarn_b": ("kvarn:k=4,v=4,g=128", "kvarn", 4.1, SPREAD - 0.002 * SIGN),
}


def write_run(run_dir):
    os.makedirs(os.path.join(run_dir, "cases"))
    with open(os.path.join(run_dir, "resolved.json"), "w") as f:
        json.dump({"name": "q", "seed": 0, "quality": {"window": 1024, "block": 64, "resamples": 1000,
                                                       "current_token": "exact",
                                                       "models": [{"name": MODEL, "window": 1024}]}}, f)
    with open(os.path.join(run_dir, "provenance.json"), "w") as f:
        json.dump({"git_commit": "abc"}, f)
    rows = []
    for i, (method, (spec, fam, eff, per_window)) in enumerate(PLANTED.items()):
        cid = f"c{i:03d}-{method}"
        base = dict(case_id=cid, method=method, spec=spec, family=fam, bits_per_element=eff,
                    effective_bits=eff, data=MODEL, scope="quality", head="all")
        prefix = "quality.all_rows." if fam == "fp16" else "quality."
        m = float(per_window.mean())
        for stat, v in (("kld.mean", m), ("kld.p99", 5 * m), ("ppl_ref", 10.0), ("ppl", 10.0 * (1 + m)),
                        ("ppl_ratio", 1 + m), ("same_top1", 100 - 100 * m)):
            rows.append(dict(base, metric=prefix + stat, layer="all", value=v))
            rows.append(dict(base, metric=prefix + stat + ".ci_lo", layer="all", value=0.9 * v))
            rows.append(dict(base, metric=prefix + stat + ".ci_hi", layer="all", value=1.1 * v))
        if fam != "fp16":
            rows.append(dict(base, metric="quality.all_rows.kld.mean", layer="all", value=0.9 * m))
        for lo in (0, 256, 512, 768):
            v = m * (1 + lo / 1024)
            for suffix, f in (("", 1.0), (".ci_lo", 0.8), (".ci_hi", 1.2)):
                rows.append(dict(base, metric=f"quality.pos{lo}-{lo + 256}.kld.mean{suffix}", layer="all",
                                 value=v * f))
        if method == "kvarn_a":
            for layer in range(4):
                for suffix, f in (("", 1.0), (".ci_lo", 0.8), (".ci_hi", 1.2)):
                    rows.append(dict(base, metric="quality.layer.kld.mean" + suffix, layer=layer,
                                     value=m * (layer + 1) * f))
        wm = [float(x) for x in per_window]
        record = {"case_id": cid, "name": method, "spec": spec, "rows": [],
                  "quality": {"models": [{"model": MODEL, "windows": WINDOWS,
                                          "fp16_reference": {"bytes": 123},
                                          "stats": {"window_means": {"kld": None if fam == "fp16" else wm},
                                                    "window_means_all_rows": {"kld": wm}}}]}}
        if fam == "fp16":
            record["quality"]["models"][0]["stats"]["window_means"] = {"kld": [None] * WINDOWS}
        with open(os.path.join(run_dir, "cases", cid + ".json"), "w") as f:
            json.dump(record, f)
    with open(os.path.join(run_dir, "summary.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return run_dir


def test_quality_section_first_with_table_and_figures(tmp_path):
    run_dir = write_run(str(tmp_path / "run"))
    out = build_report(run_dir, quiet=True)
    md = open(out["md"], encoding="utf-8").read()
    assert md.index(quality.HEADING) < md.index("## Provenance")
    html = open(out["html"], encoding="utf-8").read()
    assert html.index(quality.HEADING) < html.index("<h2>Provenance</h2>")
    stems = [os.path.basename(p) for p in out["figures"]]
    for stem in ("quality_kld_vs_bits.png", "quality_kld_vs_position.png", "quality_per_layer.png"):
        assert stem in stems
    assert stems[0] == "quality_kld_vs_bits.png"  # the first figure answers the first question
    assert any(p.endswith("quality.md") for p in out["tables"])


def test_table_rows_and_paired_verdicts(tmp_path):
    run = load.load_run(write_run(str(tmp_path / "run")))
    head, body = quality.table_rows(run, MODEL)
    assert head[:3] == ["method", "eff. bits", "mean KLD"]
    by_label = {row[0]: row for row in body}
    assert [row[1] for row in body] == sorted([row[1] for row in body], key=float)  # by bits
    fp16 = next(r for label, r in by_label.items() if label.startswith("FP16"))
    assert "(all rows)" in fp16[0] and fp16[2].startswith("0 [")
    assert by_label["KVarN a"][-1].startswith("vs KIVI a (3.00 b): lower")  # planted: detected
    assert by_label["KIVI a"][-1].startswith("vs KVarN a (3.10 b): higher")
    assert "not significantly different" in by_label["KVarN b"][-1]  # null: not detected
    assert "L3:" in quality.layer_markdown(run, MODEL)


def test_run_without_quality_rows_has_no_section(tmp_path):
    run_dir = write_run(str(tmp_path / "run"))
    with open(os.path.join(run_dir, "summary.jsonl"), "w") as f:
        f.write(json.dumps(dict(case_id="c0", method="fp16", spec="fp16", family="fp16", data="x",
                                metric="key.end_to_end.nmse", scope="key", layer="all", head="all",
                                value=0.0)) + "\n")
    run = load.load_run(run_dir)
    assert not quality.has_quality(run)
    assert quality.markdown(run) == "" and quality.section_html(run, []) == []
