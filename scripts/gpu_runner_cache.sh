#!/usr/bin/env bash
# One device command (the H200): the runner's GPU-resident paged KV cache (issue 6). Builds
# kvarn_cuda + the libtorch runner (CUDA + torch, no tokenizer there) and only the two test
# binaries, runs the PagedCache tests (GPU vs core's CPU cache, random + real tiles), the runner's
# GPU-cache tests (fixture model: GPU cache vs host cache on the same device) and the decode-step
# timing (GPU KVarN cache vs host cache + device mirror at 128/512/960 tokens). Summary last.
# The fixture model does not fit a device call next to the tree: carry its pack (see
# scripts/gpu_accumulation.sh) or data/models with the tiles taken out of the index
# (and build-runner-gpu-ref for ModelCuda.*, see below).
# Expected: ~3-4 min build on 16 cores (the decode kernels dominate), tests < 1 min.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kvarn-gpu-runner-cache}
mkdir -p "$out"
log="$out/gpu_runner_cache.log"
: >"$log"
model=data/models/fixture-qwen3-h128
if [ ! -f "$model/model.safetensors" ]; then
  echo "error: $model/model.safetensors missing: carry data/models to the device" | tee -a "$log"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
B=build-gpu
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=ON -DKVARN_WERROR=ON \
    -DKVARN_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CUDA_ARCHITECTURES=90 &&
    ninja -C $B -j"$(nproc)" kvarn_cuda_tests kvarn_eval_runner_tests; } >>"$log" 2>&1 ||
  { tail -40 "$log"; exit 1; }
echo "build ok (${SECONDS}s)" | tee -a "$log"

$B/tests/kvarn_cuda_tests --gtest_filter='*PagedCache*' >"$out/paged_cache.log" 2>&1
pc_rc=$?
echo "paged cache tests rc=$pc_rc (${SECONDS}s)" | tee -a "$log"
# ModelCuda.* (CUDA vs CPU with the host cache pinned) needs the transformers references carried
# in build-runner-gpu-ref/ (the device has no transformers); without them only *GpuCache*.
filter='*GpuCache*'
if [ -f build-runner-gpu-ref/reference.json ]; then
  export KVARN_RUNNER_REF_DIR=$PWD/build-runner-gpu-ref
  filter='*GpuCache*:ModelCuda.*'
fi
$B/tests/kvarn_eval_runner_tests --gtest_filter="$filter" >"$out/runner.log" 2>&1
rn_rc=$?
echo "runner GPU cache tests rc=$rn_rc (${SECONDS}s)" | tee -a "$log"

echo "---- summary ----"
for f in paged_cache runner; do
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$out/$f.log"
  grep -E "^\[  FAILED  \]|SKIPPED \]" -A3 "$out/$f.log" | grep -v "^--" | head -12
done
grep -E "^\[ nmse \]" "$out/paged_cache.log"
grep -E "^\[ gpu cache \]|^\[ timing \]|^\[ runner \] CUDA vs CPU|^kvarn runner:" "$out/runner.log"
echo "paged cache rc=$pc_rc, runner rc=$rn_rc"
[ "$pc_rc" -eq 0 ] && [ "$rn_rc" -eq 0 ]
