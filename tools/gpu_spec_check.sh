#!/usr/bin/env bash
# Speculative decoding (issue #11) on the GPU: copies the tree to /tmp/spec-src, applies .devcarry-spec/spec.patch
# when carried (a branch vs main: git diff main BRANCH > .devcarry-spec/spec.patch), builds
# the test targets with ninja -j16, runs the GPU tests, the timings and the CPU tests of the area.
# Logs go to $OUT. Device: run "bash tools/gpu_spec_check.sh", carry [".gpudeps"] (and ".devcarry-spec" with a patch).
# About 75 s on the H200 (build 45 s). Env: SPEC_TARGETS, GPU_FILTER, GPU_T, TIME_T, CPU_T.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd); C=$ROOT/.devcarry-spec; T0=$(date +%s); OUT=${OUT:-/tmp/spec-out}; mkdir -p "$OUT"
step() { echo "== spec [$(( $(date +%s) - T0 ))s] $*"; }
export PATH=/usr/local/cuda/bin:$PATH
source tools/gpu_deps.sh; di_use_gpu_deps || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
SRC=/tmp/spec-src B=/tmp/spec-build
step "copy tree, apply patch"
mkdir -p $SRC && tar --exclude=./.gpudeps --exclude=./.devcarry-spec -cf - . | tar -xf - -C $SRC
if [ -s "$C/spec.patch" ]; then
  (cd $SRC && (git apply --whitespace=nowarn $C/spec.patch || patch -p1 -s < $C/spec.patch)) || { echo "patch failed"; exit 1; }
fi
step configure
cmake -S $SRC -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_BUILD_PYTHON=OFF -DDEEPINFER_CUDA_SM90_ONLY=ON \
  "${CMAKE_DEP_ARGS[@]}" > $OUT/configure.log 2>&1 || { tail -30 $OUT/configure.log; exit 1; }
step build
cmake --build $B -j16 --target ${SPEC_TARGETS:-cuda_model_test deepseek_v4_forward_test engine_test} > $OUT/build.log 2>&1 \
  || { grep -E "error|Error" $OUT/build.log | head -40; exit 1; }
bin() { find $B/tests -name "$1" -type f -perm -u+x | head -1; }
export DEEPINFER_SOURCE_DIR=$SRC
step "GPU tests"
timeout ${GPU_T:-110} $(bin cuda_model_test) --gtest_filter="${GPU_FILTER:-GlueKernels.*:*GpuSpec.*:Cuda/CausalLMConformance.Drafter*:GpuEngine.GraphReplay*:*GpuGraph.ReplayEqualsEagerBitForBit*}" > $OUT/gpu_tests.log 2>&1; echo "rc $?"
grep -E "^\[spec-gpu\]|FAILED|PASSED|Failure" $OUT/gpu_tests.log | head -60
step timing
timeout ${TIME_T:-70} $(bin cuda_model_test) --gtest_filter='GpuSpecTiming.*' > $OUT/gpu_timing.log 2>&1; echo "rc $?"
grep -E "^\[spec-gpu\]|FAILED|PASSED|Failure" $OUT/gpu_timing.log
step "CPU tests"
( timeout 30 $(bin deepseek_v4_forward_test) --gtest_filter='FixedVerifyPlan.*' ; timeout ${CPU_T:-70} $(bin engine_test) --gtest_filter='Spec*:ChooseDraftLengths.*:MeasureStepCost.*:StepCostModel.*:AcceptanceModel.*:RejectionSampling*' ) > $OUT/cpu_tests.log 2>&1; echo "rc $?"
grep -E "FAILED|PASSED|Failure|^\[  SKIPPED" $OUT/cpu_tests.log | head -30
step done
