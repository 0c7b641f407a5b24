#!/usr/bin/env bash
# One command on the H200: configure, build, GPU tests, compute-sanitizer (memcheck + racecheck on
# small cases), benchmark sweep + PyTorch SDPA anchor; JSON to $OUT; short table last.
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvarn_gpu_out}
mkdir -p "$OUT"
BUDGET=${KVARN_BENCH_BUDGET_S:-170}
B=build-h200
{
  echo "{\"date\": \"$(date -u +%FT%TZ)\","
  echo " \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\","
  echo " \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\","
  echo " \"cuda\": \"$(nvcc --version | tail -2 | head -1 | sed 's/.*release //')\","
  echo " \"commit\": \"${KVARN_COMMIT:-unknown}\"}"
} > "$OUT/meta.json"
cat "$OUT/meta.json"
# KVARN_PREBUILT=<build dir>: use binaries built elsewhere (same toolkit and image) when they run.
if [ -n "$KVARN_PREBUILT" ] && "$KVARN_PREBUILT/tests/kvarn_cuda_tests" --gtest_list_tests \
    > /dev/null 2>&1; then
  B=$KVARN_PREBUILT
  [ -d "$B/lib" ] && export LD_LIBRARY_PATH="$PWD/$B/lib:$LD_LIBRARY_PATH"  # e.g. libbenchmark
  echo "using prebuilt binaries in $B"
else
  cmake -S . -B $B -G Ninja -DKVARN_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release > "$OUT/build.log" 2>&1 &&
    ninja -C $B -j16 kvarn_cuda_tests kvarn_gpu_bench >> "$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
  echo "build ok ($SECONDS s)"
fi
$B/tests/kvarn_cuda_tests --gtest_output=json:"$OUT/tests.json" > "$OUT/tests.log" 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^\[ +(FAILED|PASSED|SKIPPED) +\]|tests ran" "$OUT/tests.log" | head -20
grep -c "^\[       OK \]" "$OUT/tests.log"
grep "\[ nmse \]" "$OUT/tests.log" | sort -k4 -g | tail -3
F1='Cuda/PagedDecode.MatchesCpuReference/kvarn_k4v2_g64_d128_hq64_hkv8_b5_L500*:Cuda/StoreBitIdentity.*k4v2_g64_d64_it8:Cuda/PagedDecode.*fp16_g64_d64*:CudaAppend.*:Cuda/TqDecode.*_d64_*'
# KVARN_SANITIZER=0 skips compute-sanitizer; KVARN_SDPA_JSON=<file> reuses a measured SDPA JSON
[ "${KVARN_SANITIZER:-1}" = 0 ] || {
  timeout 90 compute-sanitizer --tool memcheck $B/tests/kvarn_cuda_tests --gtest_filter="$F1"
  timeout 90 compute-sanitizer --tool racecheck $B/tests/kvarn_cuda_tests --gtest_filter="$F1"
} > "$OUT/sanitizer.log" 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$OUT/sanitizer.log" | sort | uniq -c | head
echo "sanitizer done ($SECONDS s)"
if [ -n "$KVARN_NCU_FILTER" ] && command -v ncu > /dev/null; then  # one representative case
  timeout 120 ncu --kernel-name regex:paged_decode --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section InstructionStats --section LaunchStats \
    $B/bench/kvarn_gpu_bench --benchmark_filter="$KVARN_NCU_FILTER" > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$? ($SECONDS s)"
fi
KVARN_BENCH_BUDGET_S=$BUDGET $B/bench/kvarn_gpu_bench ${KVARN_BENCH_FILTER:+--benchmark_filter=$KVARN_BENCH_FILTER} --benchmark_out="$OUT/bench.json" \
  --benchmark_out_format=json > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($SECONDS s)"
if [ -n "$KVARN_SDPA_JSON" ]; then
  cp "$KVARN_SDPA_JSON" "$OUT/sdpa.json"
else
  timeout 100 python3 scripts/gpu_sdpa.py --out "$OUT/sdpa.json" --budget 60 2>&1 | tail -2
fi
python3 scripts/gpu_summary.py "$OUT/bench.json" "$OUT/sdpa.json" "$OUT/meta.json" \
  "$OUT/summary.json" "$OUT/throughput.json"
