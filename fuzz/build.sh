#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) into
# ${KVARN_FUZZ_BUILD_DIR:-build-fuzz}/fuzz/. CUDA, libtorch, tests and benchmarks are off: the
# targets need only the parsers (docs/fuzzing.md). scripts/sanitize.sh builds the same targets
# together with the sanitized test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVARN_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVARN_BUILD_FUZZ=ON -DKVARN_BUILD_TESTS=OFF -DKVARN_BUILD_BENCH=OFF \
  -DKVARN_ENABLE_CUDA=OFF -DKVARN_ENABLE_TORCH=OFF ${KVARN_CMAKE_ARGS:-}
cmake --build "$dir" -j "${KVARN_JOBS:-$(nproc)}"
