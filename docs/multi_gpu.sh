#!/usr/bin/env bash
# One kvarn-eval sweep shard per GPU of this node, then merge and report.
#   docs/multi_gpu.sh CONFIG [--set key=value ...]      (NGPU=k to use the first k GPUs)
set -euo pipefail

CONFIG=${1:?usage: docs/multi_gpu.sh CONFIG [--set ...]}
shift
BIN=${KVARN_EVAL:-build/bin/kvarn-eval}
if [ -z "${NGPU:-}" ]; then
  NGPU=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
  [ "$NGPU" -ge 1 ] || NGPU=1
fi

pids=()
for ((i = 0; i < NGPU; i++)); do
  CUDA_VISIBLE_DEVICES=$i "$BIN" sweep "$CONFIG" "$@" --shard "$i/$NGPU" --no-report \
    >"shard-$i-of-$NGPU.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
[ "$status" -eq 0 ] || { echo "a shard failed; see shard-*-of-$NGPU.log (rerun to resume)" >&2; exit 1; }

OUTPUT=$("$BIN" validate "$CONFIG" "$@" | sed -n 's/^run directory: //p')
if [ "$NGPU" -gt 1 ]; then
  "$BIN" merge "$OUTPUT" "$OUTPUT"-shard-*-of-"$NGPU"
else
  OUTPUT=$OUTPUT  # one shard is the unsharded run itself
fi
"$BIN" report "$OUTPUT" || echo "warning: report failed" >&2
echo "$OUTPUT"
