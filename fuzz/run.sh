#!/usr/bin/env bash
# Runs libFuzzer targets built by fuzz/build.sh, one after another, each for SECONDS (default 60)
# on one job, from the repository root (the targets read data/ paths). New inputs go to a work
# directory (the committed seeds in fuzz/corpus/<target>/ are only read); a crash leaves its input
# there and fails the run: copy it to fuzz/crashes/<target>/ once fixed, so ctest replays it.
#   fuzz/run.sh all 60                 # the CI smoke run
#   fuzz/run.sh tile_reader 1800       # one target, 30 minutes
# Prints one line per target: executions, seconds, exec/s, corpus size. KVARN_FUZZ_ARGS adds
# libFuzzer options, e.g. "-runs=1000000" to stop after a million executions.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVARN_FUZZ_BUILD_DIR:-build-fuzz}/fuzz
which=${1:-all}
seconds=${2:-60}
work=${KVARN_FUZZ_WORK:-$(mktemp -d /tmp/kvarn-fuzz.XXXXXX)}
if [ "$which" = all ]; then
  targets=$(cd "$dir" && ls fuzz_* | sed 's/^fuzz_//')
else
  targets=$which
fi
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp}
status=0
for t in $targets; do
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  log="$work/$t/log.txt"
  extra=${KVARN_FUZZ_ARGS:-}
  asan=${ASAN_OPTIONS:-}
  if [ "$t" = tile_reader ]; then
    # Corrupt metadata sizes make libhdf5 ask for huge blocks: with these options the allocation
    # fails and libhdf5 reports an error (docs/fuzzing.md). Its crashes and hangs are contained by
    # the reader's probe process; any crash that reaches libFuzzer is a finding.
    extra="-malloc_limit_mb=65536 $extra"
    asan=${ASAN_OPTIONS:-max_allocation_size_mb=2048:allocator_may_return_null=1}
  fi
  start=$(date +%s)
  if ! ASAN_OPTIONS=$asan "$dir/fuzz_$t" "$work/$t/corpus" "fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 $extra -artifact_prefix="$work/$t/artifacts/" >"$log" 2>&1; then
    status=1
    echo "fuzz_$t: FAILED (log $log, input in $work/$t/artifacts/)"
    grep -m3 -E "ERROR|==[0-9]+==|terminate|Assertion" "$log" || tail -n 20 "$log"
    continue
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  secs=$(($(date +%s) - start))
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  echo "fuzz_$t: ${execs:-?} executions in ${secs}s (${rate:-?} exec/s), corpus $(ls "$work/$t/corpus" | wc -l) new inputs"
done
exit $status
