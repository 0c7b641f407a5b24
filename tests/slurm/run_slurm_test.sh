#!/usr/bin/env bash
# The shipped Slurm job-array script on a real Slurm: installs Debian's slurm-wlm and munge (when
# missing), starts a single-node slurmctld + slurmd on this machine (one node, 2 CPUs,
# proctrack/linuxproc, no cgroups), submits docs/slurm_array.sh for a small config with
# `sbatch --array=0-3`, waits, and checks that the merged run equals an unsharded run file for
# file (docs/results.md, "What a byte comparison excludes"). Then it deletes one shard, resubmits
# only that array task and checks the re-merged run again. Needs root (daemons, apt-get) and a
# built kvarn-eval (KVARN_EVAL, default build/bin/kvarn-eval). Run it on every change to the
# scale-out code (docs/scale-out.md):
#   tests/slurm/run_slurm_test.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
BIN=$(realpath "${KVARN_EVAL:-build/bin/kvarn-eval}")
[ -x "$BIN" ] || { echo "error: $BIN not found (build first or set KVARN_EVAL)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "error: run as root (starts slurmctld, slurmd and munged)" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm munge >/dev/null
fi

work=$(mktemp -d /tmp/kvarn-slurm.XXXXXX)
node=$(hostname -s)
pids=()
cleanup() {
  scancel --full -u root >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The daemons are not this shell's children: give them up to 10 s to exit (slurmctld writes
  # its state on the way out), so that the work folder can be removed.
  for _ in $(seq 100); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  if [ "${KEEP_WORK:-0}" != 1 ]; then
    rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work"; }
  else
    echo "kept $work"
  fi
}
trap cleanup EXIT

# munge: a key of its own for this test, the daemon on a private socket.
mkdir -p "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$work/munge"
chmod 400 "$work/munge/munge.key"
munged --force --key-file="$work/munge/munge.key" --socket="$work/munge/socket" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/seed"
pids+=("$(cat "$work/munge/munged.pid")")

mkdir -p "$work/state" "$work/spool"
cat >"$work/slurm.conf" <<CONF
ClusterName=kvarntest
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
NodeName=$node CPUs=2 RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -i
slurmd
sleep 1
pids+=("$(cat "$work/slurmctld.pid")" "$(cat "$work/slurmd.pid")")
for _ in $(seq 60); do
  sinfo -h -o %T 2>/dev/null | grep -qx idle && break
  sleep 1
done
sinfo -h -o '%N %T %c' | grep -q idle || { echo "error: the node did not come up" >&2; tail "$work"/*.log >&2; exit 1; }

# A small config: four methods (one per array task), arrays on.
cat >"$work/small.yaml" <<YAML
version: 1
name: slurm
data:
  tiles: $root/data/tiles/sample.h5
  sequences: [0]
  max_tokens: 128
methods: [fp16, fp8_e4m3, kivi_2bit, kvarn_k4v2_g128]
metrics:
  outlier_fractions: [1]
output: $work/runs
report: false
YAML

submit() {  # extra sbatch options...; waits for the job (array) to end
  KVARN_EVAL=$BIN sbatch --wait --parsable --cpus-per-task=1 --gres=none --time=00:20:00 \
    --output="$work/slurm-%A_%a.out" "$@" docs/slurm_array.sh "$work/small.yaml"
}
# The unsharded run first, moved aside (same config file: the case records' commands agree).
run=$("$BIN" validate "$work/small.yaml" | sed -n 's/^run directory: //p')
"$BIN" sweep "$work/small.yaml" --no-report >/dev/null
mkdir -p "$work/whole"
mv "$run" "$work/whole/"
whole=$work/whole/$(basename "$run")

submit --array=0-3

compare_runs() {  # expected actual: files equal except the documented exclusions
  python3 - "$1" "$2" <<'PY'
import json, os, sys
def files(run):
    out = {}
    for d, _, names in os.walk(run):
        for n in names:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, run)
            # report/: written by the array script's report step, not a result file.
            if (rel in ("provenance.json", "shard.json") or rel.startswith("provenance/")
                    or rel.startswith("report/")):
                continue
            data = open(p, "rb").read()
            if rel.startswith("cases/"):
                rec = json.loads(data)
                rec.pop("timing"); rec.pop("provenance_digest")
                data = json.dumps(rec, sort_keys=True).encode()
            out[rel] = data
    return out
a, b = files(sys.argv[1]), files(sys.argv[2])
bad = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
for k in bad:
    print("differs:", k, file=sys.stderr)
leftover = [k for k in b if ".tmp" in k or k.endswith(".lock")]
print("compared %d files, %d differ, %d leftovers" % (len(a), len(bad), len(leftover)))
sys.exit(1 if bad or leftover or not a else 0)
PY
}
compare_runs "$whole" "$run"

# A failed task is resubmitted alone: lose shard 2, rerun only array task 2 (KVARN_SHARDS keeps
# the shard count of the original submission), merge again.
rm -rf "$run" "$run"-shard-2-of-4
KVARN_SHARDS=4 submit --array=2
compare_runs "$whole" "$run"
echo "slurm test passed: sbatch --array=0-3, merge == unsharded; resubmitted task 2 alone"
