#!/usr/bin/env bash
# Builds the GPU test binaries HERE (no GPU needed; sm_90a only) and packs them, stripped, with the
# shared libraries the GPU image lacks, into one folder to carry to the device, so a device call
# runs tests instead of spending its minutes on a build:
#   tools/pack_prebuilt.sh [BUILD_DIR] [OUT_DIR]      (defaults: build-prebuilt, build-prebuilt/pack)
# It also writes build-pack/pack.tar.xz (~13 MB at xz -9): the tracked tree is ~38 MiB of the 64 MiB carry
# limit, so the uncompressed pack (~35 MB) and .gpudeps (25 MB) no longer fit beside it. Then,
# through the device tool:
#   run: tar xJf build-pack/pack.tar.xz -C build-pack && tools/gpu_check.sh --prebuilt build-pack/pack
#   carry: ["build-pack"]            (.gpudeps is not needed: the pack holds the libraries the image lacks)
# Both folders match the /build-*/ ignore rule, so they never enter git.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-prebuilt}
PACK=${2:-$BUILD/pack}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_BUILD_PYTHON=OFF \
  -DDEEPINFER_CUDA_SM90_ONLY=ON >/dev/null
cmake --build "$BUILD" -j "${JOBS:-2}" --target cuda_ops_test cuda_model_test engine_dp_test engine_test server_kv_ipc_gpu_test ep_device_test ep_backend_gpu_test deepinfer
rm -rf "$PACK" && mkdir -p "$PACK/lib"
for t in cuda_ops_test cuda_model_test engine_dp_test engine_test server_kv_ipc_gpu_test ep_device_test ep_backend_gpu_test; do
  bin=$(find "$BUILD/tests" -name "$t" -type f -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "pack_prebuilt: $t was not built (is CUDA on?)" >&2; exit 1; }
  strip -o "$PACK/$t" "$bin"
done
strip -o "$PACK/deepinfer" "$BUILD/deepinfer"  # the CLI: generate / bench-flash on the GPU
# Libraries the device image does not ship (its CUDA and libstdc++ are used as they are).
# PCRE2, gloo and its dependencies come from Debian packages the image lacks; OpenBLAS (and its
# Fortran runtime) is packed too, so the binaries do not depend on which build the image carries.
for bin in "$PACK"/cuda_model_test "$PACK"/engine_dp_test "$PACK"/engine_test "$PACK"/server_kv_ipc_gpu_test "$PACK"/ep_device_test "$PACK"/ep_backend_gpu_test "$PACK"/deepinfer; do
  ldd "$bin" | awk '$3 ~ /^\// { print $1, $3 }' |
    while read -r name path; do
      case "$name" in libpcre2*|libgloo*|libhiredis*|libibverbs*|libnl-*|librdmacm*|libopenblas*|libgfortran*|libquadmath*) cp -Ln "$path" "$PACK/lib/" ;; esac
    done
done
du -sh "$PACK"
mkdir -p build-pack && rm -rf build-pack/pack
XZ_OPT=${XZ_OPT:--9 -T2} tar cJf build-pack/pack.tar.xz -C "$(dirname "$PACK")" "$(basename "$PACK")"
du -sh build-pack/pack.tar.xz
