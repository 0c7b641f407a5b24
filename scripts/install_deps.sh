#!/usr/bin/env bash
# Installs what kvarn-eval needs on a Debian/Ubuntu machine (apt-get + pip). Idempotent: packages
# already present are not reinstalled, so a prepared machine spends no time here.
set -euo pipefail

apt_packages=(cmake ninja-build g++ pkg-config libeigen3-dev libhdf5-dev zlib1g-dev libdeflate-dev
              libcli11-dev
              libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
              libpcre2-dev python3 python3-pip
              clang libclang-rt-dev)  # clang + its sanitizer/libFuzzer runtimes: fuzz/build.sh
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  echo "install_deps: apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

python_packages=(numpy h5py matplotlib pyyaml pytest)
need_pip=0
for m in numpy h5py matplotlib yaml pytest; do
  python3 -c "import $m" >/dev/null 2>&1 || need_pip=1
done
if ((need_pip)); then
  echo "install_deps: pip install ${python_packages[*]}"
  python3 -m pip install -q "${python_packages[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${python_packages[@]}"
fi

# The libtorch runner (eval/runner) and its tests: libtorch comes from the PyPI torch wheel (CMake
# finds it through torch.utils.cmake_prefix_path); the tests compare against transformers and
# tokenizers. Installed only when missing. PyPI's Linux torch wheel is the CUDA build (about
# 0.9 GB plus about 3 GB of nvidia-* wheels); KVARN_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# takes the CPU-only wheel (about 0.2 GB) instead. KVARN_SKIP_TORCH=1 skips this step (the runner
# is then not built).
if [ "${KVARN_SKIP_TORCH:-0}" != 1 ]; then
  if ! python3 -c "import torch" >/dev/null 2>&1; then
    torch_args=(torch)
    if [ -n "${KVARN_TORCH_INDEX_URL:-}" ]; then torch_args+=(--index-url "$KVARN_TORCH_INDEX_URL"); fi
    echo "install_deps: pip install ${torch_args[*]}"
    python3 -m pip install -q "${torch_args[@]}" 2>/dev/null ||
      python3 -m pip install -q --break-system-packages "${torch_args[@]}"
  fi
  runner_packages=(transformers safetensors tokenizers)
  if ! python3 -c "import transformers, safetensors, tokenizers" >/dev/null 2>&1; then
    echo "install_deps: pip install ${runner_packages[*]}"
    python3 -m pip install -q "${runner_packages[@]}" 2>/dev/null ||
      python3 -m pip install -q --break-system-packages "${runner_packages[@]}"
  fi
fi
