#!/usr/bin/env bash
# One command on the H200: configure, build, GPU tests, compute-sanitizer (memcheck + racecheck on
# small cases), benchmark sweep + PyTorch SDPA anchor (libtorch: bench/sdpa_bench.cpp; Python
# scripts/gpu_sdpa.py as fallback and cross-check), FlashInfer paged decode anchor when the
# flashinfer Python package imports (bench/gpu_flashinfer_bench.py), capacity table; JSON to $OUT;
# table last.
# Env: KVARN_PREBUILT=<dir> binaries built elsewhere; KVARN_BENCH_FILTER / KVARN_SDPA_FILTER
# Google Benchmark filters; KVARN_SDPA_JSON=<file> reuse a measured SDPA JSON; KVARN_SANITIZER=0;
# KVARN_EVAL_BIN=<kvarn-eval> or KVARN_CAPACITY_JSON=<file> for the capacity table;
# KVARN_FLASHINFER_BUDGET_S (default 150; 0 skips FlashInfer).
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvarn_gpu_out}
mkdir -p "$OUT"
BUDGET=${KVARN_BENCH_BUDGET_S:-170}
B=build-h200
TORCH_V=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
{
  echo "{\"date\": \"$(date -u +%FT%TZ)\","
  echo " \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\","
  echo " \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\","
  echo " \"cuda\": \"$(nvcc --version | tail -2 | head -1 | sed 's/.*release //')\","
  echo " \"torch\": \"$TORCH_V\","
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
# The libtorch SDPA binary must match this machine's torch (C++ ABI): a prebuilt one is used only
# when built against the same version; otherwise it is (re)built in build-h200 (incremental) in
# the background while the tests run.
SDPA=
P=$KVARN_PREBUILT/bench/kvarn_sdpa_bench
if [ -n "$KVARN_PREBUILT" ] && [ -x "$P" ] &&
   [ "$(LD_BIND_NOW=1 "$P" --torch_version 2> /dev/null)" = "$TORCH_V" ]; then
  SDPA=$P
fi
SDPA_BUILD=
if [ -z "$SDPA" ] && [ -z "$KVARN_SDPA_JSON" ] && [ "$TORCH_V" != none ]; then
  { [ -f build-h200/build.ninja ] || cmake -S . -B build-h200 -G Ninja -DKVARN_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release; } > "$OUT/build_sdpa.log" 2>&1 &&
    ninja -C build-h200 -j8 kvarn_sdpa_bench >> "$OUT/build_sdpa.log" 2>&1 &
  SDPA_BUILD=$!
fi
# FlashInfer compiles its kernels at first use: warm its JIT cache (CPU) while the tests run.
FI_BUDGET=${KVARN_FLASHINFER_BUDGET_S:-150}
FI_WARM=
if [ "$FI_BUDGET" != 0 ] && python3 -c 'import flashinfer' > /dev/null 2>&1; then
  timeout 400 python3 bench/gpu_flashinfer_bench.py --out "$OUT/flashinfer_warm.json" \
    --shapes "32,8,1,1024" > "$OUT/flashinfer_warm.log" 2>&1 &
  FI_WARM=$!
elif [ "$FI_BUDGET" != 0 ]; then
  echo "flashinfer: not importable here (pip install flashinfer-python): no FlashInfer anchor"
fi
$B/tests/kvarn_cuda_tests --gtest_output=json:"$OUT/tests.json" > "$OUT/tests.log" 2>&1
echo "tests rc=$? ($SECONDS s)"
grep -E "^\[ +(FAILED|PASSED|SKIPPED) +\]|tests ran" "$OUT/tests.log" | head -20
grep -c "^\[       OK \]" "$OUT/tests.log"
grep "\[ nmse \]" "$OUT/tests.log" | sort -k4 -g | tail -3
F1='CudaDecodeGuards.BlockWalkStopsAtMaxBlocks:Cuda/PagedDecode.MatchesCpuReference/kvarn_k4v2_g64_d128_hq64_hkv8_b5_L500*:Cuda/StoreBitIdentity.*k4v2_g64_d64_it8:Cuda/PagedDecode.*fp16_g64_d64*:CudaAppend.*:Cuda/TqDecode.*_d64_*'
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
# the SDPA build (if any) ends before timing starts: no CPU contention during the sweep
if [ -n "$SDPA_BUILD" ]; then
  wait "$SDPA_BUILD" && SDPA=build-h200/bench/kvarn_sdpa_bench
  [ -n "$SDPA" ] ||
    { echo "kvarn_sdpa_bench build failed (Python SDPA fallback):"; tail -5 "$OUT/build_sdpa.log"; }
fi
if [ -n "$FI_WARM" ]; then
  wait "$FI_WARM"
  echo "flashinfer JIT warm-up rc=$? ($SECONDS s)"; tail -2 "$OUT/flashinfer_warm.log"
fi
KVARN_BENCH_BUDGET_S=$BUDGET $B/bench/kvarn_gpu_bench ${KVARN_BENCH_FILTER:+--benchmark_filter=$KVARN_BENCH_FILTER} --benchmark_out="$OUT/bench.json" \
  --benchmark_out_format=json > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($SECONDS s)"
rm -f "$OUT/sdpa.json"
if [ -n "$KVARN_SDPA_JSON" ]; then
  cp "$KVARN_SDPA_JSON" "$OUT/sdpa.json"
elif [ -n "$SDPA" ]; then
  timeout 240 "$SDPA" --out="$OUT/sdpa.json" --budget="${KVARN_SDPA_BUDGET_S:-150}" \
    ${KVARN_SDPA_FILTER:+--benchmark_filter=$KVARN_SDPA_FILTER} \
    --benchmark_out="$OUT/sdpa_gbench.json" --benchmark_out_format=json > "$OUT/sdpa.log" 2>&1
  echo "sdpa (libtorch $SDPA) rc=$? ($SECONDS s)"
  tail -1 "$OUT/sdpa.log"
  # cross-check against the Python anchor at one short and one long shape
  X="32,8,8,2048 32,8,32,32768"
  timeout 60 python3 scripts/gpu_sdpa.py --shapes "$X" --out "$OUT/sdpa_python_check.json" 2>&1 |
    tail -1
  python3 - "$OUT/sdpa.json" "$OUT/sdpa_python_check.json" <<'PY'
import json, sys
try:
    c, p = (json.load(open(f)) for f in sys.argv[1:3])
except (OSError, ValueError) as e:
    sys.exit(f"sdpa cross-check: {e}")
key = lambda e: (e["hq"], e["hkv"], e["batch"], e["ctx"])
py = {key(e): e for e in p}
us = lambda x: "-" if x is None else f"{x * 1e6:.1f}"
for e in c:
    if key(e) in py:
        print(f"sdpa cross-check hq{e['hq']} b{e['batch']} ctx{e['ctx']}: libtorch graph {us(e.get('time_graph_s'))} us, "
              f"libtorch eager {us(e.get('time_eager_s'))} us, python eager {us(py[key(e)]['time_s'])} us "
              f"({e['backend']}/{py[key(e)]['backend']})")
PY
fi
if [ ! -s "$OUT/sdpa.json" ]; then
  timeout 100 python3 scripts/gpu_sdpa.py --out "$OUT/sdpa.json" --budget 60 2>&1 | tail -2
fi
rm -f "$OUT/flashinfer.json"
if [ -n "$FI_WARM" ]; then
  timeout $((FI_BUDGET + 120)) python3 bench/gpu_flashinfer_bench.py --out "$OUT/flashinfer.json" \
    --budget "$FI_BUDGET" ${KVARN_FLASHINFER_SHAPES:+--shapes "$KVARN_FLASHINFER_SHAPES"} \
    > "$OUT/flashinfer.log" 2>&1
  echo "flashinfer rc=$? ($SECONDS s)"; tail -1 "$OUT/flashinfer.log"
fi
# Capacity (core's byte accounting, CPU only): `kvarn-eval methods` at every sweep context.
KE=${KVARN_EVAL_BIN:-$B/bin/kvarn-eval}
rm -f "$OUT/capacity.json"
if [ -n "$KVARN_CAPACITY_JSON" ]; then
  cp "$KVARN_CAPACITY_JSON" "$OUT/capacity.json"
elif [ -x "$KE" ] && "$KE" methods --json --context 1024 > /dev/null 2>&1; then
  for c in 1024 2048 4096 16384 32768 65536 131072; do
    "$KE" methods --json --head-dim 128 --context $c
  done > "$OUT/capacity.json"
else
  echo "capacity: no runnable kvarn-eval ($KE); set KVARN_EVAL_BIN or KVARN_CAPACITY_JSON"
fi
CAP=()
[ -s "$OUT/capacity.json" ] && CAP=(--capacity "$OUT/capacity.json")
[ -s "$OUT/flashinfer.json" ] && CAP+=(--flashinfer "$OUT/flashinfer.json")
python3 scripts/gpu_summary.py "$OUT/bench.json" "$OUT/sdpa.json" "$OUT/meta.json" \
  "$OUT/summary.json" "$OUT/throughput.json" "${CAP[@]}" --markdown "$OUT/table.md"
