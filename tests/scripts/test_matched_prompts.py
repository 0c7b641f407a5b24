"""Tests of data/prompts/make_matched_prompts.py (run by pytest): the shipped
matched_long_fixture_ids.jsonl is exactly what the script writes (16 disjoint 2176-token windows
of the held-out text's fixture token ids, window i from token 15000 i), byte for byte."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = os.path.join(ROOT, "data", "prompts")
SHIPPED = os.path.join(PROMPTS, "matched_long_fixture_ids.jsonl")
HELDOUT = os.path.join(ROOT, "data", "heldout", "heldout_fixture_ids.jsonl")


def test_windows_are_disjoint_slices_of_the_heldout_ids():
    with open(HELDOUT, encoding="utf-8") as f:
        ids = json.loads(f.readline())["token_ids"]
    with open(SHIPPED, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [r["id"] for r in rows] == ["heldout-w%02d" % i for i in range(16)]
    for i, r in enumerate(rows):
        assert r["token_ids"] == ids[i * 15000:i * 15000 + 2176]
        assert len(r["token_ids"]) == 2176  # sink 128 + 16 tiles of 128: no fp16 tail
    assert 15 * 15000 + 2176 <= len(ids)


def test_script_rewrites_the_shipped_file_byte_for_byte():
    with tempfile.TemporaryDirectory() as tmp:
        # The script writes next to itself: run a copy inside a scratch tree of the same layout.
        dst = os.path.join(tmp, "data", "prompts")
        os.makedirs(dst)
        os.makedirs(os.path.join(tmp, "data", "heldout"))
        shutil.copy(os.path.join(PROMPTS, "make_matched_prompts.py"), dst)
        os.symlink(HELDOUT, os.path.join(tmp, "data", "heldout", "heldout_fixture_ids.jsonl"))
        subprocess.run([sys.executable, os.path.join(dst, "make_matched_prompts.py")], check=True)
        with open(os.path.join(dst, "matched_long_fixture_ids.jsonl"), "rb") as a, \
                open(SHIPPED, "rb") as b:
            assert a.read() == b.read()
        assert not os.path.exists(os.path.join(dst, "matched_long_fixture_ids.jsonl.tmp"))
