#!/usr/bin/env python3
"""Fingerprints of `kvarn-eval quantize` outputs, for the byte-identity test
(tests/sweeps/test_quantize_file.cpp).

For every dataset under /sequences: dtype, shape and the sha256 of its little-endian C-order
bytes; for every group under /sequences: its integer and float attributes (floats as Python's
round-trip repr). Usage:

  make_quantized_reference.py OUT.json COMMIT TILES 'SPEC=Q.h5' ...

where each Q.h5 was written by `kvarn-eval quantize --method SPEC --in TILES --out Q.h5`
(with the reconstructions: `--reconstruction` where the option exists). An entry may carry a
`test_spec` added by hand: the spec that reproduces the entry's bytes in later versions, when the
meaning of `spec` changed (the committed reference: KVarN's default rotation changed after the
reference commit; `rotation=hadamard_exact` is the arithmetic the reference was made with).
"""
import hashlib
import json
import sys

import h5py
import numpy as np


def fingerprint(path):
    datasets, attrs = {}, {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                a = obj[()]
                a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<")))
                datasets[name] = {
                    "dtype": a.dtype.str,
                    "shape": list(a.shape),
                    "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
                }
            else:
                kv = {}
                for k, v in obj.attrs.items():
                    if isinstance(v, (np.integer, int)):
                        kv[k] = int(v)
                    elif isinstance(v, (np.floating, float)):
                        kv[k] = float(v)
                if kv:
                    attrs[name] = kv
        f["sequences"].visititems(lambda n, o: visit("sequences/" + n, o))
    return datasets, attrs


def main():
    out, commit, tiles = sys.argv[1:4]
    entries = []
    for arg in sys.argv[4:]:
        spec, path = arg.rsplit("=", 1)
        datasets, attrs = fingerprint(path)
        entries.append({"spec": spec, "datasets": datasets, "attributes": attrs})
    doc = {
        "what": "kvarn-eval quantize outputs: dataset fingerprints and group attributes",
        "produced_by": {"commit": commit, "tiles": tiles,
                        "command": "kvarn-eval quantize --method SPEC --in TILES --out Q.h5"},
        "entries": entries,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
