"""Tests of the report generator (the reports/kvarn_report package; run by pytest).

Builds synthetic run directories that follow the run-directory contract (docs/results.md,
docs/reports.md) in a temporary folder, runs `python3 -m kvarn_report` on them and checks the
outputs:

  full      every piece present: summary.jsonl+csv, cases, arrays, throughput.json
  minimal   summary.csv only (no provenance, resolved, arrays, throughput)
  two models  an accumulation sweep over two models (one table and panel per model)
  broken    no summary at all -> non-zero exit
  package   pip installs reports/ with its `kvarn-report` entry point
"""

import csv
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from kvarn_report import figures, load, style

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

L, H, D, T = 6, 4, 128, 512

# method -> (spec, family, bits/el, {stage metric suffix: (key, value)}, attention KL, top-1 overlap)
METHODS = {
    "fp16": ("fp16", "fp16", 16.0, {"end_to_end": (0.0, 0.0)}, 0.0, 1.0),
    "fp8_e4m3": ("fp8:format=e4m3", "fp8", 8.0, {"end_to_end": (1.2e-3, 1.3e-3)}, 2.0e-5, 0.995),
    "kivi_2bit": ("kivi:bits=2,group=32,residual=128", "kivi", 3.05,
                  {"quant_normalized": (0.09, 0.11), "end_to_end": (0.085, 0.105)}, 8.0e-3, 0.91),
    "turboquant_3bit_nc": ("turboquant:k=3,v=3,corr=0", "turboquant", 3.13,
                           {"rotation": (1.1e-14, 1.2e-14), "quant_rotated": (0.034, 0.035),
                            "end_to_end": (0.034, 0.035)}, 3.0e-3, 0.95),
    "kvarn_k4v2_g128": ("kvarn:k=4,v=2,g=128", "kvarn", 3.19,
                        {"rotation": (2.0e-14, 2.1e-14), "quant_normalized": (0.0091, 0.108),
                         "quant_rotated": (0.0093, 0.11), "end_to_end": (0.0095, 0.112)}, 1.5e-3, 0.97),
    "kvarn_k4v4_g128": ("kvarn:k=4,v=4,g=128", "kvarn", 4.19,
                        {"rotation": (2.0e-14, 2.1e-14), "quant_normalized": (0.0091, 0.0089),
                         "quant_rotated": (0.0093, 0.0091), "end_to_end": (0.0095, 0.0093)}, 2.0e-4, 0.99),
}
SPEEDUP = {"fp16": 1.0, "fp8_e4m3": 1.8, "kivi_2bit": 2.1, "turboquant_3bit_nc": 1.6,
           "kvarn_k4v2_g128": 3.9, "kvarn_k4v4_g128": 3.1}
TILES = ["tileA", "tileB"]

def layer_head_factor(rng):
    # layer 0 and one head are worse, as real captures often are
    f = np.exp(rng.normal(0, 0.25, size=(L, H)))
    f[0, :] *= 4.0
    f[:, 2] *= 1.8
    return f / f.mean()


def make_run(run_dir, with_arrays=True, with_throughput=True):
    os.makedirs(os.path.join(run_dir, "cases"), exist_ok=True)
    rng = np.random.default_rng(1234)
    resolved = {
        "name": "synthetic",
        "description": "Synthetic run directory written by tests/reports/test_report.py.",
        "data": {"source": "fixture", "layers": L, "kv_heads": H, "head_dim": D, "tokens": T},
        "methods": list(METHODS),
        "metrics": {"attention": True, "stages": True, "accumulation": with_arrays},
        "seeds": [0],
        "output": run_dir,
    }
    prov = {"git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": True,
            "build_type": "Release", "compiler": "GNU 12.2.0",
            "libraries": {"hdf5": "1.12.2", "nlohmann_json": "3.11.2"},
            "cpu": "Synthetic CPU @ 3.0GHz", "gpu": "NVIDIA H200", "date": "2025-01-01T00:00:00Z",
            "command": "kvarn-eval sweep configs/synthetic.yaml", "seed": 0}
    with open(os.path.join(run_dir, "resolved.json"), "w") as f:
        json.dump(resolved, f, indent=2)
    with open(os.path.join(run_dir, "provenance.json"), "w") as f:
        json.dump(prov, f, indent=2)

    rows = []
    n = 0
    for method, (spec, fam, bits, stages, kl, top1) in METHODS.items():
        for tile in TILES:
            n += 1
            case_id = f"c{n:03d}-{method}-{tile}"
            fac = layer_head_factor(rng)
            tile_scale = 1.0 if tile == "tileA" else 1.1

            def emit(metric, scope, v, per_lh=True, overlap=False):
                base = dict(case_id=case_id, method=method, spec=spec, family=fam, bits_per_element=bits,
                            metric=metric, scope=scope)
                if v is None:
                    rows.append(dict(base, layer=-1, head=-1, value=None))
                    return
                if per_lh:
                    m = np.full((L, H), v) if overlap else v * fac * tile_scale
                    for l in range(L):
                        for h in range(H):
                            rows.append(dict(base, layer=l, head=h, value=float(m[l, h])))
                    v = float(m.mean())
                rows.append(dict(base, layer=-1, head=-1, value=float(v)))

            for stream_i, stream in enumerate(("key", "value")):
                for stage in ("rotation", "quant_normalized", "quant_rotated"):
                    v = stages.get(stage)
                    emit(f"{stream}.stage.{stage}.nmse", stream, None if v is None else v[stream_i], per_lh=False)
                emit(f"{stream}.end_to_end.nmse", stream, stages["end_to_end"][stream_i])
            emit("key.magnitude_share.top1", "key", 0.12 if fam != "fp16" else 0.12, per_lh=False)
            emit("attention.kl.mean", "attention", kl)
            emit("attention.js.mean", "attention", kl / 4)
            emit("attention.top1_overlap", "attention", top1, overlap=True)
            emit("attention.top8_overlap", "attention", min(1.0, top1 + 0.01), per_lh=False)
            emit("attention.top32_overlap", "attention", min(1.0, top1 + 0.02), per_lh=False)
            emit("attention.output_nmse", "attention", stages["end_to_end"][1] * 0.8)
            emit("attention.logit_mae", "attention", math.sqrt(stages["end_to_end"][0]) * 0.5, per_lh=False)
            emit("attention.outlier_kl.p1", "attention", kl * 6, per_lh=False)

            with open(os.path.join(run_dir, "cases", case_id + ".json"), "w") as f:
                json.dump({"case_id": case_id, "spec": spec, "method": method,
                           "metrics": {"attention.kl.mean": kl}, "timing": {"seconds": 0.5}}, f)
            if with_arrays:
                os.makedirs(os.path.join(run_dir, "arrays"), exist_ok=True)
                with h5py.File(os.path.join(run_dir, "arrays", case_id + ".h5"), "w") as f:
                    pos = np.arange(T)
                    f["attention/kl_by_position"] = kl * (1 + 0.3 * np.sin(pos / 40.0))
                    f["attention/kl_layer_head"] = kl * fac * tile_scale
                    f["key/nmse_by_channel"] = stages["end_to_end"][0] * np.exp(rng.normal(0, 0.3, D))
                    f["key/nmse_by_token"] = stages["end_to_end"][0] * np.exp(rng.normal(0, 0.3, T))
                    ctx = np.array([256, 512, 1024, 2048, 4096, 8192, 16384])
                    e = stages["end_to_end"][1]  # 0 for FP16: drawn as "(= 0)"
                    f["accumulation/context_len"] = ctx
                    f["accumulation/mae_static"] = 0.02 * math.sqrt(e) * (1 + 0.05 * np.log2(ctx / 256))
                    grow = 0.0 if fam in ("fp16", "kvarn") else 0.12
                    f["accumulation/mae_accumulated"] = 0.02 * math.sqrt(e) * (1 + (0.05 + grow) * np.log2(ctx / 256))
                    steps = np.arange(0, 2000)
                    f["decode/step"] = steps
                    noise = np.exp(rng.normal(0, 0.4, steps.size))
                    f["decode/kl"] = kl * (1 + steps / 1500.0 * (0 if fam == "fp16" else 1)) * noise

    with open(os.path.join(run_dir, "summary.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    keys = ["case_id", "method", "spec", "family", "bits_per_element", "metric", "scope", "layer", "head", "value"]
    with open(os.path.join(run_dir, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in keys})

    if with_throughput:
        tp = []
        for ctx in (8192, 32768):
            for method, (spec, fam, bits, *_rest) in METHODS.items():
                bpt = bits / 8 * 2 * 8 * 128  # K+V, 8 KV heads, head_dim 128, bytes per token per layer
                base_t = 100.0 * ctx / 8192
                spd = SPEEDUP[method] * (1.0 if ctx == 8192 else 1.1)
                if method == "fp16":
                    spd = 1.0
                tp.append({"method": method, "batch": 8, "context": ctx, "hq": 64, "hkv": 8,
                           "time_us": base_t / spd, "bytes": bpt * ctx * 8, "tb_s": 3.1,
                           "pct_roofline": 70.0, "speedup_vs_fp16": spd, "speedup_vs_sdpa": spd * 1.05,
                           "bytes_per_token": bpt})
        with open(os.path.join(run_dir, "throughput.json"), "w") as f:
            json.dump(tp, f, indent=2)
    return rows


def run_report(run_dir, out=None):
    cmd = [sys.executable, "-m", "kvarn_report", run_dir] + (["--out", out] if out else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.path.join(ROOT, "reports"), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       env=env)
    return p.returncode, p.stdout


def digest_tree(d):
    out = {}
    for root, _, files in os.walk(d):
        for fn in files:
            p = os.path.join(root, fn)
            with open(p, "rb") as f:
                out[os.path.relpath(p, d)] = hashlib.sha256(f.read()).hexdigest()
    return out


FIGS = ["stage_errors", "kl_pareto", "context_error", "decode_kl", "kl_heatmaps", "model_budget",
        "capacity_throughput"]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    """One folder for the module: the two-model figures are compared with the full run's."""
    return str(tmp_path_factory.mktemp("reports"))


def check_links(check, report_dir, html, md):
    srcs = re.findall(r'(?:src|href)="([^"#:]+)"', html)
    check(srcs, "report.html references no files")
    for s in srcs:
        check(os.path.isfile(os.path.join(report_dir, s)), f"report.html references missing {s}")
        check(not os.path.isabs(s), f"report.html uses an absolute path {s}")
    for s in re.findall(r"\]\(([^)]+)\)", md):
        check(os.path.isfile(os.path.join(report_dir, s)), f"report.md references missing {s}")


def report_of(check, run_dir, what):
    """Builds the report into RUN_DIR/report (a failed build is a failed check); its folder."""
    rc, out = run_report(run_dir)
    print(out)
    check(rc == 0, f"{what}: exit code {rc}")
    return os.path.join(run_dir, "report")


def full_report(check, tmp):
    """The full run's report folder, built once per module."""
    run_dir = os.path.join(tmp, "full")
    if not os.path.isfile(os.path.join(run_dir, "report", "report.html")):
        shutil.rmtree(run_dir, ignore_errors=True)
        make_run(run_dir)
        report_of(check, run_dir, "full run")
    return os.path.join(run_dir, "report")


def test_full(check, tmp):
    run_dir = os.path.join(tmp, "full")
    rep = full_report(check, tmp)
    for name in ["report.html", "report.md", "tables/main.tex", "tables/main.md", "tables/main.html"]:
        check(os.path.isfile(os.path.join(rep, name)), f"full run: {name} missing")
    for fig in FIGS:
        for ext in ("png", "pdf"):
            p = os.path.join(rep, "figures", f"{fig}.{ext}")
            ok = os.path.isfile(p) and os.path.getsize(p) > 5000
            check(ok, f"full run: figure {fig}.{ext} missing or tiny")
            if ok:
                with open(p, "rb") as f:
                    head = f.read(8)
                check(head.startswith(b"\x89PNG") if ext == "png" else head.startswith(b"%PDF"),
                      f"{fig}.{ext} has the wrong format")
    if check.failed:
        return
    html = open(os.path.join(rep, "report.html"), encoding="utf-8").read()
    md = open(os.path.join(rep, "report.md"), encoding="utf-8").read()
    tex = open(os.path.join(rep, "tables/main.tex"), encoding="utf-8").read()
    tmd = open(os.path.join(rep, "tables/main.md"), encoding="utf-8").read()
    check_links(check, rep, html, md)
    # provenance and config
    for s in ("0123456789abcdef0123456789abcdef01234567", "Synthetic CPU", "NVIDIA H200", "2025-01-01", "synthetic"):
        check(s in html, f"report.html lacks provenance/config text {s!r}")
        check(s in md, f"report.md lacks provenance/config text {s!r}")
    check(re.search(r"dirty\)</td><td><code>yes", html) is not None, "report.html does not show the dirty flag")
    # readable names and all figures with captions
    for label in ("KVarN K4V2 g128", "KVarN K4V4 g128", "FP8 E4M3", "KIVI 2-bit", "TurboQuant 3-bit", "FP16"):
        check(label in html and label in md and label in tex, f"method label {label!r} missing somewhere")
    check(html.count("<figcaption>") == len(FIGS), "report.html: expected one caption per figure")
    check(md.count("### Figure") == len(FIGS), "report.md: expected one section per figure")
    # throughput.json present: the ITL slope / break-even table (fits of scripts/gpu_summary.py)
    check("ITL slope and break-even" in md and "ITL slope and break-even" in html,
          "report lacks the ITL / break-even section")
    itl_rows = [l for l in md.splitlines() if l.startswith("| kvarn_k4v2_g128 | 8 | 64/8 |")]
    check(len(itl_rows) == 1, f"report.md: expected one ITL row for k4v2 B8 Hq64, got {itl_rows}")
    # LaTeX booktabs
    for s in ("\\toprule", "\\midrule", "\\bottomrule", "\\begin{tabular}", "\\caption{"):
        check(s in tex, f"main.tex lacks {s}")
    check("_" not in re.sub(r"\\_", "", tex.split("\\begin{tabular}")[1]), "main.tex has an unescaped underscore")
    # bold best among the compressed methods: fewest bits KIVI 2-bit (3.05); lowest KL and highest
    # top-1 overlap FP8 E4M3; FP16 (all zeros) is the reference and never bold
    lines = {l.split("|")[1].strip(): l for l in tmd.splitlines() if l.startswith("| ") and "Method" not in l}
    cols = [c.strip() for c in tmd.splitlines()[0].split("|")[1:-1]]

    def cell(method_label, col_prefix):
        j = next(i for i, c in enumerate(cols) if c.startswith(col_prefix))
        return lines[method_label].split("|")[1:-1][j].strip()

    check(cell("KIVI 2-bit", "Bits/el").startswith("**"), "bits column: KIVI 2-bit (fewest bits) not bold")
    check(cell("FP8 E4M3", "Attn KL").startswith("**"), "KL column: FP8 (lowest KL) not bold")
    check(not cell("FP16", "Attn KL").startswith("**"), "KL column: the FP16 reference must not be ranked")
    check(not cell("KVarN K4V2 g128", "Attn KL").startswith("**"), "KL column: KVarN K4V2 wrongly bold")
    check(cell("FP8 E4M3", "Top-1").startswith("**"), "top-1 column: FP8 (highest overlap) not bold")
    check(sum(1 for m in lines if cell(m, "Attn KL").startswith("**")) == 1, "KL column: exactly one bold cell")
    check(cell("KVarN K4V4 g128", "Attn KL") == "2.10e-04", "KL aggregate (mean over tiles) is wrong: "
          + cell("KVarN K4V4 g128", "Attn KL"))
    check("\\textbf{3.05}" in tex, "main.tex: best bits not in \\textbf")
    check("{\\boldmath$" in tex, "main.tex: best scientific value not bold")
    check("<b>" in open(os.path.join(rep, "tables/main.html"), encoding="utf-8").read(), "main.html has no bold")
    # no skipped-figure notes in the full run
    check("skipped" not in html.split("<h2>Notes</h2>")[-1] if "<h2>Notes</h2>" in html else True,
          "full run reports a skipped figure")

    # determinism: a second run into another directory gives identical bytes
    rep2 = os.path.join(tmp, "full_again")
    rc2, out2 = run_report(run_dir, rep2)
    check(rc2 == 0, f"second run: exit code {rc2}: {out2}")
    a, b = digest_tree(rep), digest_tree(rep2)
    check(sorted(a) == sorted(b), "second run wrote a different file set")
    diff = [k for k in a if a.get(k) != b.get(k)]
    check(not diff, f"outputs are not reproducible: {diff}")


def test_without_static_replay(check, tmp):
    """A run made with accumulation.static_replay false has no mae_static arrays: the context
    figure draws the accumulated side and says the static replay was left out."""
    run_dir = os.path.join(tmp, "no_static")
    make_run(run_dir, with_throughput=False)
    for name in os.listdir(os.path.join(run_dir, "arrays")):
        with h5py.File(os.path.join(run_dir, "arrays", name), "a") as f:
            del f["accumulation/mae_static"]
    rep = report_of(check, run_dir, "run without the static replay")
    if check.failed:
        return
    p = os.path.join(rep, "figures", "context_error.png")
    check(os.path.isfile(p) and os.path.getsize(p) > 5000, "context_error.png missing or tiny")
    md = open(os.path.join(rep, "report.md"), encoding="utf-8").read()
    check("left out the static replay" in md, "caption does not say the static side is absent")
    check("Solid lines quantize the whole context" not in md, "caption still describes static lines")


def test_minimal(check, tmp):
    run_dir = os.path.join(tmp, "minimal")
    make_run(run_dir, with_arrays=False, with_throughput=False)
    for name in ("summary.jsonl", "provenance.json", "resolved.json"):
        os.remove(os.path.join(run_dir, name))
    shutil.rmtree(os.path.join(run_dir, "cases"))
    out_dir = os.path.join(tmp, "minimal_report")
    rc, out = run_report(run_dir, out_dir)
    print(out)
    check(rc == 0, f"minimal run: exit code {rc}")
    html = open(os.path.join(out_dir, "report.html"), encoding="utf-8").read()
    md = open(os.path.join(out_dir, "report.md"), encoding="utf-8").read()
    check_links(check, out_dir, html, md)
    # summary-only figures are drawn (heatmaps from per-layer/head rows), array figures are skipped with a note
    for fig in ("stage_errors", "kl_pareto", "kl_heatmaps"):
        check(os.path.isfile(os.path.join(out_dir, "figures", fig + ".png")), f"minimal run: {fig} not drawn")
    for fig in ("context_error", "decode_kl", "capacity_throughput"):
        check(not os.path.exists(os.path.join(out_dir, "figures", fig + ".png")), f"minimal run: {fig} drawn")
    for s in ("error vs context length", "KL vs decode step", "capacity × throughput", "provenance.json is missing"):
        check(s in html and s in md, f"minimal run: note {s!r} missing")
    check("summary rows" in html.lower(), "minimal run: config block missing")


# Two models in one accumulation block (as configs/accumulation.yaml): name -> (head_dim, context
# lengths of the pseudo-decode blocks, final accumulated MAE of KIVI).
ACC_MODELS = {"smollm2-135m-instruct": (64, np.arange(128, 2049, 128), 0.55),
              "fixture-qwen3-h128": (128, np.arange(32, 993, 32), 0.131)}
ACC_METHODS = {"fp16": ("fp16", "fp16", 16.0, 0.0),
               "kivi_2bit": ("kivi:bits=2,group=32,residual=128", "kivi", 3.05, 1.0),
               "kvarn_k4v2_g128": ("kvarn:k=4,v=2,g=128", "kvarn", 3.19, 0.4)}


def make_two_model_run(run_dir):
    """A run of an accumulation sweep over two models: per-model arrays under
    accumulation_models/<name>/ (the root arrays repeat the first model, as the engine writes them),
    summary rows whose `data` is the model, and case records with each model's head_dim."""
    os.makedirs(os.path.join(run_dir, "cases"))
    names = list(ACC_MODELS)
    with open(os.path.join(run_dir, "resolved.json"), "w") as f:
        json.dump({"name": "two_models", "methods": list(ACC_METHODS),
                   "accumulation": {"enabled": True, "models": [{"name": n, "path": "m/" + n} for n in names]}}, f)
    rows = []
    for i, (method, (spec, fam, bits, scale)) in enumerate(ACC_METHODS.items()):
        case_id = f"c{i:03d}-{method}"
        base = dict(case_id=case_id, method=method, spec=spec, family=fam, bits_per_element=bits, head="all")
        rows.append(dict(base, data="sample.h5", metric="key.end_to_end.nmse", scope="key", layer="all",
                         value=0.01 * scale))
        for name, (head_dim, ctx, mae) in ACC_MODELS.items():
            for metric, v in (("accumulation.mae_accumulated.final", mae * scale),
                              ("accumulation.mae_static.final", 0.9 * mae * scale),
                              ("decode.kl.mean", 0.03 * scale * head_dim / 64),
                              ("decode.top1_agreement", 1.0 - 0.1 * scale)):
                rows.append(dict(base, data=name, metric=metric, scope=metric.split(".")[0], layer="all", value=v))
        with open(os.path.join(run_dir, "cases", case_id + ".json"), "w") as f:
            json.dump({"case_id": case_id, "accumulation": {
                "models": [{"model": n, "head_dim": d[0]} for n, d in ACC_MODELS.items()]}}, f)
        os.makedirs(os.path.join(run_dir, "arrays"), exist_ok=True)
        with h5py.File(os.path.join(run_dir, "arrays", case_id + ".h5"), "w") as f:
            for j, (name, (head_dim, ctx, mae)) in enumerate(ACC_MODELS.items()):
                for pre in ([""] if j == 0 else []) + [f"accumulation_models/{name}/"]:
                    f[pre + "accumulation/context_len"] = ctx.astype(float)
                    f[pre + "accumulation/mae_static"] = 0.9 * mae * scale * np.sqrt(ctx / ctx[-1])
                    f[pre + "accumulation/mae_accumulated"] = mae * scale * np.sqrt(ctx / ctx[-1])
                    f[pre + "decode/step"] = np.arange(32.0)
                    f[pre + "decode/kl"] = 0.03 * scale * (1 + np.arange(32.0) / 32)
    with open(os.path.join(run_dir, "summary.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def png_height(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(24)[20:24], "big")  # IHDR: width, then height


def test_two_models(check, tmp):
    run_dir = os.path.join(tmp, "two_models")
    make_two_model_run(run_dir)
    rep = report_of(check, run_dir, "two-model run")
    md = open(os.path.join(rep, "report.md"), encoding="utf-8").read()
    html = open(os.path.join(rep, "report.html"), encoding="utf-8").read()
    acc_md = open(os.path.join(rep, "tables", "accumulation.md"), encoding="utf-8").read()
    titles = [f"{n} (head_dim {d[0]})" for n, d in ACC_MODELS.items()]
    # One table per model, each with that model's own values (never averaged across models).
    sections = {}
    for block in md.split("## Error accumulation per model", 1)[-1].split("## Figures")[0].split("### ")[1:]:
        sections[block.splitlines()[0].strip()] = block
    check(list(sections) == titles, f"two-model run: accumulation tables {list(sections)}, expected {titles}")
    for t, (name, (_, _, mae)) in zip(titles, ACC_MODELS.items()):
        lines = sections.get(t, "").splitlines()
        head = next((l.split("|") for l in lines if l.startswith("| Method |")), [])
        col = next((i for i, c in enumerate(head) if c.strip().startswith("MAE acc.")), None)
        kivi = [l for l in lines if l.startswith("| KIVI 2-bit |")]
        check(kivi and col and kivi[0].split("|")[col].strip().strip("*") == f"{mae:.2e}",
              f"two-model run: {name}'s KIVI MAE row is {kivi}, expected {mae:.2e}")
        # no effective bits in these rows: the steady-state bits stand in, labelled
        check(any(c.strip().startswith("Bits/el (steady state)") for c in head), f"{name}: bits column {head}")
        check(f"<h3>{t}</h3>" in html, f"report.html lacks the accumulation table of {t}")
        check(f"### {t}" in acc_md, f"tables/accumulation.md lacks {t}")
        all_md = open(os.path.join(rep, "tables", "all_metrics.md"), encoding="utf-8").read()
        check(f"`accumulation.mae_accumulated.final [{name}]`" in all_md, f"all_metrics.md: no row for {name}")
    # Both figures have one panel per model, named with its head_dim, in config order.
    run = load.load_run(run_dir)
    styles = style.method_styles(run.methods)
    for builder, fig_id in ((figures.fig_context, "context_error"), (figures.fig_decode, "decode_kl")):
        fig = builder(run, styles, os.path.join(tmp, "two_models_figs"))
        check(fig is not None and fig.panels == titles, f"{fig_id}: panels {fig and fig.panels}, expected {titles}")
        opening = "Mean absolute error" if fig_id == "context_error" else "KL divergence"
        cap = [l for l in md.splitlines() if l.startswith(opening)]
        check(cap and all(t in cap[0] for t in titles), f"report.md: the {fig_id} caption does not name both models")
        # two stacked panels: taller than the one-panel figure of the single-model (root arrays) run
        one = os.path.join(full_report(check, tmp), "figures", fig_id + ".png")
        two = os.path.join(rep, "figures", fig_id + ".png")
        check(png_height(two) > 1.4 * png_height(one), f"{fig_id}: the two-model figure is not two panels high")


def test_broken(check, tmp):
    run_dir = os.path.join(tmp, "broken")
    os.makedirs(run_dir)
    rc, out = run_report(run_dir)
    check(rc != 0, "a directory without a summary must fail")
    check("summary" in out, f"error message should name the summary: {out}")
    rc, out = run_report(os.path.join(tmp, "does_not_exist"))
    check(rc != 0, "a missing directory must fail")


def test_package_installs_with_its_entry_point(check, tmp):
    """reports/ is a pip package whose `kvarn-report` command runs the generator."""
    target = os.path.join(tmp, "site")
    # From a copy: a build writes build/ and *.egg-info next to pyproject.toml.
    src = os.path.join(tmp, "reports_src")
    shutil.copytree(os.path.join(ROOT, "reports"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    # Into a folder of its own: nothing outside the test's folder changes (PIP_BREAK_SYSTEM_PACKAGES:
    # a --target install does not touch the system Python's packages).
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", target, src],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       env=dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1"))
    assert p.returncode == 0, p.stdout
    exe = os.path.join(target, "bin", "kvarn-report")
    assert os.path.isfile(exe), os.listdir(target)
    env = dict(os.environ, PYTHONPATH=target)
    run_dir = os.path.join(tmp, "installed")
    make_run(run_dir, with_arrays=False, with_throughput=False)
    p = subprocess.run([sys.executable, exe, run_dir, "--out", os.path.join(tmp, "installed_report")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, env=env,
                       cwd=tmp)
    check(p.returncode == 0, f"kvarn-report exit code {p.returncode}: {p.stdout}")
    check(os.path.isfile(os.path.join(tmp, "installed_report", "report.html")), "no report.html")
    where = subprocess.run([sys.executable, "-c", "import kvarn_report; print(kvarn_report.__file__)"],
                           stdout=subprocess.PIPE, universal_newlines=True, env=env, cwd=tmp).stdout
    check(where.startswith(target), f"the installed package is not the one run: {where}")
