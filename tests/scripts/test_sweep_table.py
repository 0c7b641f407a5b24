"""Tests of scripts/sweep_table.py (run by pytest): each table on planted summary rows (values
and "-" for what a run did not measure), on the committed H200 summaries of docs/findings/
(numbers docs/FINDINGS.md quotes), and the one-line errors for a missing or broken summary."""
import json
import os
import subprocess
import sys
import tempfile

import sweep_table as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "sweep_table.py")
FINDINGS = os.path.join(ROOT, "docs", "findings")


def row(method, metric, value, data="m", layer="all", scope="quality", eff=4.0):
    return {"method": method, "metric": metric, "value": value, "data": data, "layer": layer,
            "head": "all", "scope": scope, "effective_bits": eff}


def cells(line):
    return line.split()


def test_accumulation_planted_rows_and_missing_cells():
    rows = [row("a", "accumulation.mae_accumulated.final", 0.125),
            row("a", "decode.kl.mean", 0.5),
            row("a", "decode.kl.mean", 9.0, layer=3),  # per-layer rows are not the pooled value
            row("b", "decode.top1_agreement", 1.0)]
    out = st.accumulation(rows)
    assert len(out) == 3
    a, b = cells(out[1]), cells(out[2])
    assert a[0] == "a" and a[1] == "0.125" and a[4] == "0.5" and a[2] == "-"
    assert b[0] == "b" and b[5] == "1" and b[1] == "-"


def test_quality_rows_per_method_and_model():
    rows = [row("kvarn", "quality.kld.mean", 0.024, data="smol", eff=3.757),
            row("kvarn", "quality.ppl_ratio", 1.028, data="smol", eff=3.757),
            row("kvarn", "quality.kld.mean", 0.05, data="fixture", eff=4.1),
            row("kivi", "quality.kld.mean", 0.3, data="smol", eff=3.1),
            row("x", "tile.nmse", 1.0, scope="key")]  # not a quality row: no line
    out = st.quality(rows)
    assert [cells(l)[:3] for l in out[1:]] == [["kvarn", "smol", "3.757"],
                                                ["kvarn", "fixture", "4.100"],
                                                ["kivi", "smol", "3.100"]]
    assert cells(out[1])[3:] == ["0.024", "-", "1.028", "-"]


def test_retrieval_mean_over_depths_and_pooled_interval():
    rows = []
    for m, accs in (("fp16", [1.0, 1.0, 0.5]), ("kivi", [0.0, 0.5, 0.0])):
        for d, a in zip((0.0, 0.5, 1.0), accs):
            data = f"smol/L=4096/depth={d}"
            rows += [row(m, "retrieval.passkey.accuracy", a, data=data),
                     row(m, "retrieval.passkey.ci_low", 0.0, data=data),
                     row(m, "retrieval.passkey.ci_high", 1.0, data=data)]
        pooled = sum(accs) / 3
        rows += [row(m, "retrieval.passkey.accuracy", pooled, data="smol", eff=3.2),
                 row(m, "retrieval.passkey.ci_low", 0.25, data="smol", eff=3.2),
                 row(m, "retrieval.passkey.ci_high", 0.75, data="smol", eff=3.2)]
    out = st.retrieval(rows)
    assert cells(out[0])[2:5] == ["acc", "L=4096", "all"]
    assert cells(out[1]) == ["fp16", "3.200", "0.833", "0.833", "[0.25,", "0.75]"]
    assert cells(out[2]) == ["kivi", "3.200", "0.167", "0.167", "[0.25,", "0.75]"]


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_committed_h200_summaries_give_the_findings_numbers():
    p = run("retrieval", os.path.join(FINDINGS, "h200_2026-12-02_passkey_tq3_4k_8k_summary.jsonl"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[2:6] == ["acc", "L=4096", "acc", "L=8184"]
    tq = cells(lines[1])
    assert tq[0] == "turboquant_3bit_nc" and tq[1] == "5.058" and tq[2:4] == ["1.000", "0.333"]
    q = run("quality", os.path.join(FINDINGS, "h200_2026-12-02_quality_smollm2_8k_summary.jsonl"))
    assert q.returncode == 0, q.stderr
    kvarn = [cells(l) for l in q.stdout.splitlines() if l.startswith("kvarn_k4v2_g128")]
    assert kvarn and kvarn[0][2] == "3.757" and kvarn[0][3] == "0.02418"


def test_missing_and_broken_summaries_fail_with_one_line():
    p = run("quality", "/nonexistent/summary.jsonl")
    assert p.returncode == 1 and "no summary" in p.stderr and len(p.stderr.splitlines()) == 1
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "summary.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps(row("a", "decode.kl.mean", 1.0)) + "\n{broken\n")
        p = run("accumulation", bad)
        assert p.returncode == 1 and f"{bad}:2: not a JSON line" in p.stderr
    p = run("tables", bad)
    assert p.returncode == 1 and p.stderr.startswith("usage:")
