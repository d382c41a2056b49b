# Sourced by the GPU scripts (tools/gpu_check.sh, tools/gpu_model_check.sh, bench/gpu_flash_bench.sh).
# The GPU image has CUDA, cmake and ninja but none of the Debian -dev packages; tools/fetch_gpu_deps.sh
# downloads them here into .gpudeps/, which the device call carries. This unpacks them once into a
# private prefix (dpkg -x, no postinst), exports the library and pkg-config paths (openblas is needed
# at run time too) and sets CMAKE_DEP_ARGS for the configure. A machine with the packages installed
# (gtest headers present) is left alone. Call from the repository root.
di_use_gpu_deps() {
  local prefix=/tmp/di-gpudeps
  CMAKE_DEP_ARGS=()
  ls .gpudeps/*.deb >/dev/null 2>&1 && [ ! -f /usr/include/gtest/gtest.h ] || return 0
  if [ ! -d "$prefix/usr" ]; then
    echo "== unpacking $(ls .gpudeps/*.deb | wc -l) carried .debs into $prefix"
    mkdir -p "$prefix"
    local f
    for f in .gpudeps/*.deb; do dpkg -x "$f" "$prefix" || { echo "dpkg -x $f failed" >&2; return 1; }; done
  fi
  local libdir=$prefix/usr/lib/x86_64-linux-gnu
  # update-alternatives never ran: make the plain libopenblas.so name the postinst would have made.
  [ -e "$libdir/libopenblas.so" ] || ln -sf openblas-pthread/libopenblas.so "$libdir/libopenblas.so"
  # gloo installs into usr/lib (not the multiarch folder).
  export LD_LIBRARY_PATH=$libdir:$libdir/openblas-pthread:$prefix/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
  CMAKE_DEP_ARGS=(-DDEEPINFER_EXTRA_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$prefix/usr")
}
