"""data/heldout: the committed held-out text and its token-id files match SHA256SUMS, are large
enough for the quality windows, and are what data/heldout/build_heldout.py rebuilds."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HELDOUT = os.path.join(ROOT, "data", "heldout")


def sums():
    with open(os.path.join(HELDOUT, "SHA256SUMS")) as f:
        return {name: h for h, name in (line.split() for line in f if line.strip())}


def test_files_match_their_checksums(check):
    s = sums()
    check({"heldout.txt", "heldout_fixture_ids.jsonl", "heldout_smollm2_ids.jsonl"} <= set(s), s)
    for name, want in s.items():
        with open(os.path.join(HELDOUT, name), "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        check(got == want, "%s: sha256 %s, SHA256SUMS says %s" % (name, got, want))


def test_text_is_utf8_and_sized_for_long_windows(check):
    with open(os.path.join(HELDOUT, "heldout.txt"), "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")  # raises on invalid UTF-8
    check(450_000 <= len(raw) <= 600_000, "heldout.txt is %d bytes" % len(raw))
    for part in ("prose", "code", "math"):
        check(("=== %s: " % part) in text, "no %s document" % part)
    with open(os.path.join(HELDOUT, "heldout_fixture_ids.jsonl")) as f:
        rec = json.loads(f.readline())
    n = len(rec["token_ids"])
    check(rec["tokens"] == n and rec["model"] == "fixture", rec.get("model"))
    # 16 windows of 4K and 4 of 32K tokens (+1: each window's last prediction needs a target)
    check(n >= 16 * 4096 + 1 and n >= 4 * 32768 + 1, "only %d fixture tokens" % n)
    check(all(0 <= t < 12288 for t in rec["token_ids"]), "token id outside the fixture's vocabulary")


def test_rebuild_is_identical():
    args = [sys.executable, os.path.join(HELDOUT, "build_heldout.py"), "--check"]
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        args.append("--text-only")  # heldout.txt alone; the id files are still checksummed above
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if r.returncode == 2:
        pytest.skip("build_heldout.py cannot rebuild here: " + r.stderr.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "identical" in r.stdout
