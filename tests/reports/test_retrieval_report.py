"""The report's retrieval part (reports/kvarn_report/retrieval.py) on a synthetic run directory
whose case records hold `retrieval` blocks as the engine writes them (docs/results.md)."""

import json
import os

from kvarn_report import build_report

METHODS = {"fp16": ("fp16", "fp16", 16.0, 1.0), "kivi_2bit": ("kivi:bits=2,group=32,residual=128", "kivi", 3.0, 0.5)}


def _cell(successes, trials, **where):
    return dict(where, successes=successes, trials=trials, accuracy=successes / trials,
                wilson=[max(0.0, successes / trials - 0.3), min(1.0, successes / trials + 0.2)],
                clopper_pearson=[max(0.0, successes / trials - 0.35), min(1.0, successes / trials + 0.25)],
                effective_bits=16.0)


def write_run(run_dir):
    os.makedirs(os.path.join(run_dir, "cases"))
    rows = []
    for i, (name, (spec, fam, bits, acc)) in enumerate(METHODS.items()):
        cid = f"c{i:03d}"
        ok = 2 if acc == 1.0 else 1
        passkey = [dict(_cell(ok, 2, length=L, depth=d), fp16_agreement=acc, runs=[])
                   for L in (1024, 2048) for d in (0.0, 0.5, 1.0)]
        induction = [dict(_cell(ok * 7, 30, span=16, distance=dd), tokens=16 + 32 + dd, fp16_accuracy=0.45,
                          exact_copies=0, sequences=2) for dd in (64, 512)]
        rec = {"case_id": cid, "spec": spec, "rows": [],
               "retrieval": {"block": 128, "current_token": "exact",
                             "passkey": {"model": "smollm2", "all": _cell(ok * 6, 12), "cells": passkey},
                             "induction": {"model": "fixture", "all": _cell(ok * 14, 60), "cells": induction}}}
        for c in passkey:
            rows.append({"case_id": cid, "method": name, "spec": spec, "family": fam, "data":
                         f"smollm2/L={c['length']}/depth={c['depth']}", "bits_per_element": bits,
                         "effective_bits": bits, "metric": "retrieval.passkey.accuracy", "scope": "retrieval",
                         "layer": "all", "head": "all", "value": c["accuracy"]})
        rec["rows"] = rows[-len(passkey):]
        with open(os.path.join(run_dir, "cases", cid + ".json"), "w") as f:
            json.dump(rec, f)
    with open(os.path.join(run_dir, "summary.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_retrieval_heatmaps_and_tables(check, tmp_path):
    run_dir = str(tmp_path / "run")
    write_run(run_dir)
    out = build_report(run_dir, str(tmp_path / "report"), quiet=True)
    check(any(p.endswith("retrieval_passkey.png") for p in out["figures"]), "passkey heatmap not drawn")
    table = [p for p in out["tables"] if p.endswith("retrieval.md")]
    check(len(table) == 1, "tables/retrieval.md not written")
    text = open(table[0], encoding="utf-8").read()
    # every (method, length, depth) cell with its counts and both intervals, and the induction cells
    for needle in ("### Passkey retrieval", "### Induction copy", "| 2048 | 0.5 |", "2/2", "1/2",
                   "[0.70, 1.00]", "[0.65, 1.00]", "| 16 | 512 | 560 |", "0/2"):
        check(needle in text, f"retrieval.md lacks {needle!r}")
    check(text.count("| 1024 |") == 2 * 3, "one passkey row per method and depth at 1024 tokens")
    md = open(out["md"], encoding="utf-8").read()
    check("Passkey retrieval with the quantized cache" in md, "report.md lacks the passkey figure")
