#!/usr/bin/env bash
# GPU attention metrics on the H200, one command (no network needed):
#   scripts/gpu_attention_metrics.sh            # from the repository root
# Builds only the targets it needs (CUDA on, torch off), runs the attention tests (GPU vs CPU
# AttentionReport on random and real captures), reproduces the golden quickstart with
# metrics.device=cuda, times sweeps with metrics.device cpu vs cuda on the largest shipped tile file
# and checks that both give the same summaries (1e-9 relative), then prints a summary.
# Env: BUILD (default build-cudaeval), JOBS (default nproc), OUT (default /tmp/kvarn-gpu-attention),
# BUILD_ONLY=1 (stop after the build: split the work over two calls when one call's time is short;
# the second call rebuilds nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cudaeval}
JOBS=${JOBS:-$(nproc)}
OUT=${OUT:-/tmp/kvarn-gpu-attention}
rm -rf "$OUT"
mkdir -p "$OUT"
LOG="$OUT/log.txt"
declare -a SUMMARY=()
note() { SUMMARY+=("$1"); echo "== $1" | tee -a "$LOG"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

if command -v nvidia-smi >/dev/null; then nvidia-smi -L | tee -a "$LOG"; fi

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=ON \
  -DKVARN_ENABLE_TORCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DKVARN_WERROR=ON >>"$LOG"
t0=$(now)
ninja -C "$BUILD" -j "$JOBS" kvarn_core_tests kvarn_cuda_tests kvarn_eval_tests kvarn-eval | tail -n 3
# The sweep tests are one binary with every sweep test file: one that does not build (work in
# progress elsewhere) must not stop the rest.
sweeps_tests=yes
ninja -C "$BUILD" -j "$JOBS" kvarn_sweeps_tests >"$OUT/build_sweeps_tests.txt" 2>&1 || sweeps_tests=no
note "build: $(secs "$t0" "$(now)") s (kvarn_sweeps_tests built: $sweeps_tests)"
if [ "${BUILD_ONLY:-0}" = 1 ]; then exit 0; fi
BIN="$BUILD/bin/kvarn-eval"

# 1. Tests. AttentionGpu.* / AttentionRows.* skip with a message when no device is visible: a skip
#    here is a failure of this script (it exists to run them).
status=0
run_test() {  # binary filter
  local out
  out="$OUT/$(basename "$1")_$(echo "$2" | tr -c 'A-Za-z0-9' _).txt"
  if "$1" --gtest_filter="$2" >"$out" 2>&1; then r=ok; else r=FAILED; status=1; fi
  grep -E '^\[ +(timing|gpu/cpu) +\]' "$out" | tee -a "$LOG" || true
  local passed skipped
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests*\./\1/p' "$out")
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests*, listed below:/\1/p' "$out")
  note "test $(basename "$1") '$2': $r (passed ${passed:-0}, skipped ${skipped:-0})"
  [ "${skipped:-0}" = 0 ] || status=1
}
run_test "$BUILD/tests/kvarn_core_tests" 'AttentionRow.*'
run_test "$BUILD/tests/kvarn_eval_tests" 'Attention.*'
run_test "$BUILD/tests/kvarn_cuda_tests" 'AttentionRows.*:-AttentionRows.NoDeviceIsAnError'
run_test "$BUILD/tests/kvarn_eval_tests" 'AttentionGpu.*:-AttentionGpu.WithoutCudaTheDeviceIsAClearError'
if [ "$sweeps_tests" = yes ]; then
  run_test "$BUILD/tests/kvarn_sweeps_tests" 'MetricsDeviceTest.*'
else
  note "test kvarn_sweeps_tests 'MetricsDeviceTest.*': NOT RUN (see $OUT/build_sweeps_tests.txt)"
  status=1
fi

# 2. The golden quickstart (CI compares CPU runs with it) reproduced with the GPU attention path.
t0=$(now)
r=ok
d=$("$BIN" sweep configs/quickstart.yaml --set output="$OUT/golden" --set metrics.device=cuda \
  --fresh --no-report 2>>"$LOG" | tail -n 1) || r="FAILED (sweep, see $LOG)"
t1=$(now)
if [ "$r" = ok ] && ! "$BIN" compare tests/golden/quickstart-run "$d" \
  --tolerance 'default:rel=1e-6,abs=1e-9' >"$OUT/golden_compare.txt" 2>&1; then
  r="FAILED (see $OUT/golden_compare.txt)"
fi
[ "$r" = ok ] || status=1
note "quickstart with metrics.device=cuda vs tests/golden/quickstart-run (rel 1e-6, abs 1e-9): $r ($(secs "$t0" "$t1") s)"

# 3. Timing: attention metrics only, on the largest shipped tile file, cpu vs cuda.
TILE=$(find data/tiles -maxdepth 1 -name '*.h5' -printf '%s %p\n' | sort -rn | head -n 1 | cut -d' ' -f2)
CFG="$OUT/timing.yaml"
cat >"$CFG" <<EOF
version: 1
name: gpu-attention-timing
description: "attention metrics only, metrics.device cpu vs cuda"
data:
  tiles: [$PWD/$TILE]
  sequences: all
  layers: all
  kv_heads: all
  max_tokens: 0
methods: [fp8_e4m3, kivi_2bit, turboquant_3bit_nc, kvarn_k4v2_g128, kvarn_k4v4_g128]
metrics:
  reconstruction: false
  attention: true
  outlier_fractions: [0.1, 1, 5]
  arrays: false
accumulation: {enabled: false}
throughput: {results: null}
seed: 0
output: $OUT/timing
report: false
EOF
declare -A RUN SECS
r=ok
for dev in cpu cuda; do
  t0=$(now)
  RUN[$dev]=$("$BIN" sweep "$CFG" --set metrics.device=$dev --fresh --no-report 2>>"$LOG" |
    tail -n 1) || r="FAILED (the $dev sweep, see $LOG)"
  SECS[$dev]=$(secs "$t0" "$(now)")
done
note "timing on $TILE (5 methods, attention + outlier importance): cpu ${SECS[cpu]} s, cuda ${SECS[cuda]} s"
# Both directions: compare flags only growth of error metrics (shrink of topk), so swap too.
if [ "$r" = ok ]; then
  "$BIN" compare "${RUN[cpu]}" "${RUN[cuda]}" --tolerance 'default:rel=1e-9,abs=1e-12' \
    >"$OUT/timing_compare_a.txt" 2>&1 || r="FAILED (see $OUT/timing_compare_a.txt)"
  "$BIN" compare "${RUN[cuda]}" "${RUN[cpu]}" --tolerance 'default:rel=1e-9,abs=1e-12' \
    >"$OUT/timing_compare_b.txt" 2>&1 || r="FAILED (see $OUT/timing_compare_b.txt)"
fi
[ "$r" = ok ] || status=1
note "cpu vs cuda summaries of that sweep, both directions (rel 1e-9, abs 1e-12): $r"

echo
echo "================ GPU attention metrics: summary ================"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
echo "  logs and outputs: $OUT"
echo "  overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
