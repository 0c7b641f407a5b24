#!/usr/bin/env bash
# Runs libFuzzer targets built by fuzz/build.sh, one after another, each for SECONDS (default 60)
# on one job, from the repository root (the targets read data/ paths). New inputs go to a work
# directory (the committed seeds in fuzz/corpus/<target>/ are only read); a crash leaves its input
# there and fails the run: copy it to fuzz/crashes/<target>/ once fixed, so ctest replays it.
#   fuzz/run.sh all 60                 # the CI smoke run
#   fuzz/run.sh tile_reader 1800       # one target, 30 minutes
# Prints one line per target: executions, seconds, exec/s, corpus size. KVARN_FUZZ_ARGS adds
# libFuzzer options, e.g. "-fork=1 -ignore_timeouts=1" to go on past a known hang.
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
  if [ "$t" = tile_reader ] && [ -z "${KVARN_FUZZ_ARGS:-}" ]; then
    # libhdf5's own hang and huge allocations on corrupt metadata (docs/fuzzing.md).
    # libhdf5 1.10.8 also crashes on some corrupt metadata (fuzz/findings/tile_reader): counted
    # and printed, with their inputs, but not a failure of this run; out-of-memory is.
    extra="-fork=1 -ignore_timeouts=1 -ignore_crashes=1 -malloc_limit_mb=65536"
    asan=${ASAN_OPTIONS:-max_allocation_size_mb=2048:allocator_may_return_null=1}
  fi
  if ! ASAN_OPTIONS=$asan "$dir/fuzz_$t" "$work/$t/corpus" "fuzz/corpus/$t" \
      -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 $extra -artifact_prefix="$work/$t/artifacts/" >"$log" 2>&1; then
    # In -fork mode the exit status counts the known libhdf5 hang and crashes too: only
    # out-of-memory reports (the last status line) fail the tile reader.
    last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -n 1)
    counts=$(echo "$last" | sed -n 's|.*oom/timeout/crash: \([0-9]*\)/\([0-9]*\)/\([0-9]*\).*|\1 \2 \3|p')
    if [ "$t" = tile_reader ] && [ -z "${KVARN_FUZZ_ARGS:-}" ] && [ -n "$counts" ] &&
       [ "$(echo "$counts" | awk '{print $1}')" = 0 ]; then
      echo "fuzz_$t: $(echo "$counts" | awk '{print $2 " timeouts, " $3 " crashes"}') in libhdf5 (known, docs/fuzzing.md; inputs in $work/$t/artifacts/)"
    else
      status=1
      echo "fuzz_$t: FAILED (log $log, input in $work/$t/artifacts/)"
      grep -m3 -E "ERROR|==[0-9]+==|terminate|Assertion" "$log" || tail -n 20 "$log"
      continue
    fi
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  # -fork mode reports totals as "#N: cov: ..." lines instead.
  [ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$log" | tail -n 1)
  secs=$(sed -n 's/^stat::total_time_seconds: *//p' "$log" 2>/dev/null | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  echo "fuzz_$t: ${execs:-?} executions in ${seconds}s (${rate:-?} exec/s), corpus $(ls "$work/$t/corpus" | wc -l) new inputs"
done
exit $status
