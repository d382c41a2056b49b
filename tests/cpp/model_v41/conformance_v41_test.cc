// The CausalLM conformance suite (tests/cpp/model/conformance.h) for DeepSeek-V4.1 on the CPU
// backend: both golden configs on their longest sequence (161 tokens: the candidate filter cuts,
// ratio-2 pairs cross chunk and step boundaries, Engram histories cross rollbacks and snapshots).
// Run without the QAT roundings (V41PlanOptions::qat = false), at 1e-5: OpenBLAS rounds rows of other
// chunk sizes differently in the last bits, and with the roundings on such a difference now and then
// crosses an FP4/FP8 step and moves later rows by O(0.1-1) (V41-REFERENCE-NOTES.md §1; measured:
// one rollback trial of v41_a 1.3 with 11 argmax flips, v41_b token by token 0.18). Without them every
// path (chunks, batches, rollbacks, snapshots) agrees to <= 1e-5, which is what this suite is for;
// the model's own numerics (QAT on) are checked against the reference in forward_test.cc.
#include "../model/conformance.h"

#include "model/deepseek_v41/model.h"

namespace deepinfer::testing {
namespace {

// The model's own numerics (QAT on) with DEEPINFER_BATCH_INVARIANT's fixed-order products: a row's
// result no longer depends on its chunk or batch, so every path agrees bit for bit, roundings and all.
ConformanceCase v41_invariant_case(const std::string& fixture) {
  return {.name = fixture + "/cpu/fp32-batch-invariant",
          .fixture = fixture,
          .load = [](const std::string& dir, int64_t rollback) -> std::unique_ptr<model::ds::DeepseekModel> {
            return model::v41::DeepseekV41Model::load(dir, {.max_rollback = rollback, .batch_invariant = true});
          },
          .bit_exact_paths = true,
          .bit_exact_rollback = true,
          .tol = 1e-5,
          .sequence = "t161"};
}

ConformanceCase v41_case(const std::string& fixture) {
  return {.name = fixture + "/cpu/fp32-noqat",
          .fixture = fixture,
          .load = [](const std::string& dir, int64_t rollback) -> std::unique_ptr<model::ds::DeepseekModel> {
            return model::v41::DeepseekV41Model::load(dir, {.max_rollback = rollback, .qat = false});
          },
          .bit_exact_paths = false,
          .bit_exact_rollback = false,
          .tol = 1e-5,
          .sequence = "t161"};
}

INSTANTIATE_TEST_SUITE_P(V41Cpu, CausalLMConformance, ::testing::Values(v41_case("v41_a"), v41_case("v41_b")),
                         [](const auto& info) { return info.param.fixture; });
// v41_a_release holds the DSpark stages: its instance also runs the drafter tests (the DSpark rings
// fed step by step with rollbacks == fed at once, bit for bit with the model's QAT numerics).
INSTANTIATE_TEST_SUITE_P(V41CpuInvariant, CausalLMConformance,
                         ::testing::Values(v41_invariant_case("v41_a"), v41_invariant_case("v41_b"),
                                           v41_invariant_case("v41_a_release")),
                         [](const auto& info) { return info.param.fixture; });

}  // namespace
}  // namespace deepinfer::testing
