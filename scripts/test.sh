#!/usr/bin/env bash
# Every test: installs, builds (warnings are errors), runs the whole ctest suite. GPU tests skip
# with a visible message when no CUDA device exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/prepare_models.sh
KVARN_WERROR=ON scripts/build.sh
ctest --test-dir "${KVARN_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
