#!/usr/bin/env bash
# The main job on the embedded default data: installs, builds, then lists every method with its
# byte accounting and quantizes the shipped sample tiles with the default KVarN preset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
bin=${KVARN_BUILD_DIR:-build}/bin/kvarn-eval
out=${KVARN_OUT_DIR:-out}
mkdir -p "$out"
"$bin" methods --head-dim 128 --context 4096
for tiles in data/tiles/*.h5; do
  name=$(basename "$tiles" .h5)
  "$bin" quantize --method kvarn_k4v2_g128 --in "$tiles" --out "$out/${name}.kvarn_k4v2_g128.h5" --force
done
echo "main: results in $out/"
