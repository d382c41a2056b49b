#!/usr/bin/env bash
# Sanitizer builds of the CPU test suite (issue #20). Not part of .ci/run: together they take
# longer than CI's budget on 2 cores (figures in docs/HARDENING.md); run them before landing
# changes to parsers, the engine's threading or the CPU ops.
#   tools/sanitizers.sh asan   every C++ test (ctest) built with ASan + UBSan (gcc; UB aborts);
#                              ASAN_TESTS="io_test core_test ..." builds and runs only those
#   tools/sanitizers.sh tsan   the threaded parts with TSan (clang + libomp + Archer, so OpenMP's
#                              parallel_for regions are checked too): concurrent LLM::generate
#                              (llm_hardening_test), tokenizer encode_batch, the structured
#                              mask workers (parallel mask computation), the CPU ops
#   tools/sanitizers.sh        both
# BUILD_ROOT (default: the checkout) holds build-asan/ and build-tsan/; JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_ROOT=${BUILD_ROOT:-$ROOT}
JOBS=${JOBS:-2}
WHAT=${1:-all}
export DEEPINFER_SHARED_DIR=${DEEPINFER_SHARED_DIR:-$ROOT/../shared}
COMMON=(-DDEEPINFER_ENABLE_CUDA=OFF -DDEEPINFER_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)

run_asan() {
  local b=$BUILD_ROOT/build-asan
  mkdir -p "$b"
  local san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake -S "$ROOT" -B "$b" "${COMMON[@]}" -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" >"$b/configure.log" 2>&1 ||
    { cat "$b/configure.log"; return 1; }
  local opts=(ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
              UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
              DEEPINFER_SOURCE_DIR="$ROOT" DEEPINFER_BINARY_DIR="$b" OMP_NUM_THREADS=2)
  # Leaks are checked; static singletons are reachable and not reported.
  if [ -z "${ASAN_TESTS:-}" ]; then
    nice -n 10 cmake --build "$b" -j "$JOBS"
    env "${opts[@]}" ctest --test-dir "$b" -j "$JOBS" --output-on-failure --timeout 1800
    return
  fi
  local t exe
  nice -n 10 cmake --build "$b" -j "$JOBS" --target $ASAN_TESTS
  for t in $ASAN_TESTS; do
    exe=$(find "$b/tests" -type f -name "$t" -perm -u+x | head -1)
    [ -n "$exe" ] || { echo "sanitizers: no test binary $t" >&2; return 1; }
    (cd "$ROOT" && env "${opts[@]}" "$exe" --gtest_brief=1) || return 1
  done
}

run_tsan() {
  local b=$BUILD_ROOT/build-tsan
  mkdir -p "$b"
  local cxx cc llvm_lib
  cxx=$(command -v clang++-14 || command -v clang++)
  cc=$(command -v clang-14 || command -v clang)
  llvm_lib=$(dirname "$(readlink -f "$cxx")")/../lib
  cmake -S "$ROOT" -B "$b" "${COMMON[@]}" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
    >"$b/configure.log" 2>&1 || { cat "$b/configure.log"; return 1; }
  nice -n 10 cmake --build "$b" -j "$JOBS" --target llm_hardening_test tokenizer_test structured_tracked_test ops_cpu_test
  # Archer (LLVM's OpenMP data-race tool) tells TSan about OpenMP's synchronisation.
  export OMP_TOOL_LIBRARIES=${OMP_TOOL_LIBRARIES:-$llvm_lib/libarcher.so}
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1}
  export OMP_NUM_THREADS=2 DEEPINFER_SOURCE_DIR="$ROOT" DEEPINFER_BINARY_DIR="$b"
  "$b/tests/cpp/hardening/llm_hardening_test" --gtest_filter='LlmThreads.*'
  "$b/tests/cpp/tokenizer/tokenizer_test" --gtest_filter='Tokenizer.CloneAndBatchAgree:Tokenizer.BpeFastPathMatchesReference'
  "$b/tests/cpp/structured/structured_tracked_test" --gtest_filter='Workers.*'
  "$b/tests/cpp/ops/ops_cpu_test"
}

case "$WHAT" in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_asan && run_tsan ;;
  *) sed -n 2,10p "$0"; exit 2 ;;
esac
echo "sanitizers ($WHAT): clean"
