"""Tests of data/prompts/make_matched_prompts.py (run by pytest): the shipped
matched_long_fixture_ids.jsonl and matched_long_smollm2_ids.jsonl are exactly what the script
writes (16 disjoint 2176-token windows of the held-out text's token ids of each model, window i
from token 15000 i), byte for byte."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = os.path.join(ROOT, "data", "prompts")
MODELS = ("fixture", "smollm2")


def shipped(model):
    return os.path.join(PROMPTS, "matched_long_%s_ids.jsonl" % model)


def heldout(model):
    return os.path.join(ROOT, "data", "heldout", "heldout_%s_ids.jsonl" % model)


@pytest.mark.parametrize("model", MODELS)
def test_windows_are_disjoint_slices_of_the_heldout_ids(model):
    with open(heldout(model), encoding="utf-8") as f:
        ids = json.loads(f.readline())["token_ids"]
    with open(shipped(model), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [r["id"] for r in rows] == ["heldout-w%02d" % i for i in range(16)]
    for i, r in enumerate(rows):
        assert r["token_ids"] == ids[i * 15000:i * 15000 + 2176]
        assert len(r["token_ids"]) == 2176  # sink 128 + 16 tiles of 128: no fp16 tail
    assert 15 * 15000 + 2176 <= len(ids)


def test_script_rewrites_the_shipped_files_byte_for_byte():
    with tempfile.TemporaryDirectory() as tmp:
        # The script writes next to itself: run a copy inside a scratch tree of the same layout.
        dst = os.path.join(tmp, "data", "prompts")
        os.makedirs(dst)
        os.makedirs(os.path.join(tmp, "data", "heldout"))
        shutil.copy(os.path.join(PROMPTS, "make_matched_prompts.py"), dst)
        for model in MODELS:
            os.symlink(heldout(model),
                       os.path.join(tmp, "data", "heldout", os.path.basename(heldout(model))))
        subprocess.run([sys.executable, os.path.join(dst, "make_matched_prompts.py")], check=True)
        for model in MODELS:
            out = os.path.join(dst, os.path.basename(shipped(model)))
            with open(out, "rb") as a, open(shipped(model), "rb") as b:
                assert a.read() == b.read()
            assert not os.path.exists(out + ".tmp")
