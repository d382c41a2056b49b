#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan), writes their seed corpora, then for each
# target: runs every seed and every saved regression input once at full size, and fuzzes.
#   tests/fuzz/run.sh                 bounded run: SECONDS_PER_TARGET (default 10) each (CI)
#   RUNS=1000000 tests/fuzz/run.sh    long run: that many executions per target, under nice -n 10;
#                                     logs and final stats in $FUZZ_DIR/long/<target>.log
#   TARGETS="config_v4 so_args" ...   a subset (all of them are still built: FUZZ_BUILD below);
#                                     MAX_LEN (default 8192) caps generated inputs
#   MAX_TIME=1500 ...                 also stops each fuzzing run after that many seconds (a long
#                                     run that must end by a deadline; the log says how far it got)
# One `cmake --build` builds every fuzz target, the link guard of every fz_ library and (with
# FUZZ_UNIT_TESTS=ON, the default) the san_ unit tests tools/sanitizers.sh ci runs, so a target
# that no longer links fails here even when it is not among TARGETS. FUZZ_BUILD=selected builds
# only the TARGETS' binaries (quicker, skips that check).
# Exit status is non-zero when any target crashes, leaks, hangs past -timeout or fails a
# FUZZ_ASSERT; the input is saved under $FUZZ_DIR/artifacts/<target>/ (copy it to
# tests/fuzz/regressions/<target>/ and add a unit test for the fix).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
FUZZ_DIR=${FUZZ_DIR:-$ROOT/build-fuzz}
SECONDS_PER_TARGET=${SECONDS_PER_TARGET:-10}
RUNS=${RUNS:-}
JOBS=${JOBS:-2}
export DEEPINFER_SHARED_DIR=${DEEPINFER_SHARED_DIR:-$ROOT/../shared}

CXX=${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
CC=${FUZZ_CC:-$(command -v clang-14 || command -v clang || true)}
if [ -z "$CXX" ] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long){return 0;}' |
    "$CXX" -x c++ -fsanitize=fuzzer,address,undefined -o /dev/null - >/dev/null 2>&1; then
  echo "fuzz: clang with libFuzzer not usable (apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
mkdir -p "$FUZZ_DIR"
cmake -S tests/fuzz -B "$FUZZ_DIR" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC" \
  -DDI_UNIT_TESTS="${FUZZ_UNIT_TESTS:-ON}" >"$FUZZ_DIR/configure.log" 2>&1 ||
  { cat "$FUZZ_DIR/configure.log"; exit 1; }
# The targets tests/fuzz/CMakeLists.txt defines (it writes the list at configure time).
ALL_TARGETS=$(tr '\n' ' ' <"$FUZZ_DIR/fuzz_targets.txt")
TARGETS=${TARGETS:-$ALL_TARGETS}
for t in $TARGETS; do
  case " $ALL_TARGETS " in *" $t "*) ;; *) echo "fuzz: no target '$t' (targets: $ALL_TARGETS)" >&2; exit 2 ;; esac
done
if [ "${FUZZ_BUILD:-all}" = selected ]; then
  build_targets=()
  for t in $TARGETS; do build_targets+=("fuzz_$t"); done
  nice -n 10 cmake --build "$FUZZ_DIR" -j "$JOBS" --target "${build_targets[@]}"
elif ! nice -n 10 cmake --build "$FUZZ_DIR" -j "$JOBS" >"$FUZZ_DIR/build.log" 2>&1; then
  # Name what did not build (a fuzz target, a link_check_fz_* library guard or a san_ test).
  grep -E "error|undefined reference|Error [0-9]" "$FUZZ_DIR/build.log" | head -40
  echo "fuzz: the build of tests/fuzz failed (full log: $FUZZ_DIR/build.log)" >&2
  exit 1
fi
python3 tests/fuzz/make_seeds.py "$FUZZ_DIR/seeds" >/dev/null

# UBSan reports are errors; libFuzzer's own limits keep each input bounded.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
COMMON=(-timeout=10 -rss_limit_mb=2560 -malloc_limit_mb=2048 -max_len="${MAX_LEN:-8192}" -print_final_stats=1
        ${MAX_TIME:+-max_total_time=$MAX_TIME})
failed=""
mkdir -p "$FUZZ_DIR/long"
for t in $TARGETS; do
  exe="$FUZZ_DIR/fuzz_$t"
  seeds="$FUZZ_DIR/seeds/$t"
  work="$FUZZ_DIR/corpus/$t"
  art="$FUZZ_DIR/artifacts/$t"
  mkdir -p "$work" "$art" "$seeds"
  regress=()
  if [ -d "tests/fuzz/regressions/$t" ]; then regress=(tests/fuzz/regressions/"$t"/*); fi
  # Inputs that still fail in code another helper is fixing (tests/fuzz/known/README.md).
  if [ -n "${DEEPINFER_STRUCTURED_PROBES:-}" ] && [ -d "tests/fuzz/known/$t" ]; then regress+=(tests/fuzz/known/"$t"/*); fi
  # 1. Every seed and regression input once, at full size (some are 100,000 levels deep).
  if ! "$exe" -timeout=30 -rss_limit_mb=2560 "${regress[@]}" "$seeds"/* >"$FUZZ_DIR/$t.seeds.log" 2>&1; then
    echo "fuzz: $t FAILED on a seed or regression input (see $FUZZ_DIR/$t.seeds.log)"
    tail -30 "$FUZZ_DIR/$t.seeds.log"
    failed="$failed $t"
    continue
  fi
  # 2. Fuzz from the seeds (new inputs kept in $work).
  if [ -n "$RUNS" ]; then
    log="$FUZZ_DIR/long/$t.log"
    start=$(date +%s)
    rc=0
    nice -n 10 "$exe" "${COMMON[@]}" -runs="$RUNS" -artifact_prefix="$art/" "$work" "$seeds" >"$log" 2>&1 || rc=$?
    echo "wall_seconds: $(( $(date +%s) - start ))" >>"$log"
  else
    log="$FUZZ_DIR/$t.log"
    rc=0
    "$exe" "${COMMON[@]}" -max_total_time="$SECONDS_PER_TARGET" -artifact_prefix="$art/" "$work" "$seeds" >"$log" 2>&1 || rc=$?
  fi
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (rc $rc) after ${execs:-?} executions; input in $art/ (log $log)"
    grep -E "ERROR|FUZZ_ASSERT|runtime error|Test unit written|terminate" "$log" | head -10
    failed="$failed $t"
  else
    echo "fuzz: $t ok, ${execs:-?} executions"
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz: failing targets:$failed" >&2
  exit 1
fi
