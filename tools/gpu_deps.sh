# Sourced by the GPU scripts (tools/gpu_check.sh, tools/gpu_model_check.sh, bench/gpu_flash_bench.sh).
# The GPU image has CUDA, cmake and ninja but none of the Debian -dev packages; tools/fetch_gpu_deps.sh
# downloads them here into .gpudeps/, which the device call carries. This unpacks them once into a
# private prefix (dpkg -x, no postinst), exports the library and pkg-config paths (openblas is needed
# at run time too) and sets CMAKE_DEP_ARGS for the configure.
# Call from the repository root.
di_use_gpu_deps() {
  local prefix=/tmp/di-gpudeps
  CMAKE_DEP_ARGS=()
  # Unpacked whenever carried: the image has some packages (gtest, openblas) but not others
  # (PCRE2, gloo, boost), so what is installed says nothing about what is missing.
  ls .gpudeps/*.deb >/dev/null 2>&1 || return 0
  if [ ! -d "$prefix/usr" ]; then
    echo "== unpacking the carried .debs the image lacks into $prefix"
    mkdir -p "$prefix"
    local f
    # Only the packages the image lacks: a library the image has (nlohmann, gtest, openblas)
    # must come from one place, or two versions of it meet in one build.
    local f pkg
    for f in .gpudeps/*.deb; do
      pkg=$(dpkg-deb -f "$f" Package)
      if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then continue; fi
      dpkg -x "$f" "$prefix" || { echo "dpkg -x $f failed" >&2; return 1; }
    done
  fi
  local libdir=$prefix/usr/lib/x86_64-linux-gnu
  # update-alternatives never ran: make the plain libopenblas.so name the postinst would have made.
  [ -d "$libdir/openblas-pthread" ] && [ ! -e "$libdir/libopenblas.so" ] && ln -sf openblas-pthread/libopenblas.so "$libdir/libopenblas.so"
  # gloo installs into usr/lib (not the multiarch folder).
  export LD_LIBRARY_PATH=$libdir:$libdir/openblas-pthread:$prefix/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
  CMAKE_DEP_ARGS=(-DDEEPINFER_EXTRA_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$prefix/usr")
}
