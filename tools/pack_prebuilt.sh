#!/usr/bin/env bash
# Builds the GPU test binaries HERE (no GPU needed; sm_90a only) and packs them, stripped, with the
# shared libraries the GPU image lacks, into one folder to carry to the device, so a device call
# runs tests instead of spending its minutes on a build:
#   tools/pack_prebuilt.sh [BUILD_DIR] [OUT_DIR]      (defaults: build-prebuilt, build-prebuilt/pack)
# then, through the device tool:
#   run: tools/gpu_check.sh --prebuilt build-prebuilt/pack [--no-sanitize]
#   carry: [".gpudeps", "build-prebuilt/pack"]
# Both folders match the /build-*/ ignore rule, so they never enter git; the pack is ~30 MB
# (the carry limit is 64 MiB with the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-prebuilt}
PACK=${2:-$BUILD/pack}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_BUILD_PYTHON=OFF \
  -DDEEPINFER_CUDA_SM90_ONLY=ON >/dev/null
cmake --build "$BUILD" -j "${JOBS:-2}" --target cuda_ops_test cuda_model_test deepinfer
rm -rf "$PACK" && mkdir -p "$PACK/lib"
for t in cuda_ops_test cuda_model_test; do
  bin=$(find "$BUILD/tests" -name "$t" -type f -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "pack_prebuilt: $t was not built (is CUDA on?)" >&2; exit 1; }
  strip -o "$PACK/$t" "$bin"
done
strip -o "$PACK/deepinfer" "$BUILD/deepinfer"  # the CLI: generate / bench-flash on the GPU
# Libraries the device image does not ship (its CUDA, libstdc++ and OpenBLAS are used as they are).
for lib in libpcre2-8.so.0; do
  path=$(ldd "$PACK/cuda_model_test" | awk -v l="$lib" '$1 == l { print $3 }')
  [ -n "$path" ] && cp -L "$path" "$PACK/lib/"
done
du -sh "$PACK"
