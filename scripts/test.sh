#!/usr/bin/env bash
# Every test: installs, builds (warnings are errors), runs the whole ctest suite and the Python
# tests (pytest over tests/, the report package and the scripts). GPU tests skip with a visible
# message when no CUDA device exists. Fails when either fails (pytest's "no tests collected",
# exit 5, included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/prepare_models.sh
KVARN_WERROR=ON scripts/build.sh
ctest_rc=0
ctest --test-dir "${KVARN_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" || ctest_rc=$?
pytest_rc=0
python3 -m pytest tests || pytest_rc=$?
echo "test.sh: ctest exit $ctest_rc, pytest exit $pytest_rc"
[ "$ctest_rc" = 0 ] && [ "$pytest_rc" = 0 ]
