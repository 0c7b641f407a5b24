#!/usr/bin/env python3
"""Writes the malformed-input corpus under tests/corpus/ (committed; rerun only to change it).

Each file is damaged in one way taken from its format's specification (kvarn-tiles v1 in
docs/hdf5-schema.md, safetensors, HF config.json / tokenizer.json, prompt JSONL, run directories
in docs/results.md). tests/corpus/cases.jsonl says which command reads each file and the exact
error text it must produce; tests/sweeps/test_bad_input.cpp replays them.

    python3 tests/corpus/make_corpus.py build/bin/kvarn-eval
"""
import json
import os
import shutil
import struct

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
F16 = np.float16


def tiles(path, *, tokens=8, dim=16, fmt="kvarn-tiles", version=1, kv_heads=1, k=None,
          v=None, layers=(0,), k_dtype=F16, claimed_tokens=None, layers_claim=None):
    """A small valid kvarn-tiles v1 file (1 layer, 1 KV head, 2 query heads), then the damage."""
    rng = np.random.default_rng(7)
    with h5py.File(path, "w", track_order=False) as f:
        f.attrs["format"] = fmt
        f.attrs["format_version"] = np.int32(version)
        f.attrs["model"] = "corpus"
        f.attrs["num_layers"] = np.int32(2)
        f.attrs["num_kv_heads"] = np.int32(kv_heads)
        f.attrs["num_q_heads"] = np.int32(2)
        f.attrs["head_dim"] = np.int32(dim)
        f.attrs["source"] = "tests/corpus/make_corpus.py"
        f.attrs["provenance"] = "{}"
        if layers_claim:
            d = f.create_dataset("layers", shape=(layers_claim,), dtype=np.int32, chunks=(1024,))
            d[0] = 0
        else:
            f.create_dataset("layers", data=np.array(layers, dtype=np.int32))
        g = f.create_group("sequences/000000")
        t = claimed_tokens or tokens
        g.attrs["num_tokens"] = np.int32(t)
        g.attrs["prompt_id"] = "p0"
        if claimed_tokens:
            # A huge claimed extent with one small chunk written: the rest is not in the file.
            g.create_dataset("token_ids", shape=(t,), dtype=np.int32, chunks=(tokens,))
            for name in ("k", "v"):
                d = g.create_dataset(name, shape=(1, kv_heads, t, dim), dtype=F16,
                                     chunks=(1, 1, tokens, dim))
                d[0, 0, :tokens, :] = rng.standard_normal((tokens, dim)).astype(F16)
            g["k"].attrs["post_rope"] = np.int32(1)
            return
        g.create_dataset("token_ids", data=np.arange(t, dtype=np.int32))
        kk = rng.standard_normal((1, kv_heads, t, dim)).astype(k_dtype) if k is None else k
        vv = rng.standard_normal((1, kv_heads, t, dim)).astype(F16) if v is None else v
        g.create_dataset("k", data=kk).attrs["post_rope"] = np.int32(1)
        g.create_dataset("v", data=vv)


def h5_corpus():
    d = os.path.join(HERE, "h5")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rng = np.random.default_rng(1)
    base = rng.standard_normal((1, 1, 8, 16)).astype(F16)
    tiles(os.path.join(d, "valid.h5"))
    k = base.copy()
    k[0, 0, 3, 5] = np.nan
    tiles(os.path.join(d, "nan_in_k.h5"), k=k)
    v = base.copy()
    v[0, 0, 7, 15] = np.inf
    tiles(os.path.join(d, "inf_in_v.h5"), v=v)
    v = base.copy()
    v[0, 0, 0, 0] = -np.inf
    tiles(os.path.join(d, "neg_inf_in_v.h5"), v=v)
    tiles(os.path.join(d, "claims_4m_tokens.h5"), claimed_tokens=1 << 22)
    tiles(os.path.join(d, "claims_1g_layers.h5"), layers_claim=1 << 30)
    tiles(os.path.join(d, "wrong_format.h5"), fmt="kvarn-quantized")
    tiles(os.path.join(d, "format_version_2.h5"), version=2)
    tiles(os.path.join(d, "zero_kv_heads.h5"), kv_heads=0)
    tiles(os.path.join(d, "layer_out_of_range.h5"), layers=(5,))
    tiles(os.path.join(d, "float32_k.h5"), k_dtype=np.float32)
    with open(os.path.join(d, "valid.h5"), "rb") as f:
        data = f.read()
    with open(os.path.join(d, "truncated.h5"), "wb") as f:
        f.write(data[: len(data) // 2])
    with open(os.path.join(d, "not_hdf5.h5"), "w") as f:
        f.write("format: kvarn-tiles\n")
    open(os.path.join(d, "empty.h5"), "wb").close()
    # Corrupt global heaps that crash (SIGSEGV) and hang libhdf5 1.10.8 (found by fuzzing).
    crashes = os.path.join(HERE, "..", "..", "fuzz", "crashes", "tile_reader")
    shutil.copy(os.path.join(crashes, "hdf5_global_heap_memcpy_overlap.h5"),
                os.path.join(d, "libhdf5_crash.h5"))
    shutil.copy(os.path.join(crashes, "hdf5_global_heap_hang.h5"), os.path.join(d, "libhdf5_hang.h5"))


def safetensors_bytes(header, data=b""):
    text = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(text)) + text + data


def checkpoint_corpus():
    """Checkpoint folders: config.json of the fixture Qwen3 (D = 128) with one damaged file."""
    d = os.path.join(HERE, "checkpoints")
    shutil.rmtree(d, ignore_errors=True)
    src = os.path.join(HERE, "..", "..", "data", "models", "fixture-qwen3-h128")
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)

    def folder(name, *, cfg=None, cfg_text=None, st=None, link_model=False, tok_text=None):
        p = os.path.join(d, name)
        os.makedirs(p)
        with open(os.path.join(p, "config.json"), "w") as f:
            f.write(cfg_text if cfg_text is not None else json.dumps(cfg or config, indent=1))
        if st is not None:
            with open(os.path.join(p, "model.safetensors"), "wb") as f:
                f.write(st)
        if link_model:
            os.symlink("../../../../data/models/fixture-qwen3-h128/model.safetensors",
                       os.path.join(p, "model.safetensors"))
        if tok_text is not None:
            with open(os.path.join(p, "tokenizer.json"), "w") as f:
                f.write(tok_text)

    ok_tensor = {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}
    folder("st_header_len_huge", st=struct.pack("<Q", 1 << 62) + b"{}")
    folder("st_header_len_past_eof", st=struct.pack("<Q", 4096) + b'{"a":1}')
    folder("st_not_json", st=safetensors_bytes(b"{not json"))
    folder("st_shape_overflow", st=safetensors_bytes(
        {"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 8]}}, b"\0" * 8))
    folder("st_shape_mismatch", st=safetensors_bytes(
        {"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 8]}}, b"\0" * 8))
    folder("st_offsets_past_data", st=safetensors_bytes(
        {"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 1 << 40]}}, b"\0" * 8))
    folder("st_unknown_dtype", st=safetensors_bytes(
        {"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16))
    folder("st_duplicate_tensor", st=struct.pack("<Q", 0) + b"")
    dup = (b'{"w":' + json.dumps(ok_tensor).encode() + b',"w":' + json.dumps(ok_tensor).encode()
           + b"}")
    with open(os.path.join(d, "st_duplicate_tensor", "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(dup)) + dup + b"\0" * 8)
    folder("st_truncated_length", st=b"\1\2\3")
    folder("config_not_json", cfg_text='{"vocab_size": 10,')
    folder("config_missing_hidden_size",
           cfg={k: v for k, v in config.items() if k != "hidden_size"})
    folder("config_huge_layers", cfg=dict(config, num_hidden_layers=1 << 30))
    folder("config_head_dim_odd", cfg=dict(config, head_dim=127))
    folder("config_vocab_string", cfg=dict(config, vocab_size="151936"))
    folder("tokenizer_not_json", link_model=True, tok_text='{"model": {"type": "BPE"')
    folder("tokenizer_no_model", link_model=True, tok_text='{"version": "1.0"}')


def prompts_corpus():
    d = os.path.join(HERE, "prompts")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    files = {
        "not_json_line3.jsonl": '{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "c", text}\n',
        "array_line.jsonl": '["id", "text"]\n',
        "missing_id.jsonl": '{"text": "hello"}\n',
        "duplicate_id.jsonl": '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n',
        "empty.jsonl": "",
        "invalid_utf8.jsonl": b'{"id": "a", "text": "\xff\xfe"}\n',
    }
    for name, text in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())


def runs_corpus(kvarn_eval):
    """A real two-case run (no arrays) of the sample tiles, then one damaged copy per class."""
    import subprocess
    import tempfile

    d = os.path.join(HERE, "runs")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    root = os.path.join(HERE, "..", "..")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "corpus.yaml")
        with open(cfg, "w") as f:
            f.write("version: 1\nname: corpus\ndata:\n  tiles: data/tiles/sample.h5\n"
                    "  sequences: [0]\n  layers: [0]\n  kv_heads: [0]\n  max_tokens: 160\n"
                    "methods:\n  - fp16\n  - kivi_2bit\nmetrics:\n  arrays: false\n"
                    "  attention: false\n  outlier_fractions: []\noutput: " + tmp + "/out\n"
                    "report: false\n")
        subprocess.run([kvarn_eval, "sweep", cfg, "--no-report"], cwd=root, check=True,
                       stdout=subprocess.DEVNULL)
        (run,) = os.listdir(os.path.join(tmp, "out"))
        good = os.path.join(d, "good")
        shutil.copytree(os.path.join(tmp, "out", run), good)
    shutil.rmtree(os.path.join(good, "provenance"))
    os.rmdir(os.path.join(good, "arrays"))  # empty (arrays: false); git keeps no empty folder
    os.remove(os.path.join(good, "provenance.json"))
    with open(os.path.join(good, "resolved.json")) as f:
        resolved = json.load(f)
    ids = [c["id"] for c in resolved["cases"]]

    def variant(name, edit):
        p = os.path.join(d, name)
        shutil.copytree(good, p)
        edit(p)

    def rewrite(path, fn):
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(fn(text))

    def summary_line(n, fn):
        def edit(p):
            def apply(text):
                lines = text.split("\n")
                lines[n - 1] = fn(lines[n - 1])
                return "\n".join(lines)
            rewrite(os.path.join(p, "summary.jsonl"), apply)
        return edit

    def row_value(value):
        def fn(line):
            row = json.loads(line)
            row["value"] = value
            return json.dumps(row, separators=(",", ":"))
        return fn

    def resolved_edit(fn):
        def edit(p):
            r = json.loads(json.dumps(resolved))
            fn(r)
            with open(os.path.join(p, "resolved.json"), "w") as f:
                json.dump(r, f, indent=2)
        return edit

    def case_edit(fn):
        def edit(p):
            path = os.path.join(p, "cases", ids[1] + ".json")
            with open(path) as f:
                rec = json.load(f)
            fn(rec)
            with open(path, "w") as f:
                json.dump(rec, f, indent=1)
        return edit

    variant("summary_value_text", summary_line(2, row_value("abc")))
    variant("summary_value_null", summary_line(3, row_value(None)))
    variant("summary_value_nan", summary_line(2, row_value("nan")))
    variant("summary_not_json", summary_line(4, lambda line: line[: len(line) // 2]))
    variant("summary_no_metric", summary_line(2, lambda line: json.dumps(
        {k: v for k, v in json.loads(line).items() if k != "metric"})))
    variant("summary_array_row", summary_line(1, lambda line: "[1, 2]"))
    variant("resolved_truncated",
            lambda p: rewrite(os.path.join(p, "resolved.json"), lambda t: t[: len(t) // 3]))
    variant("resolved_no_cases", resolved_edit(lambda r: r.pop("cases")))
    variant("resolved_case_no_id", resolved_edit(lambda r: r["cases"][1].pop("id")))
    variant("resolved_case_id_path", resolved_edit(
        lambda r: r["cases"][0].__setitem__("id", "../../escape")))
    variant("resolved_metrics_string", resolved_edit(lambda r: r.__setitem__("metrics", "x")))
    variant("resolved_empty", lambda p: open(os.path.join(p, "resolved.json"), "w").close())
    variant("case_no_case_id", case_edit(lambda rec: rec.pop("case_id")))
    variant("case_row_no_value", case_edit(lambda rec: rec["rows"][0].pop("value")))
    variant("case_rows_object", case_edit(lambda rec: rec.__setitem__("rows", {"a": 1})))
    variant("case_value_text", case_edit(lambda rec: rec["rows"][0].__setitem__("value", "x")))
    variant("case_truncated", lambda p: rewrite(os.path.join(p, "cases", ids[1] + ".json"),
                                                lambda t: t[: len(t) // 2]))
    variant("summary_number_overflow", summary_line(
        2, lambda line: line.rsplit('"value":', 1)[0] + '"value":7.0e479}'))
    variant("case_number_overflow", lambda p: rewrite(
        os.path.join(p, "cases", ids[1] + ".json"),
        lambda t: t.replace('"format_version": 1', '"format_version": 1e999', 1)))
    variant("no_config_yaml", lambda p: os.remove(os.path.join(p, "config.yaml")))
    print("case ids:", ids)


if __name__ == "__main__":
    import sys

    h5_corpus()
    checkpoint_corpus()
    prompts_corpus()
    if len(sys.argv) > 1:  # path of a built kvarn-eval
        runs_corpus(os.path.abspath(sys.argv[1]))
