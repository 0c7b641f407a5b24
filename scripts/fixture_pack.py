#!/usr/bin/env python3
"""Packs a checkpoint folder small enough to travel to the device machine, and unpacks it there.

The fixture model (data/models/fixture-qwen3-h128, 45 MB) plus the tracked tree exceed the 64 MiB a
device call carries. Its fp16 weights compress well only byte-plane-wise: the high bytes (sign,
exponent) shrink by a third under LZMA, the low (mantissa) bytes not at all. So `pack` stores the
safetensors header, the low bytes raw and the high bytes LZMA-compressed (~37 MB in all), the other
files LZMA-compressed, and SHA-256 of every original; `unpack` rebuilds the folder bit for bit,
checks the hashes and writes each file atomically. Standard library only (the GPU image has no
zstd module).

  python3 scripts/fixture_pack.py pack data/models/fixture-qwen3-h128 .devtmp/fixture-pack
  python3 scripts/fixture_pack.py unpack .devtmp/fixture-pack data/models/fixture-qwen3-h128
"""

import hashlib
import json
import lzma
import os
import struct
import sys

FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
WEIGHTS = "model.safetensors"


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def write_atomically(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def pack(src, dst):
    os.makedirs(dst, exist_ok=True)
    manifest = {}
    for name in FILES:
        if os.path.isfile(os.path.join(src, name)):
            raw = open(os.path.join(src, name), "rb").read()
            write_atomically(os.path.join(dst, name + ".xz"), lzma.compress(raw))
            manifest[name] = sha256(raw)
    raw = open(os.path.join(src, WEIGHTS), "rb").read()
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    if (len(raw) - start) % 2:
        sys.exit(f"{src}/{WEIGHTS}: odd data size; not an fp16/bf16 checkpoint")
    body = memoryview(raw)[start:]
    write_atomically(os.path.join(dst, "weights.head"), raw[:start])
    write_atomically(os.path.join(dst, "weights.lo"), bytes(body[0::2]))
    write_atomically(os.path.join(dst, "weights.hi.xz"), lzma.compress(bytes(body[1::2])))
    manifest[WEIGHTS] = sha256(raw)
    write_atomically(os.path.join(dst, "manifest.json"), json.dumps(manifest, indent=1).encode())


def unpack(src, dst):
    manifest = json.load(open(os.path.join(src, "manifest.json")))
    os.makedirs(dst, exist_ok=True)
    for name, digest in manifest.items():
        if name == WEIGHTS:
            lo = open(os.path.join(src, "weights.lo"), "rb").read()
            hi = lzma.decompress(open(os.path.join(src, "weights.hi.xz"), "rb").read())
            body = bytearray(2 * len(lo))
            body[0::2], body[1::2] = lo, hi
            raw = open(os.path.join(src, "weights.head"), "rb").read() + bytes(body)
        else:
            raw = lzma.decompress(open(os.path.join(src, name + ".xz"), "rb").read())
        if sha256(raw) != digest:
            sys.exit(f"{src}: {name} does not match its SHA-256 after unpacking")
        write_atomically(os.path.join(dst, name), raw)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
