#!/usr/bin/env bash
# One kvarn-eval sweep shard per Slurm array task; the last task to finish merges.
#   sbatch --array=0-7 docs/slurm_array.sh configs/aime25.yaml [--set key=value ...]
# Resubmit failed tasks alone, naming the original shard count (docs/scale-out.md):
#   KVARN_SHARDS=8 sbatch --array=2,5 docs/slurm_array.sh configs/aime25.yaml [--set ...]
#SBATCH --job-name=kvarn-sweep
#SBATCH --cpus-per-task=4
#SBATCH --gres=gpu:1
#SBATCH --time=04:00:00
#SBATCH --output=slurm-%A_%a.out
set -euo pipefail

CONFIG=${1:?usage: sbatch --array=0-N docs/slurm_array.sh CONFIG [--set ...]}
shift
BIN=${KVARN_EVAL:-build/bin/kvarn-eval}
I=${SLURM_ARRAY_TASK_ID:?not running as an array task}
# The shard count is that of the first submission; a resubmission of some tasks has fewer.
N=${KVARN_SHARDS:-${SLURM_ARRAY_TASK_COUNT:?not running as an array task}}

# Each task writes its own shard directory; reruns (requeue) resume it.
"$BIN" sweep "$CONFIG" "$@" --shard "$I/$N" --no-report

# Merge once every shard has a summary (tasks finishing in any order); merge is idempotent.
OUTPUT=$("$BIN" validate "$CONFIG" "$@" | sed -n 's/^run directory: //p')
shards=("$OUTPUT"-shard-*-of-"$N")
done_count=0
for d in "${shards[@]}"; do [ -f "$d/summary.jsonl" ] && done_count=$((done_count + 1)); done
if [ "$done_count" -eq "$N" ]; then
  (
    flock 9
    "$BIN" merge "$OUTPUT" "${shards[@]}"
    "$BIN" report "$OUTPUT" || echo "warning: report failed" >&2
  ) 9>"$OUTPUT.merge.lock"
fi
