#!/usr/bin/env bash
# Sanitizer builds of the CPU tests (issue #20). Figures and the CI decision: docs/HARDENING.md.
#   tools/sanitizers.sh ci     the CI job (.ci/run, after the fuzz stage): the unit tests of core,
#                              io, tokenizer, structured and the server's request parsing with
#                              ASan + UBSan, linked against the libraries the fuzz targets already
#                              compiled (FUZZ_DIR, clang), so only the test sources are extra
#   tools/sanitizers.sh tsan-lite  TSan (clang + LLVM's OpenMP + Archer) on the threaded parts that
#                              build without the engine: tokenizer encode_batch, the structured mask
#                              workers (parallel mask computation), the CPU ops' parallel_for
#   tools/sanitizers.sh asan   every C++ test (ctest) built with gcc ASan + UBSan (UB aborts, leaks
#                              checked); ASAN_TESTS="io_test core_test ..." builds and runs only those
#   tools/sanitizers.sh tsan   the threaded parts with TSan (CI runs it after `ci`): concurrent
#                              LLM::generate, streams, aborts and cancellation (llm_hardening_test),
#                              the async scheduler and async grammar compiles (engine_test), the
#                              server's engine loop and I/O threads (server_http_test), the
#                              structured mask workers, tokenizer encode_batch, the CPU ops' OpenMP
#                              regions (ops_cpu_test)
#   tools/sanitizers.sh tsan-py  the same TSan build's Python extension, loaded into the (not
#                              instrumented) interpreter with the TSan runtime preloaded: Python
#                              threads calling generate() / stream() / abort_request() / the
#                              tokenizer on one LLM at once, Ctrl-C, the Python soak
#   tools/sanitizers.sh full   asan + tsan-lite + tsan + tsan-py (.ci/sanitize: too long for CI's 30 minutes)
# BUILD_ROOT (default: the checkout) holds build-asan/, build-tsan/, build-tsan-lite/; FUZZ_DIR
# (default build-fuzz) the ASan libraries shared with tests/fuzz/run.sh; JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_ROOT=${BUILD_ROOT:-$ROOT}
FUZZ_DIR=${FUZZ_DIR:-$ROOT/build-fuzz}
JOBS=${JOBS:-2}
WHAT=${1:-ci}
export DEEPINFER_SHARED_DIR=${DEEPINFER_SHARED_DIR:-$ROOT/../shared}
export DEEPINFER_SOURCE_DIR=$ROOT
COMMON=(-DDEEPINFER_ENABLE_CUDA=OFF -DDEEPINFER_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
CLANGXX=$(command -v clang++-14 || command -v clang++ || true)
CLANG=$(command -v clang-14 || command -v clang || true)
LLVM_LIB=$( [ -n "$CLANGXX" ] && echo "$(dirname "$(readlink -f "$CLANGXX")")/../lib" )
ASAN_ENV=(ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_NUM_THREADS=2)
# Archer (LLVM's OpenMP data-race tool) tells TSan about OpenMP's synchronisation.
TSAN_ENV=(OMP_TOOL_LIBRARIES=${OMP_TOOL_LIBRARIES:-$LLVM_LIB/libarcher.so}
          TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1}
          OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1)

need_clang() {
  [ -n "$CLANGXX" ] || { echo "sanitizers: clang++ not found (apt-get install clang-14 libclang-rt-14-dev libomp-14-dev)" >&2; exit 1; }
}

run_ci() {
  need_clang
  local t
  # ASan + UBSan: reuses FUZZ_DIR's compiled libraries (the fuzz stage built them).
  mkdir -p "$FUZZ_DIR"
  cmake -S tests/fuzz -B "$FUZZ_DIR" -DCMAKE_CXX_COMPILER="$CLANGXX" -DCMAKE_C_COMPILER="$CLANG" -DDI_UNIT_TESTS=ON \
    >"$FUZZ_DIR/san-configure.log" 2>&1 || { cat "$FUZZ_DIR/san-configure.log"; return 1; }
  nice -n 10 cmake --build "$FUZZ_DIR" -j "$JOBS" --target san_tests
  # Every san_ test tests/fuzz/unit_tests.cmake defines (listed at configure time).
  for t in $(cat "$FUZZ_DIR/san_tests.txt"); do
    echo "sanitizers: ASan+UBSan $t"
    env "${ASAN_ENV[@]}" "$FUZZ_DIR/san_$t" --gtest_brief=1 || return 1
  done
}

run_tsan_lite() {
  need_clang
  local b=$BUILD_ROOT/build-tsan-lite
  mkdir -p "$b"
  cmake -S tests/fuzz -B "$b" -DCMAKE_CXX_COMPILER="$CLANGXX" -DCMAKE_C_COMPILER="$CLANG" -DDI_UNIT_TESTS=ON \
    -DDI_SAN_MODE=thread >"$b/configure.log" 2>&1 || { cat "$b/configure.log"; return 1; }
  nice -n 10 cmake --build "$b" -j "$JOBS" --target san_tokenizer_test san_structured_test san_ops_cpu_test
  echo "sanitizers: TSan tokenizer encode_batch, structured workers, CPU ops (OpenMP + Archer)"
  env "${TSAN_ENV[@]}" "$b/san_tokenizer_test" --gtest_brief=1 \
    --gtest_filter='Tokenizer.CloneAndBatchAgree:Tokenizer.BpeFastPathMatchesReference'
  env "${TSAN_ENV[@]}" "$b/san_structured_test" --gtest_brief=1 --gtest_filter='Workers.*'
  env "${TSAN_ENV[@]}" "$b/san_ops_cpu_test" --gtest_brief=1
}

run_asan() {
  local b=$BUILD_ROOT/build-asan
  mkdir -p "$b"
  local san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake -S "$ROOT" -B "$b" "${COMMON[@]}" -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" >"$b/configure.log" 2>&1 ||
    { cat "$b/configure.log"; return 1; }
  local opts=("${ASAN_ENV[@]}" DEEPINFER_BINARY_DIR="$b")
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
  need_clang
  local b=$BUILD_ROOT/build-tsan
  mkdir -p "$b"
  cmake -S "$ROOT" -B "$b" "${COMMON[@]}" -DCMAKE_CXX_COMPILER="$CLANGXX" -DCMAKE_C_COMPILER="$CLANG" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
    >"$b/configure.log" 2>&1 || { cat "$b/configure.log"; return 1; }
  nice -n 10 cmake --build "$b" -j "$JOBS" --target llm_hardening_test server_http_test engine_test ops_cpu_test \
    structured_tracked_test tokenizer_test
  export DEEPINFER_BINARY_DIR="$b"
  # All of it: LlmThreads.* (concurrent generate/stream/abort) and the bad requests' death tests.
  env "${TSAN_ENV[@]}" "$b/tests/cpp/hardening/llm_hardening_test" --gtest_brief=1
  # The server's engine loop and I/O threads.
  env "${TSAN_ENV[@]}" "$b/tests/cpp/server/server_http_test" --gtest_brief=1
  # The async scheduler (a step launched while the last one's outputs are processed), async
  # grammar compilation, prefix-cache sharing under async steps.
  env "${TSAN_ENV[@]}" "$b/tests/cpp/engine/engine_test" --gtest_brief=1 --gtest_filter='*Async*:*Scheduler*:*Thread*'
  # Parallel mask computation (the structured mask workers), tokenizer encode_batch, and every
  # CPU op's OpenMP parallel_for region (Archer tells TSan about OpenMP's synchronisation).
  env "${TSAN_ENV[@]}" "$b/tests/cpp/structured/structured_tracked_test" --gtest_brief=1 --gtest_filter='Workers.*'
  env "${TSAN_ENV[@]}" "$b/tests/cpp/tokenizer/tokenizer_test" --gtest_brief=1 \
    --gtest_filter='Tokenizer.CloneAndBatchAgree:Tokenizer.BpeFastPathMatchesReference'
  env "${TSAN_ENV[@]}" "$b/tests/cpp/ops/ops_cpu_test" --gtest_brief=1
}

# Python threads over the bindings (they release the GIL, so the engine runs the threads' calls
# concurrently). The interpreter is not instrumented: TSan sees the GIL through the pthread calls
# it intercepts, and checks every access the extension (the whole engine) makes. The runtime
# preloaded is gcc's libtsan: clang 14's shared one crashes at preload (its __cxa_atexit
# interceptor runs from libstdc++'s initialiser before the runtime is set up); clang's
# instrumentation only calls the __tsan_* entry points, which gcc's runtime provides.
run_tsan_py() {
  need_clang
  local b=$BUILD_ROOT/build-tsan py=$BUILD_ROOT/build-tsan/py
  local rt interp
  rt=$(readlink -f "$(gcc -print-file-name=libtsan.so)")
  [ -f "$rt" ] || { echo "sanitizers: no TSan runtime library (apt-get install libtsan2)" >&2; return 1; }
  interp=$(python3 -c 'import sys; print(sys.executable)')  # the interpreter itself, not a shim
  mkdir -p "$b" "$py/deepinfer"
  cmake -S "$ROOT" -B "$b" "${COMMON[@]}" -DDEEPINFER_BUILD_PYTHON=ON -DCMAKE_CXX_COMPILER="$CLANGXX" -DCMAKE_C_COMPILER="$CLANG" \
    -Dnanobind_DIR="$(python3 -c 'import nanobind; print(nanobind.cmake_dir())')" -DDEEPINFER_PY_OUTPUT_DIR="$py/deepinfer" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
    >"$b/configure-py.log" 2>&1 || { cat "$b/configure-py.log"; return 1; }
  nice -n 10 cmake --build "$b" -j "$JOBS" --target _C
  # The package's Python files beside the TSan extension (the checkout's own _C is left alone).
  ln -sf "$ROOT"/python/deepinfer/*.py "$py/deepinfer/"
  # A report aborts the interpreter (halt_on_error, exit status 66), which fails the run;
  # --capture=sys leaves fd 2 alone so the report is printed (fd capture would lose it).
  env "${TSAN_ENV[@]}" LD_PRELOAD="$rt" PYTHONPATH="$py" DEEPINFER_INTERRUPT_LIMIT_S=20 \
    "$interp" -m pytest -q -p no:cacheprovider --capture=sys tests/python/test_hardening_threads.py tests/python/test_hardening_soak.py \
    "tests/python/test_hardening_api.py::test_concurrent_generate_from_threads_matches_sequential" \
    "tests/python/test_hardening_api.py::test_abort_from_another_thread_finishes_the_request" \
    "tests/python/test_hardening_api.py::test_keyboard_interrupt_cancels_generate_promptly" \
    "tests/python/test_hardening_api.py::test_generate_inside_a_stream_loop" \
    "tests/python/test_hardening_api.py::test_two_streams_interleaved" \
    "tests/python/test_hardening_api.py::test_request_ids_never_repeat"
}

case "$WHAT" in
  ci) run_ci ;;
  tsan-lite) run_tsan_lite ;;
  asan) run_asan ;;
  tsan) run_tsan ;;
  tsan-py) run_tsan_py ;;
  full) run_asan && run_tsan_lite && run_tsan && run_tsan_py ;;
  *) sed -n 2,23p "$0"; exit 2 ;;
esac
echo "sanitizers ($WHAT): clean"
