// The CausalLM conformance suite (tests/cpp/model/conformance.h) on the CUDA backend: the golden
// fixtures in exact numerics (fp32 end to end: paths agree to ~1e-6, not bit for bit, since
// cuBLASLt picks kernels by shape) and in bf16 / production numerics (the bf16 regime of these
// random models: paths agree within a few percent of the logit scale, greedy flips possible).
// Skips without a GPU.
#include "conformance.h"

#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/cuda/v41_cuda_model.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::testing {
namespace {
using model::v4::gpu::Numerics;

ConformanceCase gpu_case(const std::string& fixture, Numerics n, const char* tag) {
  const bool exact = n == Numerics::kExact;
  return {.name = fixture + "/cuda/" + tag,
          .fixture = fixture,
          .load = [n](const std::string& dir, int64_t rollback) -> std::unique_ptr<model::ds::DeepseekModel> {
            if (deepinfer::cuda::cuda_device_count() == 0) return nullptr;
            model::v4::CudaModelOptions o;
            o.numerics = n;
            o.progress = false;
            o.max_batch_tokens = 1024;
            o.max_seqs = 8;
            o.max_context = 2048;
            o.max_rollback = rollback;
            return model::v4::DeepseekV4CudaModel::load(dir, o);
          },
          .bit_exact_paths = false,
          .bit_exact_rollback = false,
          .tol = exact ? 2e-5 : 0.2,
          .argmax_exact = exact};
}

// DeepSeek-V4.1 on the GPU (exact, QAT roundings off as in the CPU instance conformance_v41_test.cc:
// with them a last-bit difference between chunk sizes crosses an FP4/FP8 step now and then). Its
// Engram histories cross rollbacks and snapshots; v41_a_release adds the DSpark drafter (taps from
// the device, stages on the host), whose rings the drafter tests roll back.
ConformanceCase v41_gpu_case(const std::string& fixture) {
  return {.name = fixture + "/cuda/exact-noqat",
          .fixture = fixture,
          .load = [](const std::string& dir, int64_t rollback) -> std::unique_ptr<model::ds::DeepseekModel> {
            if (deepinfer::cuda::cuda_device_count() == 0) return nullptr;
            model::v4::CudaModelOptions o;
            o.numerics = Numerics::kExact;
            o.progress = false;
            o.max_batch_tokens = 1024;
            o.max_seqs = 8;
            o.max_context = 2048;
            o.max_rollback = rollback;
            return model::v41::load_v41_cuda(dir, o, {.qat = false});
          },
          .bit_exact_paths = false,
          .bit_exact_rollback = false,
          .tol = 2e-5,
          .sequence = "t161"};
}
INSTANTIATE_TEST_SUITE_P(V41Cuda, CausalLMConformance,
                         ::testing::Values(v41_gpu_case("v41_a"), v41_gpu_case("v41_b"),
                                           v41_gpu_case("v41_a_release")),  // + the DSpark drafter
                         [](const auto& info) { return info.param.fixture; });

INSTANTIATE_TEST_SUITE_P(
    Cuda, CausalLMConformance,
    ::testing::Values(gpu_case("tiny", Numerics::kExact, "exact"), gpu_case("tiny_official", Numerics::kExact, "exact"),
                      gpu_case("tiny_prod", Numerics::kExact, "exact"), gpu_case("tiny_official", Numerics::kBf16, "bf16"),
                      gpu_case("tiny_prod", Numerics::kProduction, "production")),
    [](const auto& info) {
      std::string s = info.param.name;
      for (char& c : s)
        if (c == '/') c = '_';
      return s;
    });

}  // namespace
}  // namespace deepinfer::testing
