#!/usr/bin/env bash
# One device command: builds the libtorch runner and the CLI on a CUDA machine (no cuda/ kernels
# needed), runs the runner tests there (CUDA vs CPU and vs transformers on tiny models whose
# references are carried in build-runner-gpu-ref/), then captures the same prompt on CUDA and on
# CPU with `kvarn-eval capture` and compares the tiles. Summary last; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kvarn-gpu-runner}
mkdir -p "$out"
prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu-runner -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=OFF \
  -DKVARN_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$prefix" >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C build-gpu-runner -j"$(nproc)" kvarn-eval kvarn_eval_runner_tests >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
KVARN_RUNNER_REF_DIR=$PWD/build-runner-gpu-ref build-gpu-runner/tests/kvarn_eval_runner_tests \
  >"$out/runner_tests.log" 2>&1
tests_rc=$?
# Capture on CUDA vs CPU (token-id prompts: the GPU image lacks PCRE2 headers, so no tokenizer).
model=build-runner-gpu-ref/models/qwen3
python3 - "$out/prompts.jsonl" <<'PY'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for i, n in enumerate((96, 200)):
        f.write(json.dumps({"id": f"ids-{i}", "token_ids": [random.randrange(1, 200) for _ in range(n)]}) + "\n")
PY
cap_rc=0
for dev in cpu cuda; do
  build-gpu-runner/bin/kvarn-eval capture --model "$model" --prompts "$out/prompts.jsonl" \
    --out "$out/cap_$dev.h5" --device "$dev" --force >"$out/capture_$dev.log" 2>&1 || cap_rc=1
done
python3 - "$out" <<'PY' >"$out/capture_compare.txt" 2>&1
import sys, h5py, numpy as np
o = sys.argv[1]
a, b = h5py.File(f"{o}/cap_cpu.h5"), h5py.File(f"{o}/cap_cuda.h5")
worst = 0.0
for s in a["sequences"]:
    assert (a["sequences"][s]["token_ids"][()] == b["sequences"][s]["token_ids"][()]).all()
    for d in ("k", "v", "q", "k_pre_rope"):
        if d not in a["sequences"][s]:
            continue
        x = a["sequences"][s][d][()].astype(np.float64)
        y = b["sequences"][s][d][()].astype(np.float64)
        nmse = ((x - y) ** 2).sum() / max((x ** 2).sum(), 1e-30)
        worst = max(worst, nmse)
        print(s, d, x.shape, "nmse cuda vs cpu", nmse)
print("worst nmse", worst)
sys.exit(0 if worst < 1e-6 else 1)
PY
cmp_rc=$?
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/runner_tests.log"
tail -3 "$out/capture_compare.txt"
echo "runner tests rc=$tests_rc capture rc=$cap_rc compare rc=$cmp_rc"
