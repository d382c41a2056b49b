// The CausalLM conformance suite (conformance.h) on the CPU backend: every golden fixture, fp32.
// OpenBLAS's sgemm blocks by M, so rows computed in chunks of other sizes round differently in the
// last bits (~6e-6 on these fixtures, as before the redesign): paths are compared with a tolerance
// (a rollback run's chunks also carry the rejected tokens, so its GEMMs have other M too). A wrong
// ring row or stale entry shows as O(1) differences.
#include "conformance.h"

#include "model/deepseek_v4/model.h"

namespace deepinfer::testing {
namespace {

ConformanceCase cpu_case(const std::string& fixture) {
  return {.name = fixture + "/cpu/fp32",
          .fixture = fixture,
          .load = [](const std::string& dir, int64_t rollback) -> std::unique_ptr<model::ds::DeepseekModel> {
            return model::v4::DeepseekV4Model::load(dir, {.max_rollback = rollback});
          },
          .bit_exact_paths = false,
          .bit_exact_rollback = false,
          .tol = 1e-5};
}

INSTANTIATE_TEST_SUITE_P(Cpu, CausalLMConformance,
                         ::testing::Values(cpu_case("tiny"), cpu_case("tiny_clamp"), cpu_case("tiny_official"),
                                           cpu_case("tiny_prod")),
                         [](const auto& info) { return info.param.fixture; });

}  // namespace
}  // namespace deepinfer::testing
