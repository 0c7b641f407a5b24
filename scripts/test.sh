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
if [ "$ctest_rc" != 0 ] || [ "$pytest_rc" != 0 ]; then exit 1; fi

# Sanitizers: the CPU suite under ASan + UBSan (its own build directory, with the libFuzzer
# targets), then every fuzz target for 60 seconds (docs/fuzzing.md). KVARN_SKIP_SANITIZE=1 skips.
if [ "${KVARN_SKIP_SANITIZE:-0}" != 1 ]; then
  KVARN_WERROR=ON scripts/sanitize.sh
  KVARN_FUZZ_BUILD_DIR=build-asan fuzz/run.sh all 60
fi
