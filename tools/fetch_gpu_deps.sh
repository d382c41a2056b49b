#!/usr/bin/env bash
# Run HERE (the dev machine, which reaches the Debian mirrors), before using tools/gpu_check.sh
# through the device tool: downloads the .deb files of the build dependencies that the GPU
# machine's image lacks (it has CUDA, cmake, ninja, python3, but no Debian -dev packages and
# no network) into .gpudeps/, which is git-ignored through .git/info/exclude (never committed)
# and travels to the device with `carry: [".gpudeps"]`. gpu_check.sh unpacks them with dpkg -x.
#   tools/fetch_gpu_deps.sh          download (skips packages already there)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpudeps
PKGS=(
  libgtest-dev                       # GoogleTest headers, static libs, CMake config
  nlohmann-json3-dev libcli11-dev    # header-only
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5 libquadmath0
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  zlib1g-dev zlib1g                  # gzip of the bundled tokenizer (src/io)
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200  # gloo: CPU process groups (src/parallel)
  libboost1.74-dev                   # header-only Beast/Asio: `deepinfer serve` (src/server)
)
grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >> .git/info/exclude
mkdir -p "$DEST"
missing=()
for p in "${PKGS[@]}"; do
  ls "$DEST/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # Architecture pinned to amd64: the device is x86-64 whatever this machine is.
  (cd "$DEST" && apt-get download -o APT::Architecture=amd64 "${missing[@]/%/:amd64}" 2>/dev/null ||
                 apt-get download "${missing[@]}")
fi
ls -la "$DEST"
du -sh "$DEST"
