#!/usr/bin/env bash
# Configures and builds kvarn-eval into ${KVARN_BUILD_DIR:-build}. CUDA is enabled automatically
# when nvcc exists (kernels compile without a GPU; GPU tests skip at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${KVARN_BUILD_DIR:-build}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# KVARN_WERROR only when given: main.sh after test.sh must not flip the cached flag (a full rebuild).
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  ${KVARN_WERROR:+-DKVARN_WERROR=$KVARN_WERROR} ${KVARN_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "${KVARN_JOBS:-$(nproc)}"
