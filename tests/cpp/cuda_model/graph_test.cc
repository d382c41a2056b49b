// Fixed-shape decode and CUDA graphs (DecodePath, cuda_model.h). GPU tests SKIP without a GPU.
//  * moe_decode (device-side routed experts) vs its host twin on random inputs, f32 and bf16;
//  * on the tiny fixture, exact and bf16: graph-replayed decode equals eager fixed-shape decode
//    bit for bit (random batches of 1, 3, 8, 17 sequences, random prompts, 40 steps), and the
//    fixed path (device MoE, padded shapes) matches the general path (grouped MoE) in
//    exact mode (1e-4 bound, value printed). Capture runs in thread-local mode: any host sync inside it fails the capture.
//  * timing lines "[gpu-graph] ..." (eager vs graph per decode step, batch 1 and 8).
// Host-only checks of the fixed-shape metadata run everywhere.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/numeric.h"
#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/cuda/moe_decode.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4 {
namespace {
using gpu::Numerics;

TEST(DecodeMeta, BucketsAndEligibility) {
  EXPECT_EQ(model::decode_bucket(1), 1);
  EXPECT_EQ(model::decode_bucket(3), 4);
  EXPECT_EQ(model::decode_bucket(17), 32);
  EXPECT_EQ(model::decode_bucket(64), 64);
  // Above 64 the decode buckets are the token buckets (one graph per padded size).
  EXPECT_EQ(model::decode_bucket(65), 96);
  EXPECT_EQ(model::decode_bucket(100), 128);
  EXPECT_EQ(model::decode_bucket(256), 256);
  EXPECT_EQ(model::decode_bucket(257), 0);
  for (int64_t b = 1; b <= 256; ++b) EXPECT_EQ(model::decode_bucket(b), model::fixed_token_bucket(b)) << b;
}

// ---- moe_decode vs host twin ----
struct HostMoe {
  std::vector<float> x, w13, w2;  // f32 values (bf16-exact when dtype is bf16)
};
uint16_t bf(float v) { return f32_to_bf16(v); }

void run_moe_case(DType dt, int64_t T, uint32_t seed) {
  const int64_t E = 5, K = 2, D = 64, I = 40;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& e : v) e = dt == DType::kBF16 ? bf16_to_f32(bf(u(gen))) : u(gen);
    return v;
  };
  const std::vector<float> x = fill(T * D);
  std::vector<std::vector<float>> w13, w2;
  for (int64_t e = 0; e < E; ++e) {
    w13.push_back(fill(2 * I * D));
    w2.push_back(fill(D * I));
  }
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> wts(static_cast<size_t>(T * K));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(gen() % E);
    wts[i] = 0.5f + 0.5f * u(gen);
  }
  if (T > 2) ids[3] = int32_t(E + 3);  // out of range: contributes zeros
  const size_t eb = dt == DType::kF32 ? 4 : 2;
  auto raw = [&](const std::vector<float>& v) {
    std::vector<char> r(v.size() * eb);
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kF32) std::memcpy(r.data() + 4 * i, &v[i], 4);
      else { const uint16_t b = bf(v[i]); std::memcpy(r.data() + 2 * i, &b, 2); }
    }
    return r;
  };
  // host
  std::vector<std::vector<char>> h13, h2;
  std::vector<const void*> p13, p2;
  for (int64_t e = 0; e < E; ++e) {
    h13.push_back(raw(w13[size_t(e)]));
    h2.push_back(raw(w2[size_t(e)]));
  }
  for (int64_t e = 0; e < E; ++e) {
    p13.push_back(h13[size_t(e)].data());
    p2.push_back(h2[size_t(e)].data());
  }
  const std::vector<char> hx = raw(x);
  std::vector<char> hact(size_t(T * K * I) * eb);
  std::vector<float> hye(size_t(T * K * D));
  gpu::MoeDecodeParams hp{.x = hx.data(), .expert_ids = ids.data(), .weights = wts.data(), .w13 = p13.data(),
                          .w2 = p2.data(), .act = hact.data(), .ye = hye.data(), .tokens = T, .topk = K,
                          .num_experts = E, .dim = D, .inter = I, .dtype = dt, .limit = 0.7f};
  gpu::moe_decode_host(hp);
  // device
  std::vector<cuda::DeviceBuffer> d13, d2;
  std::vector<const void*> dp13, dp2;
  for (int64_t e = 0; e < E; ++e) {
    d13.emplace_back(h13[size_t(e)].size());
    d2.emplace_back(h2[size_t(e)].size());
    cuda::copy_h2d(d13.back().data(), h13[size_t(e)].data(), h13[size_t(e)].size(), nullptr);
    cuda::copy_h2d(d2.back().data(), h2[size_t(e)].data(), h2[size_t(e)].size(), nullptr);
    dp13.push_back(d13.back().data());
    dp2.push_back(d2.back().data());
  }
  cuda::DeviceBuffer t13(E * sizeof(void*)), t2(E * sizeof(void*)), dx(hx.size()), dids(ids.size() * 4),
      dw(wts.size() * 4), dact(hact.size()), dye(hye.size() * 4);
  cuda::copy_h2d(t13.data(), dp13.data(), E * sizeof(void*), nullptr);
  cuda::copy_h2d(t2.data(), dp2.data(), E * sizeof(void*), nullptr);
  cuda::copy_h2d(dx.data(), hx.data(), hx.size(), nullptr);
  cuda::copy_h2d(dids.data(), ids.data(), ids.size() * 4, nullptr);
  cuda::copy_h2d(dw.data(), wts.data(), wts.size() * 4, nullptr);
  DI_CUDA_CHECK(cudaMemset(dye.data(), 0xFF, dye.size_bytes()));  // poison: NaN
  gpu::MoeDecodeParams dp = hp;
  dp.x = dx.data();
  dp.expert_ids = static_cast<const int32_t*>(dids.data());
  dp.weights = static_cast<const float*>(dw.data());
  dp.w13 = static_cast<const void* const*>(t13.data());
  dp.w2 = static_cast<const void* const*>(t2.data());
  dp.act = dact.data();
  dp.ye = static_cast<float*>(dye.data());
  gpu::moe_decode(dp, nullptr);
  std::vector<float> got(hye.size());
  cuda::copy_d2h(got.data(), dye.data(), got.size() * 4, nullptr);
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "unwritten output " << i;
    max_abs = std::max(max_abs, double(std::abs(got[i] - hye[i])));
    max_ref = std::max(max_ref, double(std::abs(hye[i])));
  }
  const double rel = max_abs / std::max(max_ref, 1e-30);
  // f32: summation order only. bf16: the activations are rounded to bf16 after the up GEMV, so
  // a different fp32 order can flip one rounding (2^-8 relative on one act element).
  EXPECT_LE(rel, dt == DType::kF32 ? 1e-5 : 8e-3) << dtype_name(dt) << " T=" << T;
  std::printf("[gpu-graph] moe_decode %s T=%lld: max rel err %.2e\n", std::string(dtype_name(dt)).c_str(), (long long)T, rel);
}

TEST(MoeDecode, MatchesHostTwin) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t T : {1, 3, 17}) run_moe_case(dt, T, uint32_t(7 * T + (dt == DType::kF32)));
}

// ---- decode paths on the tiny fixture ----
struct DecodeRun {
  std::vector<float> logits;  // all steps, [steps, B, V]
};

// B sequences in slots 0..B-1: random prompts (prefilled through the general path in one batch),
// then `steps` decode steps feeding random token ids (the same for every path).
DecodeRun run_decode(DeepseekV4CudaModel& m, int64_t B, int64_t steps, uint32_t seed, double* ms_per_step = nullptr) {
  const int64_t V = m.vocab_size();
  const kv::CacheGeometry& g = m.cache_geometry();
  const int64_t per_slot = g.num_blocks / g.num_slots;
  std::mt19937 gen(seed);
  std::vector<SeqInBatch> seqs(static_cast<size_t>(B));
  ForwardBatch pre;
  for (int64_t i = 0; i < B; ++i) {
    m.reset_slot(int32_t(i));
    SeqInBatch& s = seqs[size_t(i)];
    s.cache_slot = int32_t(i);
    for (int64_t b = 0; b < per_slot; ++b) s.block_table.push_back(int32_t(i * per_slot + b));
    s.num_computed_tokens = 0;
    s.num_new_tokens = int32_t(1 + gen() % 45);
    for (int64_t j = 0; j < s.num_new_tokens; ++j) pre.token_ids.push_back(int32_t(gen() % V));
    pre.seqs.push_back(s);
  }
  m.forward(pre);
  for (auto& s : seqs) s.num_computed_tokens = s.num_new_tokens;
  DecodeRun r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    ForwardBatch b;
    for (int64_t i = 0; i < B; ++i) {
      SeqInBatch s = seqs[size_t(i)];
      s.num_new_tokens = 1;
      b.seqs.push_back(s);
      b.token_ids.push_back(int32_t(gen() % V));
      b.logits_indices.push_back(int32_t(i));
    }
    Tensor l = m.forward(b);
    r.logits.insert(r.logits.end(), l.data<float>(), l.data<float>() + B * V);
    for (auto& s : seqs) s.num_computed_tokens += 1;
  }
  if (ms_per_step)
    *ms_per_step = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / double(steps);
  return r;
}

class GpuGraph : public ::testing::TestWithParam<Numerics> {
 protected:
  void SetUp() override {
    if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
    const std::string dir = deepinfer::testing::golden_dir("tiny");
    if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
    CudaModelOptions o;
    o.numerics = GetParam();
    o.progress = false;
    o.max_batch_tokens = 2048;
    o.max_seqs = 32;
    o.max_context = 4096;
    o.decode = DecodePath::kGraph;
    model_ = DeepseekV4CudaModel::load(dir, o);
    model_->allocate_cache_for(32, 256);
  }
  std::unique_ptr<DeepseekV4CudaModel> model_;
};

TEST_P(GpuGraph, ReplayEqualsEagerBitForBit) {
  const char* mode = GetParam() == Numerics::kExact ? "exact" : "bf16";
  for (int64_t B : {1, 3, 8, 17}) {
    const uint32_t seed = uint32_t(1000 + B);
    model_->set_decode_path(DecodePath::kFixed);
    const DecodeRun eager = run_decode(*model_, B, 40, seed);
    model_->set_decode_path(DecodePath::kGraph);
    const DecodeRun graph = run_decode(*model_, B, 40, seed);
    EXPECT_EQ(model_->graphs_captured(), 1) << "batch " << B;
    ASSERT_EQ(eager.logits.size(), graph.logits.size());
    int64_t differ = 0;
    for (size_t i = 0; i < eager.logits.size(); ++i)
      differ += std::memcmp(&eager.logits[i], &graph.logits[i], 4) != 0;
    EXPECT_EQ(differ, 0) << mode << " batch " << B << ": graph replay differs from eager";
    // Fixed path (device MoE, padded shapes) vs the general path (grouped MoE).
    model_->set_decode_path(DecodePath::kGeneral);
    const DecodeRun general = run_decode(*model_, B, 40, seed);
    double max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < eager.logits.size(); ++i) {
      max_abs = std::max(max_abs, double(std::abs(eager.logits[i] - general.logits[i])));
      max_ref = std::max(max_ref, double(std::abs(general.logits[i])));
    }
    if (GetParam() == Numerics::kExact)
      // fp32 summation orders only (GEMM algorithms at M = padded vs real rows, attention splits,
      // GEMV vs GEMM experts); the kernel-level check above holds moe_decode to 1e-5.
      EXPECT_LE(max_abs, 1e-4) << "batch " << B << ": fixed/device-MoE path vs general/grouped path";
    else  // bf16: a different fp32 order flips bf16 roundings, which these random models
          // amplify over 40 steps (measured rel up to 0.16 on the H200 with moe_decode, 0.31 at
          // batch 8 with moe_decode_grouped's tensor-core sums, 0.01-0.08 at the other batches);
          // this only guards the bf16 regime.
      EXPECT_LE(max_abs / max_ref, 0.5) << "batch " << B;
    std::printf("[gpu-graph] %s batch %lld x 40 steps: graph vs eager %lld/%zu logits differ; fixed vs general max "
                "abs %.2e (rel %.2e)\n",
                mode, (long long)B, (long long)differ, eager.logits.size(), max_abs, max_abs / max_ref);
  }
}

TEST_P(GpuGraph, DecodeTiming) {
  const char* mode = GetParam() == Numerics::kExact ? "exact" : "bf16";
  for (int64_t B : {1, 8}) {
    double ms[3] = {0, 0, 0};
    const DecodePath paths[3] = {DecodePath::kGeneral, DecodePath::kFixed, DecodePath::kGraph};
    for (int i = 0; i < 3; ++i) {
      model_->set_decode_path(paths[i]);
      run_decode(*model_, B, 5, 7);  // warm-up (and capture)
      run_decode(*model_, B, 60, 8, &ms[i]);
    }
    std::printf("[gpu-graph] tiny %s batch %lld decode step (host clock incl. logits copy): general %.3f ms, "
                "fixed eager %.3f ms, graph %.3f ms\n",
                mode, (long long)B, ms[0], ms[1], ms[2]);
  }
}

// Decode batches above 64 sequences: in bf16 (grouped MoE available) they take the fixed path and
// a graph per padded size (96 / 128 / 192 / 256 buckets), as batches up to 64 do; in exact numerics
// (moe_decode's limit of 64 tokens) they run the general path. Before the wide buckets, every
// step of 65-256 sequences ran eagerly with the prefill-sized expert GEMM.
TEST(GpuGraphWide, BatchesAbove64TakeTheFixedPathInBf16) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = deepinfer::testing::golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  for (const Numerics n : {Numerics::kBf16, Numerics::kExact}) {
    CudaModelOptions o;
    o.numerics = n;
    o.progress = false;
    o.max_batch_tokens = 8192;
    o.max_seqs = 160;
    o.max_context = 1024;
    o.decode = DecodePath::kGraph;
    auto m = DeepseekV4CudaModel::load(dir, o);
    m->allocate_cache_for(160, 128);
    for (int64_t B : {77, 130}) {
      const uint32_t seed = uint32_t(77 + B);
      m->set_decode_path(DecodePath::kGraph);
      const DecodeRun graph = run_decode(*m, B, 12, seed);
      const int64_t graphs = m->graphs_captured();  // before set_decode_path, which drops them
      m->set_decode_path(DecodePath::kGeneral);
      const DecodeRun general = run_decode(*m, B, 12, seed);
      double max_abs = 0, max_ref = 0;
      for (size_t i = 0; i < graph.logits.size(); ++i) {
        max_abs = std::max(max_abs, double(std::abs(graph.logits[i] - general.logits[i])));
        max_ref = std::max(max_ref, double(std::abs(general.logits[i])));
      }
      if (n == Numerics::kBf16) {
        EXPECT_EQ(graphs, 1) << "batch " << B << " (bucket " << model::decode_bucket(B) << ")";
        m->set_decode_path(DecodePath::kFixed);
        const DecodeRun eager = run_decode(*m, B, 12, seed);
        EXPECT_EQ(std::memcmp(eager.logits.data(), graph.logits.data(), eager.logits.size() * 4), 0)
            << "batch " << B << ": graph replay differs from the fixed eager step";
        EXPECT_LE(max_abs / max_ref, 0.5) << "batch " << B;  // the bf16 guard of ReplayEqualsEagerBitForBit
      } else {
        EXPECT_EQ(graphs, 0) << "exact numerics: batch " << B << " is above moe_decode's 64";
        EXPECT_EQ(max_abs, 0.0) << "exact numerics: both runs take the general path";
      }
      std::printf("[gpu-graph-wide] %s batch %lld x 12 steps: graph path vs general max abs %.2e (rel %.2e), graphs %lld\n",
                  n == Numerics::kExact ? "exact" : "bf16", (long long)B, max_abs, max_abs / max_ref, (long long)graphs);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuGraph, ::testing::Values(Numerics::kExact, Numerics::kBf16),
                         [](const auto& i) { return std::string(i.param == Numerics::kExact ? "exact" : "bf16"); });

}  // namespace
}  // namespace deepinfer::model::v4
