#!/usr/bin/env bash
# Rewrites the golden files from the current code when a numerical change is intended:
#   tests/golden/input.json, tests/golden/<preset>.json   (tests/tools/update_golden.cpp)
#   tests/golden/quickstart-run/{summary.jsonl,resolved.json}   (configs/quickstart.yaml)
# It checks nothing and reports no pass: review `git diff tests/golden`, then run the tests
# (Golden.* and sweeps.quickstart_golden compare against what was written) and commit.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${KVARN_BUILD_DIR:-build}
cmake --build "$build_dir" --target kvarn_update_golden kvarn-eval -j "${KVARN_JOBS:-$(nproc)}"
"$build_dir/tests/kvarn_update_golden"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
d=$("$build_dir/bin/kvarn-eval" sweep configs/quickstart.yaml --set output="$tmp" --fresh \
  --no-report | tail -n 1)
cp "$d/summary.jsonl" "$d/resolved.json" tests/golden/quickstart-run/
echo "wrote tests/golden/quickstart-run from $d; review \`git diff tests/golden\`"
