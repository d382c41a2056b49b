// The accelerator the engine tests run on: the CPU unless DEEPINFER_TEST_ACCELERATOR says
// `nvidia`, which runs the same bit-identity checks on the GPU (tools/gpu_check.sh does so on the
// H200 with the prebuilt engine_test). Anything else is a test-setup error, named.
#pragma once
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/env.h"

namespace deepinfer::test {

inline Accelerator test_accelerator() {
  const char* v = std::getenv("DEEPINFER_TEST_ACCELERATOR");
  const std::string s = v ? v : "";
  if (s.empty() || s == "cpu") return Accelerator::kCPU;
  if (s == "nvidia") return Accelerator::kNvidia;
  throw std::invalid_argument("DEEPINFER_TEST_ACCELERATOR=" + s + ": expected cpu or nvidia");
}

}  // namespace deepinfer::test
