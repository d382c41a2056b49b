// The CUDA backend's expert parallelism at world size 1 on the tiny golden model, through the
// backend's own MoE code (cuda_expert_parallel.cpp): the device exchange over a real NCCL group of
// one, the host-staged exchange over the single-rank host group, and no expert parallelism at all
// must give the same logits bit for bit, in exact numerics (per-expert cuBLASLt) and bf16 (grouped
// GEMM), over chunked prefill and decode steps. Skips without a GPU or the fixture.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/expert_parallel.h"
#include "model/sequence_runner.h"
#include "ops/cuda/runtime.h"
#include "parallel/device_all_to_all.h"
#if DEEPINFER_HAVE_NCCL
#include "parallel/nccl_group.h"
#endif

namespace deepinfer::model::v4 {
namespace {
using deepinfer::testing::golden_dir;
using deepinfer::testing::read_inputs;
using gpu::Numerics;

// Logits of every position of `ids` fed in `chunks` (one forward each), as a flat vector.
std::vector<float> run_chunks(DeepseekV4CudaModel& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks) {
  const Tensor l = run_sequence(m, m.cache_geometry(), ids, chunks);
  return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
}

class EpBackendGpu : public ::testing::TestWithParam<Numerics> {};

TEST_P(EpBackendGpu, DeviceExchangeMatchesHostStagedAndOneRank) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda::cuda_unavailable_reason();
#if !DEEPINFER_HAVE_NCCL
  GTEST_SKIP() << "built without NCCL";
#else
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  gpu::CudaModelOptions o;
  o.numerics = GetParam();
  o.progress = false;
  o.max_batch_tokens = 1024;
  o.max_seqs = 2;
  o.max_context = 2048;
  auto m = DeepseekV4CudaModel::load(dir, o);
  m->allocate_cache_for(1, 1024);
  const auto inputs = read_inputs(dir);
  const std::vector<int32_t> ids = inputs.count("long") ? inputs.at("long") : inputs.begin()->second;
  const int64_t n = std::min<int64_t>(int64_t(ids.size()), 61);
  const std::vector<int32_t> use(ids.begin(), ids.begin() + n);
  std::vector<int64_t> chunks = {n - 4, 1, 1, 1, 1};  // a prefill, then decode-sized steps
  const std::vector<float> alone = run_chunks(*m, use, chunks);

  const auto& dims = m->arch().dims;
  std::vector<parallel::ExpertPlacement> layouts;
  for (int64_t l = 0; l < m->arch().plan.num_layers(); ++l)
    layouts.push_back(parallel::contiguous_placement(int32_t(dims.experts), 1, int32_t(dims.experts)));
  auto host = parallel::make_single_rank_group();
  // Host-staged (no device exchange).
  m->cuda().set_expert_parallel(std::make_shared<ds::ExpertParallel>(*host, layouts));
  const std::vector<float> staged = run_chunks(*m, use, chunks);
  // Device exchange over NCCL, the same code path several GPUs take.
  auto nccl = parallel::make_nccl_group(*host, 0, "ep-backend");
  auto ep = std::make_shared<ds::ExpertParallel>(*host, layouts);
  ep->set_device_exchange(std::shared_ptr<parallel::DeviceAllToAllV>(parallel::make_group_all_to_all(*nccl)));
  m->cuda().set_expert_parallel(ep);
  const std::vector<float> device = run_chunks(*m, use, chunks);
  m->cuda().set_expert_parallel(nullptr);

  ASSERT_EQ(staged.size(), alone.size());
  ASSERT_EQ(device.size(), alone.size());
  EXPECT_EQ(std::memcmp(device.data(), staged.data(), device.size() * 4), 0) << "device exchange vs host-staged";
  EXPECT_EQ(std::memcmp(device.data(), alone.data(), device.size() * 4), 0) << "device exchange vs one rank";
  EXPECT_EQ(std::memcmp(staged.data(), alone.data(), staged.size() * 4), 0) << "host-staged vs one rank";
  // EPLB is not built with the device exchange: refused by name.
  auto eplb = std::make_shared<ds::ExpertParallel>(*host, layouts, ds::EplbOptions{.enabled = true});
  try {
    eplb->set_device_exchange(std::shared_ptr<parallel::DeviceAllToAllV>(parallel::make_group_all_to_all(*nccl)));
    FAIL() << "EPLB accepted with the device exchange";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("EPLB"), std::string::npos) << e.what();
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(Modes, EpBackendGpu, ::testing::Values(Numerics::kExact, Numerics::kBf16),
                         [](const auto& i) { return std::string(i.param == Numerics::kExact ? "exact" : "bf16"); });

}  // namespace
}  // namespace deepinfer::model::v4
