#!/usr/bin/env bash
# The GPU work on an sm_90 machine (H100/H200), one suite per command:
#   scripts/gpu.sh tests              GPU tests (ctest -L gpu), compute-sanitizer memcheck + racecheck
#                                     on small decode/store cases
#   scripts/gpu.sh bench              decode benchmark sweep (roofline, 392 cases), PyTorch SDPA anchor
#                                     (libtorch bench/sdpa_bench.cpp; scripts/gpu_sdpa.py as fallback
#                                     and cross-check), FlashInfer paged decode anchor when the
#                                     flashinfer package imports (bench/gpu_flashinfer_bench.py),
#                                     capacity table, scripts/gpu_summary.py
#   scripts/gpu.sh runner-cache       the runner's GPU-resident paged KV cache: PagedCache, GpuCache
#                                     (and ModelCuda with KVARN_RUNNER_REF_DIR) tests, decode timing
#   scripts/gpu.sh attention-metrics  attention metrics on the GPU vs the CPU: tests, the golden
#                                     quickstart with metrics.device=cuda, cpu-vs-cuda timing
#   scripts/gpu.sh accumulation       error accumulation on CUDA: AccumulationCuda/Math tests, then
#                                     `kvarn-eval sweep configs/accumulation_gpu.yaml`
#   scripts/gpu.sh quality            model-level KLD / perplexity on CUDA: the Quality* tests, then
#                                     `kvarn-eval sweep configs/quality_gpu.yaml` (32K-token windows;
#                                     KVARN_QUALITY_CONFIG=<config> runs another, e.g.
#                                     configs/quality_smollm2_gpu.yaml)
#   scripts/gpu.sh retrieval          passkey with each method in the loop on CUDA: the passkey
#                                     tests, then `kvarn-eval sweep configs/retrieval_gpu.yaml`
#                                     (needs the runner's tokenizer: libpcre2-dev)
# Every suite configures the CMake preset `h200` (build-h200/, CUDA on, sm_90, the runner when torch
# is importable) and builds incrementally what it needs. Logs and JSON go to $OUT (default
# /tmp/kvarn-gpu/<suite>); a summary is printed last; the exit status is 0 only when all passed.
# Env (bench): KVARN_BENCH_FILTER / KVARN_SDPA_FILTER Google Benchmark filters; KVARN_BENCH_BUDGET_S
# (170) / KVARN_SDPA_BUDGET_S (150) time budgets; KVARN_SDPA_JSON=<file> reuses a measured SDPA JSON;
# KVARN_NCU_FILTER=<case> profiles one case with ncu; KVARN_EVAL_BIN=<kvarn-eval> or
# KVARN_CAPACITY_JSON=<file> for the capacity table; KVARN_COMMIT for meta.json;
# KVARN_FLASHINFER_BUDGET_S (default 150; 0 skips FlashInfer), KVARN_FLASHINFER_SHAPES.
# Env (tests): KVARN_SANITIZER=0 skips compute-sanitizer. (accumulation): KVARN_ACC_BUDGET_S (330)
# bounds the sweep; a stopped sweep resumes with the same command.
set -uo pipefail
cd "$(dirname "$0")/.."
suite=${1:-}
case "$suite" in
  tests | bench | runner-cache | attention-metrics | accumulation | quality | retrieval) ;;
  *)
    echo "usage: scripts/gpu.sh tests|bench|runner-cache|attention-metrics|accumulation|quality|retrieval" >&2
    exit 2
    ;;
esac
OUT=${OUT:-/tmp/kvarn-gpu/$suite}
mkdir -p "$OUT"
B=${KVARN_GPU_BUILD_DIR:-build-h200}
JOBS=${KVARN_JOBS:-$(nproc)}
SUMMARY=()
status=0
note() { SUMMARY+=("$1"); echo "== $1"; }
fail() { status=1; note "$1"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
finish() {
  echo
  echo "================ scripts/gpu.sh $suite: summary ================"
  for s in "${SUMMARY[@]}"; do echo "  $s"; done
  echo "  logs and outputs: $OUT"
  echo "  overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
  exit $status
}

# Configure the preset once (CUDA toolkit and torch of this machine); build the given targets.
configure() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  fi
  { [ -f $B/build.ninja ] || cmake --preset h200 -B $B ${KVARN_CMAKE_ARGS:-}; } >"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; fail "configure: FAILED (see $OUT/build.log)"; finish; }
}
build() {  # targets...
  local t0
  t0=$(now)
  cmake --build $B -j "$JOBS" --target "$@" >>"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; fail "build of $*: FAILED (see $OUT/build.log)"; finish; }
  note "build ($*): $(secs "$t0" "$(now)") s"
}
test_targets=(kvarn_core_tests kvarn_eval_tests kvarn_cuda_tests kvarn_sweeps_tests kvarn-eval)
runner_targets() {  # the runner's tests when the preset found torch
  grep -q '^KVARN_ENABLE_TORCH:BOOL=ON' $B/CMakeCache.txt 2>/dev/null && echo kvarn_eval_runner_tests
}

# ctest over a label and a name pattern; the output of every test goes to $OUT/<name>.log.
# `strict`: a skipped test (no device, no reference) fails the suite, since it exists to run them;
# `lenient` (the whole `-L gpu` set, whose ModelCuda.* needs KVARN_RUNNER_REF_DIR without
# transformers) lists the skips.
run_ctest() {  # name strict ctest-args...
  local name=$1 strict=$2
  shift 2
  local log="$OUT/$name.log" r=ok
  ctest --test-dir $B -V --timeout 600 "$@" >"$log" 2>&1 || { r=FAILED; status=1; }
  grep -E '\[ +(nmse|timing|gpu/cpu|gpu cache|runner) +\]' "$log" | sed 's/^[0-9]*: //' | head -40
  # "N% tests passed, F tests failed out of T"; skipped tests are listed as "(Skipped)".
  local failed total skipped
  failed=$(sed -n 's/.* \([0-9]*\) tests failed out of [0-9]*$/\1/p' "$log" | tail -1)
  total=$(sed -n 's/.* tests failed out of \([0-9]*\)$/\1/p' "$log" | tail -1)
  if [ -z "$total" ]; then  # all passed: "100% tests passed out of T"
    total=$(sed -n 's/^100% tests passed out of \([0-9]*\)$/\1/p' "$log" | tail -1)
    failed=0
  fi
  skipped=$(grep -c -E '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log")
  [ "${total:-0}" -gt 0 ] || { r="FAILED (no test matched)"; status=1; }
  if [ "$strict" = strict ] && [ "$skipped" != 0 ]; then r="$r, FAILED (skips)"; status=1; fi
  note "ctest $name: $r ($((${total:-0} - ${failed:-0} - skipped)) passed, ${failed:-0} failed, $skipped skipped of ${total:-0})"
  grep -E '^[[:space:]]*[0-9]+ - .* \((Failed|Skipped|Not Run|Timeout|SEGFAULT)\)$' "$log" | head -20
}

suite_tests() {
  build "${test_targets[@]}" $(runner_targets)
  run_ctest gpu_tests lenient -L gpu
  # compute-sanitizer on small decode/store cases
  local F1='CudaDecodeGuards.BlockWalkStopsAtMaxBlocks:Cuda/PagedDecode.MatchesCpuReference/kvarn_k4v2_g64_d128_hq64_hkv8_b5_L500*:Cuda/StoreBitIdentity.*k4v2_g64_d64_it8:Cuda/PagedDecode.*fp16_g64_d64*:CudaAppend.*:Cuda/TqDecode.*_d64_*'
  if [ "${KVARN_SANITIZER:-1}" != 0 ]; then
    {
      timeout 90 compute-sanitizer --tool memcheck $B/tests/kvarn_cuda_tests --gtest_filter="$F1"
      timeout 90 compute-sanitizer --tool racecheck $B/tests/kvarn_cuda_tests --gtest_filter="$F1"
    } >"$OUT/sanitizer.log" 2>&1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$OUT/sanitizer.log" | sort | uniq -c | head
    # Clean: both tools finished with a zero summary.
    if grep -E "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]" "$OUT/sanitizer.log" >/dev/null ||
      ! grep -q "ERROR SUMMARY: 0" "$OUT/sanitizer.log" ||
      ! grep -q "RACECHECK SUMMARY: 0" "$OUT/sanitizer.log"; then
      fail "compute-sanitizer: FAILED or did not run (see $OUT/sanitizer.log)"
    else
      note "compute-sanitizer memcheck + racecheck: clean"
    fi
  fi
}

suite_bench() {
  local torch_v
  torch_v=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
  {
    echo "{\"date\": \"$(date -u +%FT%TZ)\","
    echo " \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)\","
    echo " \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\","
    echo " \"cuda\": \"$(nvcc --version | tail -2 | head -1 | sed 's/.*release //')\","
    echo " \"torch\": \"$torch_v\","
    echo " \"commit\": \"${KVARN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}\"}"
  } >"$OUT/meta.json"
  cat "$OUT/meta.json"
  build kvarn_gpu_bench kvarn-eval
  # The libtorch SDPA anchor, built against this machine's torch (same C++ ABI); when it cannot be
  # built, the Python anchor (scripts/gpu_sdpa.py) stands in.
  local SDPA=
  if [ "$torch_v" != none ] && [ -z "${KVARN_SDPA_JSON:-}" ]; then
    if cmake --build $B -j "$JOBS" --target kvarn_sdpa_bench >"$OUT/build_sdpa.log" 2>&1; then
      SDPA=$B/bench/kvarn_sdpa_bench
    else
      note "kvarn_sdpa_bench not built (Python SDPA fallback; see $OUT/build_sdpa.log)"
    fi
  fi
  if [ -n "${KVARN_NCU_FILTER:-}" ] && command -v ncu >/dev/null; then  # one representative case
    timeout 120 ncu --kernel-name regex:paged_decode --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section InstructionStats --section LaunchStats \
      $B/bench/kvarn_gpu_bench --benchmark_filter="$KVARN_NCU_FILTER" >"$OUT/ncu.txt" 2>&1
    note "ncu rc=$? (see $OUT/ncu.txt)"
  fi
  # FlashInfer compiles its kernels at first use: warm its JIT cache (CPU) while the bench runs.
  local FI_BUDGET=${KVARN_FLASHINFER_BUDGET_S:-150} FI_WARM=
  if [ "$FI_BUDGET" != 0 ] && python3 -c 'import flashinfer' >/dev/null 2>&1; then
    timeout 400 python3 bench/gpu_flashinfer_bench.py --out "$OUT/flashinfer_warm.json" \
      --shapes "32,8,1,1024" >"$OUT/flashinfer_warm.log" 2>&1 &
    FI_WARM=$!
  elif [ "$FI_BUDGET" != 0 ]; then
    note "flashinfer: not importable here (pip install flashinfer-python): no FlashInfer anchor"
  fi
  KVARN_BENCH_BUDGET_S=${KVARN_BENCH_BUDGET_S:-170} $B/bench/kvarn_gpu_bench \
    ${KVARN_BENCH_FILTER:+--benchmark_filter=$KVARN_BENCH_FILTER} --benchmark_out="$OUT/bench.json" \
    --benchmark_out_format=json >"$OUT/bench.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || status=1
  note "bench rc=$rc"
  rm -f "$OUT/sdpa.json"
  if [ -n "${KVARN_SDPA_JSON:-}" ]; then
    cp "$KVARN_SDPA_JSON" "$OUT/sdpa.json"
  elif [ -n "$SDPA" ]; then
    timeout 240 "$SDPA" --out="$OUT/sdpa.json" --budget="${KVARN_SDPA_BUDGET_S:-150}" \
      ${KVARN_SDPA_FILTER:+--benchmark_filter=$KVARN_SDPA_FILTER} \
      --benchmark_out="$OUT/sdpa_gbench.json" --benchmark_out_format=json >"$OUT/sdpa.log" 2>&1
    note "sdpa (libtorch $SDPA) rc=$?"
    tail -1 "$OUT/sdpa.log"
    # cross-check against the Python anchor at one short and one long shape
    timeout 60 python3 scripts/gpu_sdpa.py --shapes "32,8,8,2048 32,8,32,32768" \
      --out "$OUT/sdpa_python_check.json" 2>&1 | tail -1
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
    wait "$FI_WARM"
    note "flashinfer JIT warm-up rc=$?"
    timeout $((FI_BUDGET + 120)) python3 bench/gpu_flashinfer_bench.py --out "$OUT/flashinfer.json" \
      --budget "$FI_BUDGET" ${KVARN_FLASHINFER_SHAPES:+--shapes "$KVARN_FLASHINFER_SHAPES"} \
      >"$OUT/flashinfer.log" 2>&1
    note "flashinfer rc=$? ($(tail -1 "$OUT/flashinfer.log"))"
  fi
  # Capacity (core's byte accounting, CPU only): `kvarn-eval methods` at every sweep context.
  local KE=${KVARN_EVAL_BIN:-$B/bin/kvarn-eval}
  rm -f "$OUT/capacity.json"
  if [ -n "${KVARN_CAPACITY_JSON:-}" ]; then
    cp "$KVARN_CAPACITY_JSON" "$OUT/capacity.json"
  elif [ -x "$KE" ] && "$KE" methods --json --context 1024 >/dev/null 2>&1; then
    for c in 1024 2048 4096 16384 32768 65536 131072; do
      "$KE" methods --json --head-dim 128 --context $c
    done >"$OUT/capacity.json"
  else
    echo "capacity: no runnable kvarn-eval ($KE); set KVARN_EVAL_BIN or KVARN_CAPACITY_JSON"
  fi
  local CAP=()
  [ -s "$OUT/capacity.json" ] && CAP=(--capacity "$OUT/capacity.json")
  [ -s "$OUT/flashinfer.json" ] && CAP+=(--flashinfer "$OUT/flashinfer.json")
  python3 scripts/gpu_summary.py "$OUT/bench.json" "$OUT/sdpa.json" "$OUT/meta.json" \
    "$OUT/summary.json" "$OUT/throughput.json" "${CAP[@]}" --markdown "$OUT/table.md" || fail "gpu_summary.py failed"
}

suite_runner_cache() {
  build kvarn_cuda_tests $(runner_targets)
  [ -n "$(runner_targets)" ] || fail "the runner was not configured (python3 cannot import torch)"
  # ModelCuda.* (CUDA vs CPU) needs the transformers references: KVARN_RUNNER_REF_DIR=<folder with
  # reference.json> on a machine without transformers.
  local pattern='PagedCache|GpuCache'
  [ -n "${KVARN_RUNNER_REF_DIR:-}" ] && pattern="$pattern|ModelCuda"
  run_ctest runner_cache strict -L gpu -R "$pattern"
}

suite_attention_metrics() {
  build "${test_targets[@]}"
  local BIN=$B/bin/kvarn-eval
  # 1. Tests (the no-device error tests excluded): a skip here is a failure.
  run_ctest attention strict \
    -R '^(AttentionRow|Attention|AttentionRows|AttentionGpu|MetricsDeviceTest)\.' \
    -E 'NoDeviceIsAnError|WithoutCudaTheDeviceIsAClearError'
  # 2. The golden quickstart (CI compares CPU runs with it) with the GPU attention path.
  local t0 t1 r=ok d
  t0=$(now)
  d=$("$BIN" sweep configs/quickstart.yaml --set output="$OUT/golden" --set metrics.device=cuda \
    --fresh --no-report 2>>"$OUT/sweeps.log" | tail -n 1) || r="FAILED (sweep, see $OUT/sweeps.log)"
  t1=$(now)
  if [ "$r" = ok ] && ! "$BIN" compare tests/golden/quickstart-run "$d" \
    --tolerance 'default:rel=1e-6,abs=1e-9' >"$OUT/golden_compare.txt" 2>&1; then
    r="FAILED (see $OUT/golden_compare.txt)"
  fi
  [ "$r" = ok ] || status=1
  note "quickstart with metrics.device=cuda vs tests/golden/quickstart-run (rel 1e-6, abs 1e-9): $r ($(secs "$t0" "$t1") s)"
  # 3. Timing: attention metrics only, on the largest shipped tile file, cpu vs cuda.
  local tile cfg="$OUT/timing.yaml"
  tile=$(find data/tiles -maxdepth 1 -name '*.h5' -printf '%s %p\n' | sort -rn | head -n 1 | cut -d' ' -f2)
  cat >"$cfg" <<EOF
version: 1
name: gpu-attention-timing
description: "attention metrics only, metrics.device cpu vs cuda"
data:
  tiles: [$PWD/$tile]
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
  declare -A run secs_of
  r=ok
  for dev in cpu cuda; do
    t0=$(now)
    run[$dev]=$("$BIN" sweep "$cfg" --set metrics.device=$dev --fresh --no-report \
      2>>"$OUT/sweeps.log" | tail -n 1) || r="FAILED (the $dev sweep, see $OUT/sweeps.log)"
    secs_of[$dev]=$(secs "$t0" "$(now)")
  done
  note "timing on $tile (5 methods, attention + outlier importance): cpu ${secs_of[cpu]} s, cuda ${secs_of[cuda]} s"
  # Both directions: compare flags only growth of error metrics (shrink of topk), so swap too.
  if [ "$r" = ok ]; then
    "$BIN" compare "${run[cpu]}" "${run[cuda]}" --tolerance 'default:rel=1e-9,abs=1e-12' \
      >"$OUT/timing_compare_a.txt" 2>&1 || r="FAILED (see $OUT/timing_compare_a.txt)"
    "$BIN" compare "${run[cuda]}" "${run[cpu]}" --tolerance 'default:rel=1e-9,abs=1e-12' \
      >"$OUT/timing_compare_b.txt" 2>&1 || r="FAILED (see $OUT/timing_compare_b.txt)"
  fi
  [ "$r" = ok ] || status=1
  note "cpu vs cuda summaries of that sweep, both directions (rel 1e-9, abs 1e-12): $r"
}

# kvarn-eval and the runner's tests, for the suites that sweep with the model in the loop.
build_runner_sweep() {
  build kvarn-eval $(runner_targets)
  [ -n "$(runner_targets)" ] || fail "the runner was not configured (python3 cannot import torch)"
}

# Seconds left of BUDGET for this script (at least 60), into `left`.
budget_left() { left=$(($1 - SECONDS)); [ $left -ge 60 ] || left=60; }

# `kvarn-eval sweep CONFIG` into $OUT/run within what is left of BUDGET seconds of this script
# (at least 60). The engine writes the summary only when an invocation ends, so after a timeout a
# second invocation limited to the finished cases (`--only`: nothing left to compute) writes the
# summary and the report. Sets rc (the first invocation's exit status), rd (the run directory)
# and left (the seconds it was given), and notes them; a non-zero rc fails the suite.
budgeted_sweep() {  # config budget_s
  local config=$1 run_dir="$OUT/run" done_ids
  budget_left "$2"
  timeout $left $B/bin/kvarn-eval sweep "$config" --set output="$run_dir" >>"$OUT/sweep.log" 2>&1
  rc=$?
  rd=$(ls -d "$run_dir"/*/ 2>/dev/null | head -1)
  if [ "$rc" = 124 ] && [ -n "$rd" ] && ls "$rd"cases/*.json >/dev/null 2>&1; then
    done_ids=$(cd "$rd"cases && ls *.json | sed 's/\.json$//' | paste -sd, -)
    echo "finished cases: $done_ids" >>"$OUT/sweep.log"
    $B/bin/kvarn-eval sweep "$config" --set output="$run_dir" --only "$done_ids" \
      >>"$OUT/sweep.log" 2>&1
  fi
  [ "$rc" = 0 ] || status=1
  note "sweep $config rc=$rc (124: stopped after ${left}s) -> $rd"
}

# The same with the cases spread over `shards` processes on the one GPU (a small model leaves it
# mostly idle), each on nproc/shards CPU threads, merged into $OUT/run/merged (docs/scale-out.md).
sharded_sweep() {  # config budget_s shards
  local config=$1 n=$3 run_dir="$OUT/run" i pids=() shard_rc=0
  [ "$n" -gt 1 ] || { budgeted_sweep "$config" "$2"; return; }
  budget_left "$2"
  for ((i = 0; i < n; i++)); do
    OMP_NUM_THREADS=$(($(nproc) / n > 0 ? $(nproc) / n : 1)) timeout $left \
      $B/bin/kvarn-eval sweep "$config" --set output="$run_dir" --shard "$i/$n" \
      >"$OUT/sweep_shard$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || shard_rc=$?; done
  cat "$OUT"/sweep_shard*.log >>"$OUT/sweep.log"
  $B/bin/kvarn-eval merge "$run_dir/merged" "$run_dir"/*-shard-*-of-"$n" >>"$OUT/sweep.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] && rc=$shard_rc
  rd="$run_dir/merged/"
  [ "$rc" = 0 ] || status=1
  note "sweep $config rc=$rc (124: stopped after ${left}s) -> $rd"
}

suite_accumulation() {
  build_runner_sweep
  # The CUDA test (fixture model, token ids) and the math tests: no python reference needed.
  run_ctest accumulation strict -L runner -R '^(AccumulationCuda|AccumulationMath)\.'
  # The sweep (accumulation.device: cuda, fixture Qwen3 at 992 tokens, token-id prompts for builds
  # without a tokenizer) gets what is left of KVARN_ACC_BUDGET_S.
  budgeted_sweep configs/accumulation_gpu.yaml ${KVARN_ACC_BUDGET_S:-330}
  python3 scripts/sweep_table.py accumulation "${rd}summary.jsonl"
}

# Model-level quality on CUDA (configs/quality_gpu.yaml; KVARN_QUALITY_BUDGET_S, default 1500,
# bounds the sweep; a stopped sweep resumes with the same command and reuses the fp16 log-probs
# already in its run directory).
suite_quality() {
  build_runner_sweep
  run_ctest quality strict -L runner -R '^Quality'
  local config=${KVARN_QUALITY_CONFIG:-configs/quality_gpu.yaml}
  budgeted_sweep "$config" ${KVARN_QUALITY_BUDGET_S:-1500}
  du -sh "${rd}quality" 2>/dev/null | sed 's/^/fp16 log-probs: /'
  python3 scripts/sweep_table.py quality "${rd}summary.jsonl"
}

# Passkey on CUDA (configs/retrieval_gpu.yaml; KVARN_RETRIEVAL_BUDGET_S, default 900, bounds the
# sweep; finished cases are kept and a stopped sweep resumes; KVARN_RETRIEVAL_SHARDS=n runs the
# cases as n shard processes side by side, merged).
suite_retrieval() {
  build_runner_sweep
  grep -q '^KVARN_PCRE2_FOUND:INTERNAL=1' $B/CMakeCache.txt ||
    { fail "the runner was built without its tokenizer (libpcre2-dev): passkey prompts are text"; finish; }
  run_ctest retrieval strict -L runner -R '^(Passkey|Induction|BinomialInterval)\.'
  sharded_sweep configs/retrieval_gpu.yaml ${KVARN_RETRIEVAL_BUDGET_S:-900} \
    ${KVARN_RETRIEVAL_SHARDS:-1}
  python3 scripts/sweep_table.py retrieval "${rd}summary.jsonl"
}

configure
"suite_${suite//-/_}"
finish
