#!/usr/bin/env bash
# Every test: installs, builds (warnings are errors), runs the whole ctest suite. GPU tests skip
# with a visible message when no CUDA device exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/prepare_models.sh
KVARN_WERROR=ON scripts/build.sh
ctest --test-dir "${KVARN_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"

# Sanitizers: the CPU suite under ASan + UBSan (its own build directory, with the libFuzzer
# targets), then every fuzz target for 60 seconds (docs/fuzzing.md). KVARN_SKIP_SANITIZE=1 skips.
if [ "${KVARN_SKIP_SANITIZE:-0}" != 1 ]; then
  KVARN_WERROR=ON scripts/sanitize.sh
  KVARN_FUZZ_BUILD_DIR=build-asan fuzz/run.sh all 60
fi
