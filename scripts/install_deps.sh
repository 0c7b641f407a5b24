#!/usr/bin/env bash
# Installs what kvarn-eval needs on a Debian/Ubuntu machine (apt-get + pip). Idempotent: packages
# already present are not reinstalled, so a prepared machine spends no time here.
set -euo pipefail

apt_packages=(cmake ninja-build g++ pkg-config libeigen3-dev libhdf5-dev libcli11-dev
              libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
              libpcre2-dev python3 python3-pip)
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

python_packages=(numpy h5py matplotlib pyyaml)
need_pip=0
for m in numpy h5py matplotlib yaml; do
  python3 -c "import $m" >/dev/null 2>&1 || need_pip=1
done
if ((need_pip)); then
  echo "install_deps: pip install ${python_packages[*]}"
  python3 -m pip install -q "${python_packages[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${python_packages[@]}"
fi
