#!/usr/bin/env bash
# compute-sanitizer over a gtest binary of CUDA tests, one process per test suite, within a time
# budget, with a short summary: errors per suite and per test, for each tool. Called by
# tools/gpu_check.sh on cuda_ops_test (issue #20); runs alone too:
#   tools/cuda_sanitize.sh BIN LOG_DIR
# Environment:
#   SAN_BUDGET      seconds for all runs together (default 100, so all of gpu_check stays near 230 s);
#                   runs left when it is spent are listed as "skipped (budget)", not run
#   RACECHECK_SHARE percent of SAN_BUDGET kept for racecheck (default 50): memcheck stops starting
#                   suites once it has used the rest, so racecheck always gets its share (it used to
#                   get nothing when memcheck took the whole budget)
#   SAN_SUITE_LIMIT seconds one memcheck suite may run (default 120); past it: "timeout"
#   MEMCHECK_EXCLUDE gtest patterns left out of both tools (default: every timing test, which only
#                   repeats kernels the correctness tests run, and the deliberate OOM test)
#   RACECHECK_SUITES suites whose kernels use shared memory (default: the op tests' ones); racecheck
#                   runs each of their tests in its own process, with an equal share of what is left
#                   of the racecheck time as its limit
#   RACECHECK_LAUNCHES deepinfer kernel launches racecheck checks per test (default 40; 0 = all):
#                   compute-sanitizer's --launch-count, so a test whose cases launch hundreds of
#                   kernels finishes (its first cases, the small and odd sizes, are checked) instead
#                   of timing out unchecked; later launches run unchecked
#   MEMCHECK_ARGS   extra memcheck options (e.g. "--leak-check full"; off by default: cached
#                   device buffers that live until exit would read as leaks)
# Tools: memcheck (out-of-bounds / misaligned accesses, errors of CUDA API calls, device-side
# leaks) on every suite; racecheck (shared-memory hazards) on the suites whose kernels stage data
# in __shared__, limited to deepinfer's own kernels (--kernel-name kernel_substring=deepinfer:
# cuBLAS kernels run uninstrumented). Exit status: 0 when every run finished with 0 errors, 1 otherwise (an error,
# a crash, a timeout or a run skipped for the budget).
set -uo pipefail
BIN=${1:?usage: cuda_sanitize.sh BIN LOG_DIR}
LOG_DIR=${2:?usage: cuda_sanitize.sh BIN LOG_DIR}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$SAN" ] || { echo "cuda_sanitize: compute-sanitizer not found (CUDA toolkit's bin/)"; exit 1; }
SAN_BUDGET=${SAN_BUDGET:-100}
RACECHECK_SHARE=${RACECHECK_SHARE:-50}
SAN_SUITE_LIMIT=${SAN_SUITE_LIMIT:-120}
RACECHECK_LAUNCHES=${RACECHECK_LAUNCHES:-40}
MEMCHECK_EXCLUDE=${MEMCHECK_EXCLUDE:-CudaTiming.*:*.*Timing*:CudaRuntime.OutOfMemoryIsTyped}
RACECHECK_SUITES=${RACECHECK_SUITES:-CudaSparseAttention CudaEngram CudaGroupedGemm CudaHc CudaIndexer CudaMoeRoute CudaRmsNorm CudaRouter CudaSampling}
mkdir -p "$LOG_DIR/sanitizer"
T0=$(date +%s)

# The binary's suites, in its order (gtest_list_tests: "Suite." lines, tests indented below).
mapfile -t SUITES < <("$BIN" --gtest_list_tests 2>/dev/null | grep -E '^[A-Za-z0-9_/]+\.' | sed 's/\..*//' | awk '!seen[$0]++')
[ ${#SUITES[@]} -gt 0 ] || { echo "cuda_sanitize: $BIN lists no tests"; exit 1; }

# Errors per test from one log: compute-sanitizer's reports are interleaved with gtest's output,
# so each report (a line "========= <Kind>..." not indented, not the summary or banner) is
# counted against the test whose "[ RUN      ]" came last ("(start-up)" before any).
count_per_test() {
  awk '
    /^\[ RUN      \] / { cur = $4; if (!(cur in n)) { n[cur] = 0; order[++k] = cur } next }
    /^========= [^ ]/ {
      if ($0 ~ /ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER|Target application returned|process did.t terminate|^========= *$/) next
      t = cur == "" ? "(start-up)" : cur
      if (!(t in n)) { n[t] = 0; order[++k] = t }
      n[t]++
    }
    END { for (i = 1; i <= k; i++) if (n[order[i]] > 0) printf "    %-60s %d\n", order[i], n[order[i]] }' "$1"
}

# The errors a run reports: memcheck "ERROR SUMMARY: N errors", racecheck "RACECHECK SUMMARY:
# N hazards displayed (E errors, W warnings)" (errors and warnings both count).
errors_in() {
  local log=$1 e
  e=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -1 | grep -oE '[0-9]+')
  if grep -q 'RACECHECK SUMMARY' "$log"; then
    e=$(grep -oE 'RACECHECK SUMMARY: .*' "$log" | tail -1 | grep -oE '[0-9]+ (errors?|warnings?)' |
        awk '{ s += $1 } END { if (NR) print s }')
  fi
  echo "${e:-?}"
}

bad=0
SUMMARY=()
skip_line() {  # tool name reason
  SUMMARY+=("$(printf '%-10s %-40s %7s %6s  %s' "$1" "$2" - - "$3")")
  bad=1
}
run_one() {  # tool name limit-seconds filter extra-args...
  local tool=$1 name=$2 left=$3 filter=$4; shift 4
  local log="$LOG_DIR/sanitizer/$tool.$name.log" start rc errs verdict
  if [ "$left" -le 3 ]; then skip_line "$tool" "$name" "skipped (budget ${SAN_BUDGET}s spent)"; return; fi
  start=$(date +%s)
  # --error-exitcode makes a run with findings fail even when every test passed;
  # --print-limit bounds the log of a badly broken kernel; the summary still counts every error.
  timeout -k 10 "$left" "$SAN" --tool "$tool" --error-exitcode 9 --print-limit 200 "$@" \
    "$BIN" --gtest_color=no --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  errs=$(errors_in "$log")
  case $rc in
    0) verdict=clean ;;
    9) verdict="ERRORS" ;;
    124|137) verdict="timeout (${left}s)" ;;
    *) verdict="rc $rc (test failure or crash)" ;;
  esac
  # A test that passed without touching the device (a host-twin check in a kernel suite) makes the
  # sanitizer exit 255 with this message: nothing was instrumented, so nothing can be unclean.
  if [ "$rc" = 255 ] && grep -q 'terminated before first instrumented API call' "$log" &&
     grep -q '^\[  PASSED  \]' "$log"; then
    rc=0; errs=0; verdict="no device work (host-only test)"
  fi
  # A racecheck warning does not set the exit code; it still counts.
  if [ "$rc" = 0 ] && [ "$errs" != 0 ] && [ "$errs" != "?" ]; then rc=9; verdict=ERRORS; fi
  [ "$rc" = 0 ] || bad=1
  SUMMARY+=("$(printf '%-10s %-40s %7s %5ss  %s' "$tool" "$name" "$errs" "$(( $(date +%s) - start ))" "$verdict")")
  if [ "$rc" != 0 ]; then
    local per
    per=$(count_per_test "$log")
    [ -n "$per" ] && SUMMARY+=("$per")
    grep -m3 -E '^========= (Invalid|Error|Program hit|Race|Warning|Uninitialized|Leaked|Barrier)' "$log" |
      sed "s/^/      first: /" >"$log.first"
    [ -s "$log.first" ] && SUMMARY+=("$(cat "$log.first")")
  fi
}
elapsed() { echo $(( $(date +%s) - T0 )); }

# memcheck: every suite, one process each, within SAN_BUDGET less racecheck's share.
MEM_BUDGET=$(( SAN_BUDGET * (100 - RACECHECK_SHARE) / 100 ))
for s in "${SUITES[@]}"; do
  case ":$MEMCHECK_EXCLUDE:" in *":$s.*:"*) continue ;; esac  # a suite left out whole (timings)
  left=$(( MEM_BUDGET - $(elapsed) ))
  [ "$left" -gt "$SAN_SUITE_LIMIT" ] && left=$SAN_SUITE_LIMIT
  run_one memcheck "$s" "$left" "$s.*:-$MEMCHECK_EXCLUDE" ${MEMCHECK_ARGS:-}
done

# racecheck: each test of the shared-memory suites in its own process (the argument-check tests
# launch nothing and are left out), an equal share of the time left each, the first
# RACECHECK_LAUNCHES deepinfer kernel launches checked.
RACE_ARGS=(--kernel-name kernel_substring=deepinfer)
if [ "$RACECHECK_LAUNCHES" -gt 0 ] && "$SAN" --help 2>&1 | grep -q -- '--launch-count'; then
  RACE_ARGS+=(--launch-count "$RACECHECK_LAUNCHES")
  RACE_NOTE="first $RACECHECK_LAUNCHES deepinfer launches of each test"
else
  RACE_NOTE="every deepinfer launch"
fi
RACE_TESTS=()
for s in $RACECHECK_SUITES; do
  printf '%s\n' "${SUITES[@]}" | grep -qx "$s" || continue
  while read -r t; do
    case "$t" in *Reject*|*BadArgument*|*TypedErrors*|*Throw*|*Timing*) continue ;; esac
    case ":$MEMCHECK_EXCLUDE:" in *":$s.$t:"*) continue ;; esac
    RACE_TESTS+=("$s.$t")
  done < <("$BIN" --gtest_list_tests --gtest_filter="$s.*" 2>/dev/null | grep -E '^  [A-Za-z0-9_/]+' | sed 's/^  //; s/ .*//')
done
n_left=${#RACE_TESTS[@]}
for t in "${RACE_TESTS[@]}"; do
  left=$(( (SAN_BUDGET - $(elapsed)) / n_left ))
  n_left=$(( n_left - 1 ))
  run_one racecheck "$t" "$left" "$t" "${RACE_ARGS[@]}"
done

{
  echo "tool       suite (memcheck) / test (racecheck: $RACE_NOTE)  errors  time   result   (logs: $LOG_DIR/sanitizer/)"
  printf '%s\n' "${SUMMARY[@]}"
  echo "compute-sanitizer: $(( $(date +%s) - T0 ))s of a ${SAN_BUDGET}s budget; $([ $bad = 0 ] && echo clean || echo NOT CLEAN)"
} | tee "$LOG_DIR/sanitizer_summary.txt"
exit $bad
