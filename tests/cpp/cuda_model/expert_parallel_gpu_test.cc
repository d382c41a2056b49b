// Expert parallelism on the CUDA backend (cuda_expert_parallel.cpp): ranks are threads of this
// process, each with its own GPU model on the one device and its own stream, joined by a gloo
// group (the host-staged exchange; NCCL would refuse two ranks on one GPU). Each rank runs its
// own sequence in its own chunks, with steps where it has no tokens, while the main layers'
// routed experts are sharded over the ranks (contiguous, and a replicated EPLB-style placement).
// Each rank's logits must match its sequence run alone on one GPU rank: in bf16 the expert rows
// are computed by the same kernels with the same per-row reduction order, so the check is
// bit-identity; in exact numerics the per-expert cuBLASLt fp32 GEMMs see other M, so 1e-5 relative.
// Lines "[gpu-ep]" report the figures. SKIPs without a GPU.
#include <gtest/gtest.h>

#include <execinfo.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/expert_parallel.h"
#include "model/deepseek_v4/model.h"
#include "model/sequence_runner.h"
#include "ops/cuda/runtime.h"
#include "parallel/gloo_group.h"
#include "parallel/launcher.h"

namespace deepinfer::model::v4 {
namespace {
using deepinfer::testing::golden_dir;
using deepinfer::testing::random_chunks;
using deepinfer::testing::read_inputs;
using gpu::Numerics;
using model::ds::ExpertParallel;

struct RankWork {
  std::vector<int32_t> ids;
  std::vector<int64_t> chunks;  // per lockstep step; 0 = no tokens that step
  std::vector<float> logits;    // [ids, V]
};

std::unique_ptr<DeepseekV4CudaModel> load(const std::string& dir, Numerics numerics) {
  CudaModelOptions o;
  o.numerics = numerics;
  o.progress = false;
  o.max_batch_tokens = 512;
  o.max_seqs = 2;
  o.max_context = 1024;
  auto m = DeepseekV4CudaModel::load(dir, o);
  m->allocate_cache_for(2, 512);
  return m;
}

void run_rank(DeepseekV4CudaModel& m, RankWork& w) {
  const kv::CacheGeometry& g = m.cache_geometry();
  const int64_t V = m.vocab_size();
  m.reset_slot(0);
  SeqInBatch seq{.cache_slot = 0, .block_table = slot_block_table(g, 0)};
  w.logits.assign(w.ids.size() * size_t(V), 0.f);
  int64_t done = 0;
  for (int64_t c : w.chunks) {
    ForwardBatch b;
    if (c > 0) {
      b.token_ids.assign(w.ids.begin() + done, w.ids.begin() + done + c);
      seq.num_computed_tokens = done;
      seq.num_new_tokens = int32_t(c);
      b.seqs = {seq};
      for (int64_t i = 0; i < c; ++i) b.logits_indices.push_back(int32_t(i));
    }
    ForwardOutput o = m.run(b, {});
    if (c > 0) std::copy_n(o.logits.data<float>(), c * V, w.logits.data() + done * V);
    done += c;
  }
  ASSERT_EQ(done, int64_t(w.ids.size()));
}

parallel::ExpertPlacement placement_for(int32_t experts, int n, bool replicated, int64_t layer) {
  const int32_t slots = (experts + n - 1) / n;
  if (!replicated) return parallel::contiguous_placement(experts, n, slots);
  std::vector<double> load(static_cast<size_t>(experts));
  for (int32_t e = 0; e < experts; ++e) load[size_t(e)] = double((e * 7 + layer * 3) % experts + 1) * (e % 3 == 0 ? 5 : 1);
  parallel::ExpertPlacement p = parallel::balanced_placement(load, n, slots + 1);
  p.validate();
  return p;
}

// A crash in a rank thread prints its stack (binary+offset; addr2line resolves them).
void print_stack(int sig) {
  void* frames[48];
  const int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct GpuEpCase {
  int n;
  bool replicated;
  Numerics numerics;
};
class ExpertParallelGpu : public ::testing::TestWithParam<GpuEpCase> {};

TEST_P(ExpertParallelGpu, RanksMatchSingleRank) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  if (!parallel::have_gloo()) GTEST_SKIP() << "this build has no gloo";
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  const auto [n, replicated, numerics] = GetParam();
  std::signal(SIGSEGV, print_stack);
  std::signal(SIGABRT, print_stack);
  const auto inputs = read_inputs(dir);
  const std::vector<int32_t> ids = inputs.count("long") ? inputs.at("long") : inputs.begin()->second;
  std::vector<RankWork> work(static_cast<size_t>(n));
  const int64_t steps = 9;
  for (int r = 0; r < n; ++r) {
    RankWork& w = work[size_t(r)];
    const int64_t len = std::min<int64_t>(int64_t(ids.size()) - 5 * r, 40 + 23 * r);
    w.ids.assign(ids.begin() + 5 * r, ids.begin() + 5 * r + len);
    const std::vector<int64_t> cuts = random_chunks(len, uint32_t(17 + r));
    w.chunks.assign(size_t(steps), 0);
    // rank 1 idles for the first steps, the last rank finishes early (zero-token steps at both ends)
    const int64_t first = r == 1 ? 3 : 0, last = r == n - 1 ? steps - 3 : steps;
    int64_t s = first;
    for (int64_t c : cuts) {
      w.chunks[size_t(s)] += c;
      if (s + 1 < last) ++s;
    }
  }
  std::vector<std::vector<float>> alone(static_cast<size_t>(n));
  {
    auto m = load(dir, numerics);
    for (int r = 0; r < n; ++r) {
      RankWork w = work[size_t(r)];
      run_rank(*m, w);
      alone[size_t(r)] = w.logits;
    }
  }
  // The rank models load one after another here (loading is not meant to run in parallel
  // threads of one process: a rank is a process in the engine); the ranks then step concurrently.
  std::vector<std::unique_ptr<DeepseekV4CudaModel>> models;
  for (int r = 0; r < n; ++r) models.push_back(load(dir, numerics));
  parallel::RendezvousDir rdv;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        DI_CUDA_CHECK(cudaSetDevice(0));
        auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "ep", .rank = r, .size = n,
                                             .timeout = std::chrono::milliseconds(120000)});
        DeepseekV4CudaModel* m = models[size_t(r)].get();
        const auto& g = m->arch().dims;
        std::vector<parallel::ExpertPlacement> layouts;
        for (int64_t l = 0; l < m->arch().plan.num_layers(); ++l)
          layouts.push_back(placement_for(int32_t(g.experts), n, replicated, l));
        m->backend().set_expert_parallel(std::make_shared<ExpertParallel>(*pg, layouts));
        EXPECT_TRUE(m->joins_collectives());
        run_rank(*m, work[size_t(r)]);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  bool failed = false;
  for (int r = 0; r < n; ++r) {
    if (!errors[size_t(r)]) continue;
    failed = true;
    try {
      std::rethrow_exception(errors[size_t(r)]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
  if (failed) return;
  const char* mode = numerics == Numerics::kExact ? "exact" : "bf16";
  for (int r = 0; r < n; ++r) {
    const std::vector<float>& a = alone[size_t(r)];
    const std::vector<float>& b = work[size_t(r)].logits;
    ASSERT_EQ(a.size(), b.size());
    const int64_t V = int64_t(a.size() / work[size_t(r)].ids.size());
    float scale = 0.f, diff = 0.f;
    int64_t flips = 0;
    for (int64_t row = 0; row < int64_t(work[size_t(r)].ids.size()); ++row) {
      const float* x = a.data() + row * V;
      const float* y = b.data() + row * V;
      for (int64_t v = 0; v < V; ++v) scale = std::max(scale, std::fabs(x[v])), diff = std::max(diff, std::fabs(x[v] - y[v]));
      flips += (std::max_element(x, x + V) - x) != (std::max_element(y, y + V) - y);
    }
    const bool bitwise = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    std::printf("[gpu-ep] %s %d ranks%s rank %d: max|d| %.3g (rel %.3g), argmax flips %lld, bit-identical %s\n", mode,
                n, replicated ? " replicated" : "", r, diff, diff / std::max(scale, 1e-30f), (long long)flips,
                bitwise ? "yes" : "no");
    if (numerics == Numerics::kExact) {
      EXPECT_LE(diff, 1e-5f * std::max(scale, 1.f)) << mode << " rank " << r;
      EXPECT_EQ(flips, 0) << mode << " rank " << r;
    } else {
      EXPECT_TRUE(bitwise) << mode << " rank " << r << ": max|d| " << diff;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ExpertParallelGpu,
                         ::testing::Values(GpuEpCase{2, false, Numerics::kExact}, GpuEpCase{3, true, Numerics::kExact},
                                           GpuEpCase{2, false, Numerics::kBf16}, GpuEpCase{3, true, Numerics::kBf16}));

}  // namespace
}  // namespace deepinfer::model::v4
