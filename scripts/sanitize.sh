#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU test suites and the libFuzzer
# targets, in one build directory of its own (${KVARN_SANITIZE_BUILD_DIR:-build-asan}, clang with
# -fsanitize=address,undefined and libFuzzer coverage), then ctest on the chosen labels: data,
# core, eval, sweeps, the runner's torch-free parser tests and the fuzz replays. CUDA and the
# libtorch runner are off (a prebuilt libtorch is not instrumented; under ASan it is slow and
# reports its own leaks), so the runner's model tests are not part of this run; its parsers
# (safetensors, config.json, tokenizer.json, BPE, prompts) are. What runs and why:
# docs/fuzzing.md, "Sanitizers in CI". The fuzz smoke run uses the same build:
#   KVARN_FUZZ_BUILD_DIR=build-asan fuzz/run.sh all 60
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVARN_SANITIZE_BUILD_DIR:-build-asan}
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVARN_BUILD_FUZZ=ON -DKVARN_BUILD_TESTS=ON -DKVARN_BUILD_BENCH=OFF \
  -DKVARN_ENABLE_CUDA=OFF -DKVARN_ENABLE_TORCH=OFF \
  ${KVARN_WERROR:+-DKVARN_WERROR=$KVARN_WERROR} ${KVARN_CMAKE_ARGS:-}
# The data (tile format), core (quantizer references), eval (metrics) and sweeps suites (CLI,
# run directories, the malformed-input corpus, kills and determinism) and the fuzz targets with
# their replay (the runner's torch-free parsers among them); docs/fuzzing.md says what is left
# out and why.
targets=${KVARN_SANITIZE_TARGETS:-kvarn_data_tests kvarn_core_tests kvarn_eval_tests
  kvarn_runner_parser_tests kvarn_sweeps_tests kvarn-eval fuzz_tile_reader fuzz_safetensors
  fuzz_model_config fuzz_tokenizer_json fuzz_bpe_encode fuzz_prompts fuzz_run_dir
  fuzz_config_yaml fuzz_set}
cmake --build "$dir" -j "${KVARN_JOBS:-$(nproc)}" --target $targets
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" \
  -L "${KVARN_SANITIZE_LABELS:-^(data|core|eval|eval_runner_parsers|sweeps|fuzz)$}" \
  -E "${KVARN_SANITIZE_EXCLUDE:-quickstart_golden}"
