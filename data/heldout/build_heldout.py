#!/usr/bin/env python3
"""Builds data/heldout/heldout.txt: held-out text for model-level quality measurements.

  python3 data/heldout/build_heldout.py            # rebuild heldout.txt (+ token-id files)
  python3 data/heldout/build_heldout.py --check    # rebuild in memory, compare with the files

Three parts, interleaved at document granularity (seeded shuffle) so that every long window mixes
them, each document introduced by a line `=== <part>: <name> ===`:
  prose  every Markdown document of this repository at commit SOURCE_COMMIT (docs, READMEs),
         except generated model cards;
  code   C++/CUDA/Python sources of the repository at SOURCE_COMMIT, whole files, chosen by a
         seeded shuffle up to CODE_BYTES;
  math   worked problems (algebra, number theory, series, calculus, linear algebra,
         probability) generated here from a seeded random generator, up to MATH_BYTES.
Inputs are git objects of this repository (`git show SOURCE_COMMIT:path`) and this script, so a
rebuild is offline and byte-identical. Token ids (no special tokens, whole text as one sequence,
as `Runner::encode` gives) go to heldout_fixture_ids.jsonl (tokenizer of
data/models/fixture-qwen3-h128) and heldout_smollm2_ids.jsonl (data/cache/smollm2-135m-instruct,
written when that converted checkpoint exists). SHA256SUMS lists the sha256 of every output.
Exit status 2 (and a message) when SOURCE_COMMIT is not in the clone (e.g. a shallow clone).
"""
import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOURCE_COMMIT = "3f58ae4ff1ce6b06c7e391e9ef2a2236748314fa"  # repository state whose text is used (2026-12-01)
SEED = 2026
CODE_BYTES = 215_000
MATH_BYTES = 70_000
CODE_EXT = (".cpp", ".hpp", ".cu", ".cuh", ".py")
MAX_FILE_BYTES = 40_000  # no single source file dominates a window
MODELS = {
    "fixture": os.path.join(ROOT, "data", "models", "fixture-qwen3-h128", "tokenizer.json"),
    "smollm2": os.path.join(ROOT, "data", "cache", "smollm2-135m-instruct", "tokenizer.json"),
}


def git(*args):
    return subprocess.run(["git", "-C", ROOT] + list(args), check=True, capture_output=True).stdout


def source_files():
    try:
        git("cat-file", "-e", SOURCE_COMMIT + "^{commit}")
    except subprocess.CalledProcessError:
        print("build_heldout: commit %s is not in this clone (shallow?); cannot rebuild" % SOURCE_COMMIT,
              file=sys.stderr)
        sys.exit(2)
    names = git("ls-tree", "-r", "--name-only", SOURCE_COMMIT).decode().splitlines()
    return sorted(names)


def read(path):
    return git("show", "%s:%s" % (SOURCE_COMMIT, path)).decode("utf-8")


def prose_docs(names):
    keep = [n for n in names if n.endswith(".md") and not n.endswith("MODEL_CARD.md")
            and not n.startswith("fuzz/crashes/")]
    return [("prose", n, read(n)) for n in keep]


def code_docs(names, rng):
    cand = [n for n in names if n.endswith(CODE_EXT) and not n.startswith("data/heldout/")]
    rng.shuffle(cand)
    out, total = [], 0
    for n in cand:
        text = read(n)
        size = len(text.encode("utf-8"))
        if size > MAX_FILE_BYTES or total + size > CODE_BYTES:
            continue
        out.append(("code", n, text))
        total += size
    return out


# ---------------------------------------------------------------- generated math
def frac(x):
    x = Fraction(x)
    return str(x.numerator) if x.denominator == 1 else "%d/%d" % (x.numerator, x.denominator)


def poly(coeffs, var="x"):
    """coeffs[i] multiplies var^i; returns e.g. '3x^2 - x + 4'."""
    terms = []
    for p in range(len(coeffs) - 1, -1, -1):
        c = coeffs[p]
        if c == 0:
            continue
        mag = abs(c)
        num = str(mag) if Fraction(mag).denominator == 1 else "(%s)" % frac(mag)
        body = ("" if mag == 1 and p > 0 else num) + (var if p >= 1 else "") + ("^%d" % p if p > 1 else "")
        terms.append(("- " if c < 0 else "+ ") + body)
    if not terms:
        return "0"
    s = " ".join(terms)
    return s[2:] if s.startswith("+ ") else "-" + s[2:]


def p_linear(r):
    a, x, b = r.randint(2, 19), r.randint(-40, 40), r.randint(-90, 90)
    c = a * x + b
    return ("Solve %dx %s %d = %d for x." % (a, "+" if b >= 0 else "-", abs(b), c),
            "Move the constant: %dx = %d %s %d = %d. Divide by %d: x = %d. Check: %d * %d %s %d = %d."
            % (a, c, "-" if b >= 0 else "+", abs(b), c - b, a, x, a, x, "+" if b >= 0 else "-", abs(b), c))


def p_quadratic(r):
    u, v = r.randint(-12, 12), r.randint(-12, 12)
    b, c = -(u + v), u * v
    return ("Find the roots of %s = 0." % poly([c, b, 1]),
            "We look for two numbers with sum %d and product %d: they are %d and %d, so "
            "%s = (x %s %d)(x %s %d) and the roots are x = %d and x = %d. The discriminant is "
            "%s^2 - 4*%d = %d = %d^2." % (-b, c, u, v, poly([c, b, 1]), "-" if u >= 0 else "+", abs(u),
                                           "-" if v >= 0 else "+", abs(v), u, v, b if b >= 0 else "(%d)" % b,
                                           c, b * b - 4 * c, abs(u - v)))


def p_gcd(r):
    g = r.randint(2, 60)
    a, b = g * r.randint(5, 90), g * r.randint(5, 90)
    a, b = max(a, b), min(a, b)
    steps, x, y = [], a, b
    while y:
        steps.append("%d = %d * %d + %d" % (x, x // y, y, x % y))
        x, y = y, x % y
    return ("Compute gcd(%d, %d) with Euclid's algorithm, and the lcm." % (a, b),
            "; ".join(steps) + ". The last non-zero remainder is %d, so gcd = %d and lcm = %d * %d / %d = %d."
            % (x, x, a, b, x, a * b // x))


def p_series(r):
    a, d, n = r.randint(-20, 30), r.randint(1, 13), r.randint(8, 60)
    last = a + (n - 1) * d
    return ("Sum the arithmetic series %d + %d + %d + ... + %d." % (a, a + d, a + 2 * d, last),
            "It has n = (%d - %d)/%d + 1 = %d terms; the sum is n(first + last)/2 = %d * (%d + %d) / 2 = %d."
            % (last, a, d, n, n, a, last, n * (a + last) // 2))


def p_geometric(r):
    a, q, n = r.randint(1, 9), r.choice([2, 3, Fraction(1, 2), Fraction(1, 3)]), r.randint(4, 9)
    s = sum(a * q ** k for k in range(n))
    return ("Sum the first %d terms of the geometric series with first term %d and ratio %s." % (n, a, frac(q)),
            "S = a(1 - q^n)/(1 - q) = %d * (1 - %s^%d) / (1 - %s) = %s." % (a, frac(q), n, frac(q), frac(s)))


def p_derivative(r):
    c = [r.randint(-9, 9) for _ in range(r.randint(3, 5))]
    c[-1] = c[-1] or 1
    d = [i * c[i] for i in range(1, len(c))]
    x0 = r.randint(-3, 3)
    val = sum(d[i] * x0 ** i for i in range(len(d)))
    return ("Differentiate f(x) = %s and evaluate f'(%d)." % (poly(c), x0),
            "Term by term, d/dx x^k = k x^(k-1), so f'(x) = %s and f'(%d) = %d." % (poly(d), x0, val))


def p_integral(r):
    c = [r.randint(-6, 6) for _ in range(r.randint(2, 4))]
    c[-1] = c[-1] or 2
    lo, hi = sorted(r.sample(range(-3, 5), 2))
    anti = [Fraction(0)] + [Fraction(c[i], i + 1) for i in range(len(c))]
    F = lambda x: sum(anti[i] * x ** i for i in range(len(anti)))  # noqa: E731
    terms = poly(anti)
    return ("Compute the integral of %s from %d to %d." % (poly(c), lo, hi),
            "An antiderivative is F(x) = %s. F(%d) = %s and F(%d) = %s, so the integral is %s."
            % (terms, hi, frac(F(hi)), lo, frac(F(lo)), frac(F(hi) - F(lo))))


def p_matrix(r):
    m = [[r.randint(-5, 5) for _ in range(3)] for _ in range(3)]
    v = [r.randint(-4, 4) for _ in range(3)]
    rows = ["%d*%d + %d*%d + %d*%d = %d" % (m[i][0], v[0], m[i][1], v[1], m[i][2], v[2],
                                             sum(m[i][j] * v[j] for j in range(3))) for i in range(3)]
    det = (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
           + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    return ("Let A = %s and v = %s. Compute Av and det(A)." % (m, v),
            "Row by row: %s. Expanding along the first row, det(A) = %d%s." % (
                "; ".join(rows), det, " (A is singular)" if det == 0 else ""))


def p_modular(r):
    p = r.choice([7, 11, 13, 17, 19, 23, 29, 31])
    a, e = r.randint(2, p - 1), r.randint(20, 400)
    red = e % (p - 1)
    return ("Compute %d^%d mod %d." % (a, e, p),
            "%d is prime and does not divide %d, so by Fermat's little theorem %d^%d = 1 (mod %d). "
            "%d = %d*%d + %d, hence %d^%d = %d^%d = %d (mod %d)." % (
                p, a, a, p - 1, p, e, e // (p - 1), p - 1, red, a, e, a, red, pow(a, e, p), p))


def p_probability(r):
    n = r.randint(4, 12)
    k = r.randint(1, n - 1)
    num = 1
    for i in range(k):
        num = num * (n - i) // (i + 1)
    return ("A fair coin is tossed %d times. What is the probability of exactly %d heads?" % (n, k),
            "There are C(%d, %d) = %d favourable sequences out of 2^%d = %d, so P = %s (about %.4f)."
            % (n, k, num, n, 2 ** n, frac(Fraction(num, 2 ** n)), num / 2 ** n))


def p_fraction(r):
    a, b = Fraction(r.randint(1, 20), r.randint(2, 24)), Fraction(r.randint(1, 20), r.randint(2, 24))
    lcd = a.denominator * b.denominator // math.gcd(a.denominator, b.denominator)
    return ("Add %s and %s, and multiply them." % (frac(a), frac(b)),
            "Over the common denominator %d: %s + %s = %s. The product is %s."
            % (lcd, frac(a), frac(b), frac(a + b), frac(a * b)))


PROBLEMS = [p_linear, p_quadratic, p_gcd, p_series, p_geometric, p_derivative, p_integral, p_matrix,
            p_modular, p_probability, p_fraction]


def math_docs(rng):
    docs, total, k = [], 0, 0
    while total < MATH_BYTES:
        lines = []
        for i in range(rng.randint(8, 16)):
            q, a = rng.choice(PROBLEMS)(rng)
            lines.append("Problem %d. %s\nSolution. %s\n" % (i + 1, q, a))
        text = "\n".join(lines)
        docs.append(("math", "worked problems, set %d" % (k + 1), text))
        total += len(text.encode("utf-8"))
        k += 1
    return docs


# ---------------------------------------------------------------- assembly
def build():
    names = source_files()
    rng = random.Random(SEED)
    docs = prose_docs(names) + code_docs(names, rng) + math_docs(rng)
    rng.shuffle(docs)
    text = "".join("=== %s: %s ===\n\n%s\n\n" % (part, name, body.strip("\n")) for part, name, body in docs)
    parts = {}
    for part, _, body in docs:
        p = parts.setdefault(part, {"documents": 0, "bytes": 0})
        p["documents"] += 1
        p["bytes"] += len(body.encode("utf-8"))
    return text, parts


def token_ids(text, tokenizer_path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(tokenizer_path).encode(text, add_special_tokens=False).ids


def outputs(text):
    out = {"heldout.txt": text.encode("utf-8")}
    for model, tok in MODELS.items():
        if os.path.exists(tok):
            ids = token_ids(text, tok)
            rec = {"id": "heldout", "model": model, "tokens": len(ids), "token_ids": ids}
            out["heldout_%s_ids.jsonl" % model] = (json.dumps(rec) + "\n").encode("utf-8")
    return out


def sha(b):
    return hashlib.sha256(b).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="compare a rebuild with the committed files")
    ap.add_argument("--text-only", action="store_true", help="only heldout.txt (no tokenizers needed)")
    a = ap.parse_args()
    text, parts = build()
    out = {"heldout.txt": text.encode("utf-8")} if a.text_only else outputs(text)
    if a.check:
        bad = []
        for name, data in out.items():
            path = os.path.join(HERE, name)
            if not os.path.exists(path) or open(path, "rb").read() != data:
                bad.append(name)
        print("build_heldout --check: %s (%s)" % ("MISMATCH " + ", ".join(bad) if bad else "identical",
                                                   ", ".join(sorted(out))))
        sys.exit(1 if bad else 0)
    for name, data in out.items():
        tmp = os.path.join(HERE, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(HERE, name))  # never a half-written file
    sums = {}
    sums_path = os.path.join(HERE, "SHA256SUMS")
    if os.path.exists(sums_path):
        for line in open(sums_path):
            h, n = line.split()
            sums[n] = h
    sums.update({n: sha(d) for n, d in out.items()})
    with open(sums_path + ".tmp", "w") as f:
        f.writelines("%s  %s\n" % (h, n) for n, h in sorted(sums.items()))
    os.replace(sums_path + ".tmp", sums_path)
    for n, d in sorted(out.items()):
        extra = ""
        if n.endswith(".jsonl"):
            extra = ", %d tokens" % json.loads(d)["tokens"]
        print("%-28s %8d bytes%s" % (n, len(d), extra))
    print("parts:", json.dumps(parts))


if __name__ == "__main__":
    main()
