#!/usr/bin/env bash
# Installs what is missing (Debian packages, Python packages), configures and builds deepinfer,
# makes the random test model (models/random), and makes `import deepinfer` work from any directory.
# The bundled default model (trained, assets/default-model) is part of the source tree.
#   ./build.sh            build (CUDA too when nvcc is present)
#   ./build.sh --cpu-only skip the CUDA backend
#   BUILD_DIR=... JOBS=... override the build folder / parallelism
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
JOBS=${JOBS:-$(nproc)}
CMAKE_ARGS=()
for a in "$@"; do
  case "$a" in
    --cpu-only) CMAKE_ARGS+=(-DDEEPINFER_ENABLE_CUDA=OFF) ;;
    -h|--help) sed -n 2,6p "$0"; exit 0 ;;
    *) echo "build.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

# ---- system packages (skipped when present; needs root or sudo otherwise) ----
APT_PKGS=(cmake g++ pkg-config libopenblas-dev libpcre2-dev nlohmann-json3-dev libcli11-dev libgtest-dev zlib1g-dev libgloo-dev libboost-dev)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
DEP_ARGS=()
if [ ${#missing[@]} -gt 0 ] && ls "$ROOT"/.gpudeps/*.deb >/dev/null 2>&1; then
  # A machine without Debian -dev packages or a network (the GPU image): use the .debs that
  # tools/fetch_gpu_deps.sh downloaded elsewhere and the device call carried.
  echo "build.sh: ${missing[*]} missing; using the carried .gpudeps/"
  source "$ROOT/tools/gpu_deps.sh"
  di_use_gpu_deps
  DEP_ARGS=("${CMAKE_DEP_ARGS[@]}")
elif [ ${#missing[@]} -gt 0 ]; then
  echo "build.sh: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; } || {
    echo "build.sh: could not install ${missing[*]} (no network or no root?)." >&2
    echo "  Without a network: run tools/fetch_gpu_deps.sh on a machine with one and bring .gpudeps/ here." >&2
    exit 1
  }
fi

# ---- python packages for the bindings and tests ----
PY=${PYTHON:-python3}
py_missing=()
for m in nanobind numpy pytest jinja2 tokenizers openai; do $PY -c "import $m" >/dev/null 2>&1 || py_missing+=("$m"); done
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "build.sh: pip installing ${py_missing[*]}"
  $PY -m pip install -q "${py_missing[@]}"
fi

# ---- configure and build ----
NB_DIR=$($PY -c "import nanobind; print(nanobind.cmake_dir())" 2>/dev/null || true)
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -Dnanobind_DIR="$NB_DIR" \
  -DPython_EXECUTABLE="$(command -v $PY)" "${CMAKE_ARGS[@]}" "${DEP_ARGS[@]}" >"$BUILD_DIR.cmake.log" 2>&1 \
  || { cat "$BUILD_DIR.cmake.log"; exit 1; }
cmake --build "$BUILD_DIR" -j "$JOBS"

# ---- python: make `import deepinfer` work from any directory ----
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ -w "$SITE" ]; then echo "$ROOT/python" > "$SITE/deepinfer-dev.pth"; fi

# ---- the random test model: real 129,280-token DeepSeek vocabulary, random weights ----
# (tests that need the big vocabulary; the bundled default model is assets/default-model)
if [ -x "$BUILD_DIR/deepinfer" ] && "$BUILD_DIR/deepinfer" --help 2>/dev/null | grep -q make-random-model; then
  "$BUILD_DIR/deepinfer" make-random-model --out "$ROOT/models/random" --quiet
fi
echo "build.sh: done ($BUILD_DIR)"
