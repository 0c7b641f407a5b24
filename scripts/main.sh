#!/usr/bin/env bash
# The main job on the embedded default data: installs, builds, lists every method with its byte
# accounting, then runs `kvarn-eval sweep configs/aime25.yaml` (run directory and report under runs/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/prepare_models.sh
scripts/build.sh
bin=${KVARN_BUILD_DIR:-build}/bin/kvarn-eval
"$bin" methods --head-dim 128 --context 4096
# The main job: the paper workload. Without a user-supplied Qwen3 checkpoint and AIME prompts it
# runs on a capture from the embedded fixture Qwen3 plus the SmolLM2 tiles, at reduced size, and
# says so.
"$bin" sweep configs/aime25.yaml "$@"
