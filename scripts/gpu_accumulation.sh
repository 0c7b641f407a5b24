#!/usr/bin/env bash
# One device command (the H200): error accumulation on CUDA (issue 4, finding 4). Builds the
# libtorch runner and the CLI only (no cuda/ kernels), runs the CUDA-vs-CPU accumulation test
# (AccumulationCuda.*) and AccumulationMath.*, then `kvarn-eval sweep configs/accumulation_gpu.yaml`
# (accumulation.device: cuda, fixture Qwen3 at 992 tokens, token-id prompts since the GPU image has
# no tokenizer), and copies the summary, the report's Markdown and two figures into $OUT (7 files
# with the two logs). Summary table last.
# The fixture model (45 MB) plus the rest of the tree (27 MB) exceed a device call's 64 MiB: take
# data/models out of the index for the call (git rm -r --cached data/models; git reset afterwards)
# and carry its lossless pack, .devtmp/fixture-pack (37.6 MB, scripts/fixture_pack.py), which this
# script unpacks and checks (SHA-256).
# Sized for ~6 minutes: build ~2-3 min on 16 cores, tests <30 s, the sweep bounded by what is left
# of KVARN_ACC_BUDGET_S (default 330 s from the start; a stopped sweep resumes with the same command
# on the same machine, its build kept).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kvarn-gpu-accumulation}
mkdir -p "$out"
log="$out/gpu_accumulation.log"  # build + tests + sweep, in that order
: >"$log"
model=data/models/fixture-qwen3-h128
pack=.devtmp/fixture-pack  # made here by: python3 scripts/fixture_pack.py pack $model $pack
if [ ! -f "$model/model.safetensors" ] && [ -f "$pack/manifest.json" ]; then
  python3 scripts/fixture_pack.py unpack "$pack" "$model" 2>&1 | tee -a "$log"
fi
if [ ! -f "$model/model.safetensors" ]; then
  echo "error: $model missing: carry $pack (37.6 MB; the folder itself, 45 MB, does not fit)" |
    tee -a "$log"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
B=build-gpu-acc
{ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=OFF \
    -DKVARN_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$prefix" &&
    ninja -C $B -j"$(nproc)" kvarn-eval kvarn_eval_runner_tests; } >>"$log" 2>&1 ||
  { tail -40 "$log"; exit 1; }
echo "build ok (${SECONDS}s)" | tee -a "$log"

# The CUDA test (fixture model, token ids) and the math tests: no python reference needed (the
# other Accumulation tests are CPU-only and run in CI).
$B/tests/kvarn_eval_runner_tests --gtest_filter='AccumulationCuda.*:AccumulationMath.*' \
  >"$out/tests.log" 2>&1
tests_rc=$?
echo "tests rc=$tests_rc (${SECONDS}s)" | tee -a "$log"

# The sweep gets what is left of KVARN_ACC_BUDGET_S (default 330 s from the start). The engine
# writes the summary only when an invocation ends, so after a timeout a second invocation limited
# to the finished cases (`--only`: nothing left to compute) writes the summary and the report.
run_dir="$out/run"
left=$((${KVARN_ACC_BUDGET_S:-330} - SECONDS))
[ $left -lt 60 ] && left=60
timeout $left $B/bin/kvarn-eval sweep configs/accumulation_gpu.yaml --set output="$run_dir" \
  >>"$log" 2>&1
sweep_rc=$?
echo "sweep rc=$sweep_rc (${SECONDS}s; 124: stopped after ${left}s)" | tee -a "$log"
rd=$(ls -d "$run_dir"/*/ 2>/dev/null | head -1)
if [ "$sweep_rc" = 124 ] && [ -n "$rd" ] && ls "$rd"cases/*.json >/dev/null 2>&1; then
  done_ids=$(cd "$rd"cases && ls *.json | sed 's/\.json$//' | paste -sd, -)
  echo "finished cases: $done_ids" | tee -a "$log"
  $B/bin/kvarn-eval sweep configs/accumulation_gpu.yaml --set output="$run_dir" \
    --only "$done_ids" >>"$log" 2>&1
fi
# At most 8 files come back, each < 16 MiB, at most two folders down: copy what matters flat.
if [ -n "$rd" ]; then
  for f in summary.csv summary.jsonl report/report.md report/figures/context_error.png \
    report/figures/decode_kl.png; do
    [ -f "$rd/$f" ] && cp "$rd/$f" "$out/$(basename "$f")"
  done
fi
rm -rf "$run_dir"

grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|^\[ runner \] accumulation" "$out/tests.log"
grep -E -A1 ": Skipped$|: Failure$" "$out/tests.log" | grep -v "^--" | head -8  # the reasons
python3 - "$out/summary.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    sys.exit("no summary.jsonl: the sweep did not finish")
want = ["accumulation.mae_accumulated.final", "accumulation.mae_static.final",
        "accumulation.mae_accumulated.first", "decode.kl.mean", "decode.top1_agreement",
        "decode.first_divergence"]
val = {(r["method"], r["metric"]): r["value"] for r in rows
       if r.get("layer") == "all" and r["metric"] in want}
print("method".ljust(20) + "".join(m.split(".", 1)[1][:22].rjust(24) for m in want))
for m in dict.fromkeys(r["method"] for r in rows):
    cells = [val.get((m, w)) for w in want]
    print(m.ljust(20) + "".join(("%.4g" % c if isinstance(c, (int, float)) else "-").rjust(24)
                                for c in cells))
PY
echo "tests rc=$tests_rc sweep rc=$sweep_rc total ${SECONDS}s; in $out: $(ls "$out" | tr '\n' ' ')"
[ "$tests_rc" = 0 ] && [ "$sweep_rc" = 0 ]
