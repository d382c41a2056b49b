// Dense FP8 linears kept FP8 on the GPU (cuda_plan.h device_dense_fp8, cuda_weights up_dense,
// cuda_layers linear: ops/cuda/gemm_fp8w up to kDenseFp8PrefillM tokens, dequantise-to-scratch +
// cuBLASLt above). The plan checks run without a GPU; the model checks SKIP without one.
//  * the memory plan counts 1 byte per FP8 weight + its e8m0 grid, the arena carves the GEMM's
//    workspace (decode sizes) or the bf16 scratch (prefill sizes);
//  * tiny_official (FP8 dense weights) in bf16 numerics, "long" input (300 tokens): FP8-native vs
//    the dense linears dequantised at upload (DensePath::kDequantised), in one chunk, token by
//    token and in random chunks of 1..40 (all gemm_fp8w: <= kDenseFp8PrefillM tokens), and on the
//    fixed decode path; the two differ only in fp32 summation order (gemm_fp8w vs cuBLASLt),
//    which bf16 roundings and this random model amplify: max difference and top-1 agreement are
//    printed. FP8-native is chunking-invariant (bit identical token by token and in one chunk:
//    gemm_fp8w's order does not depend on M). "long" twice (600 tokens) in one chunk takes the
//    prefill path (dequantise to scratch + cuBLASLt): bit identical to the dequantised model.
// Lines "[gpu-fp8] ..." are collected by tools/gpu_model_check.sh.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "golden.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek/cuda/arena.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/cuda/v4_device.h"
#include "model/deepseek_v4/plan.h"
#include "model/deepseek_v4/tensors.h"
#include "model/sequence_runner.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4 {
namespace {

DeepseekV4Config flash_like() {
  DeepseekV4Config c;
  c.hidden_size = 4096;
  c.num_heads = 64;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.q_lora_rank = 1024;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.moe_intermediate_size = 2048;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 6;
  c.n_shared_experts = 1;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.vocab_size = 129280;
  c.sliding_window = 128;
  c.num_layers = 2;
  c.layer_types = {AttnKind::kCSA, AttnKind::kHCA};
  c.compress_ratio = {4, 128};
  c.mlp_types = {MlpKind::kMoE, MlpKind::kMoE};
  c.dense_format = WeightFormat::kFP8Block;
  c.expert_format = WeightFormat::kFP4;
  return c;
}

TEST(DenseFp8Plan, CountsFp8BytesAndScratch) {
  const DeepseekV4Config c = flash_like();
  const gpu::DensePath native_path = gpu::DensePath::kNative, deq_path = gpu::DensePath::kDequantised;
  EXPECT_TRUE(gpu::v4_dense_fp8(c, gpu::Numerics::kBf16, native_path));
  EXPECT_TRUE(gpu::v4_dense_fp8(c, gpu::Numerics::kProduction, native_path));
  EXPECT_FALSE(gpu::v4_dense_fp8(c, gpu::Numerics::kExact, native_path));
  EXPECT_FALSE(gpu::v4_dense_fp8(c, gpu::Numerics::kBf16, deq_path));
  const CudaModelOptions bf16{.numerics = gpu::Numerics::kBf16}, bf16_deq{.numerics = gpu::Numerics::kBf16,
                                                                           .dense = deq_path};
  const size_t native = CudaHostPlan::make(c, bf16).weight_bytes;
  const size_t deq = CudaHostPlan::make(c, bf16_deq).weight_bytes;
  // per layer: the dense FP8 linears' elements once in bf16 (2 B) vs FP8 (1 B + e8m0 per 128x128)
  const ModelPlan plan = v4_plan(c, {});
  const TensorTable table = v4_tensor_table(c, plan, nullptr, nullptr);
  int64_t elems = 0, scales = 0;
  for (const TensorEntry& e : table.entries) {
    if (e.kind != EntryKind::kLinear || e.role != LinearRole::kDense) continue;
    const int64_t sr = e.parts.size() > 1 && e.parts[0].shape[0] % 128 ? 16 : 128;
    elems += e.numel();
    scales += (e.rows() + sr - 1) / sr * ((e.cols() + 127) / 128);
  }
  EXPECT_EQ(int64_t(deq - native), elems - scales);
  std::printf("[gpu-fp8] plan: V4-Flash dense FP8 linears of a CSA+HCA pair: %.1f MB FP8 (bf16 %.1f MB)\n",
              double(elems + scales) / 1e6, 2.0 * double(elems) / 1e6);
  // exact numerics: unchanged by the dense path (f32 everywhere)
  EXPECT_EQ(CudaHostPlan::make(c, {.numerics = gpu::Numerics::kExact}).weight_bytes,
            CudaHostPlan::make(c, {.numerics = gpu::Numerics::kExact, .dense = deq_path}).weight_bytes);
  // arena: no K-split workspace at decode sizes (gemm_fp8w sums its K split inside a thread-block
  // cluster, fp8w_workspace_bytes() == 0), the bf16 scratch (largest linear: wq_b) above
  size_t ws = 0, wdq = 0;
  gpu::v4_fp8_workspace(c, table, bf16, 8, &ws, &wdq);
  EXPECT_EQ(ws, 0u);
  EXPECT_EQ(wdq, 0u);
  gpu::v4_fp8_workspace(c, table, bf16, gpu::kDenseFp8PrefillM + 1, &ws, &wdq);
  EXPECT_EQ(ws, 0u);
  EXPECT_EQ(wdq, size_t(64 * 512) * 1024 * 2);
  gpu::v4_fp8_workspace(c, table, {.numerics = gpu::Numerics::kExact}, 8, &ws, &wdq);  // exact: neither
  EXPECT_EQ(ws + wdq, 0u);
}

// ---- model level ----
using Diff = deepinfer::testing::LogitsDiff;

Tensor run(DeepseekV4CudaModel& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks) {
  return model::run_sequence(m, m.cache_geometry(), ids, chunks);
}

std::unique_ptr<DeepseekV4CudaModel> load(const std::string& dir, gpu::DensePath path, DecodePath decode,
                                          int64_t* fp8_linears) {
  CudaModelOptions o;
  o.dense = path;
  o.numerics = gpu::Numerics::kBf16;
  o.progress = false;
  o.max_batch_tokens = 1024;
  o.max_seqs = 2;
  o.max_context = 2048;
  o.decode = decode;
  auto m = DeepseekV4CudaModel::load(dir, o);
  const auto counts = m->dense_fp8_counts();
  *fp8_linears = counts.first;
  EXPECT_EQ(counts.second, 0) << "dense FP8 linears dequantised against the mode";
  m->allocate_cache_for(1, 1024);
  return m;
}

TEST(DenseFp8Model, TinyOfficialBf16NativeVsDequantised) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = deepinfer::testing::golden_dir("tiny_official");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  const auto inputs = deepinfer::testing::read_inputs(dir);
  ASSERT_TRUE(inputs.count("long"));
  const std::vector<int32_t>& ids = inputs.at("long");
  const int64_t T = int64_t(ids.size());
  const auto ref = deepinfer::testing::read_npy(dir + "/logits_long.npy");
  const auto full = deepinfer::testing::fixed_chunks(T, 0), one = deepinfer::testing::fixed_chunks(T, 1);
  const auto rnd = deepinfer::testing::random_chunks(T, 7);
  std::vector<int32_t> ids2 = ids;
  ids2.insert(ids2.end(), ids.begin(), ids.end());
  const int64_t T2 = int64_t(ids2.size());
  ASSERT_GT(T2, gpu::kDenseFp8PrefillM);
  int64_t n_native = 0, n_deq = 0;
  auto native = load(dir, gpu::DensePath::kNative, DecodePath::kGeneral, &n_native);
  const int64_t V = native->vocab_size();
  const auto nf = run(*native, ids, full), nd = run(*native, ids, one), nr = run(*native, ids, rnd);
  const auto n2 = run(*native, ids2, {T2});
  native.reset();
  auto deq = load(dir, gpu::DensePath::kDequantised, DecodePath::kGeneral, &n_deq);
  const auto df = run(*deq, ids, full), dd = run(*deq, ids, one), dr = run(*deq, ids, rnd);
  const auto d2 = run(*deq, ids2, {T2});
  deq.reset();
  std::printf("[gpu-fp8] tiny_official: %lld dense linears FP8 on the device (dequantised path: %lld)\n",
              (long long)n_native, (long long)n_deq);
  EXPECT_GT(n_native, 0);
  EXPECT_EQ(n_deq, 0);
  auto report = [&](const char* what, const Tensor& a, const float* b) {
    const Diff d = deepinfer::testing::compare_logits(a.data<float>(), b, T, V);
    std::printf("[gpu-fp8] tiny_official bf16 long (T=%lld) %s: max|d| %.3g rel %.3g, top-1 agreement %.4f%s\n",
                (long long)T, what, d.max_abs, d.rel(), 1.0 - double(d.argmax_mismatch) / double(T),
                d.max_abs == 0 ? " (bit identical)" : "");
    return d;
  };
  // Summation order only (gemm_fp8w / dequantise + cuBLASLt vs cuBLASLt over upload-dequantised
  // weights); bounds as moe_native_test's for the same kind of difference.
  for (auto [what, a, b] : {std::tuple{"FP8 native vs dequantised, full (gemm_fp8w)", &nf, &df},
                            std::tuple{"FP8 native vs dequantised, token by token (gemm_fp8w)", &nd, &dd},
                            std::tuple{"FP8 native vs dequantised, random chunks 1..40", &nr, &dr}}) {
    const Diff d = report(what, *a, b->data<float>());
    EXPECT_LE(d.rel(), 0.5) << what;
    EXPECT_GE(1.0 - double(d.argmax_mismatch) / double(T), 0.95) << what;
  }
  EXPECT_EQ(report("FP8 native: token by token vs full", nd, nf.data<float>()).max_abs, 0.0);
  EXPECT_EQ(report("FP8 native: random chunks vs full", nr, nf.data<float>()).max_abs, 0.0);
  report("dequantised: token by token vs full (for scale)", dd, df.data<float>());
  {
    const Diff d = deepinfer::testing::compare_logits(n2.data<float>(), d2.data<float>(), T2, V);
    std::printf("[gpu-fp8] tiny_official bf16 long x2 (T=%lld, one chunk: dequantise to scratch + cuBLASLt) FP8 "
                "native vs dequantised: max|d| %.3g, top-1 agreement %.4f\n",
                (long long)T2, d.max_abs, 1.0 - double(d.argmax_mismatch) / double(T2));
    EXPECT_EQ(d.max_abs, 0.0);
  }
  const Diff dref = report("FP8 native vs transformers fp32, full", nf, ref.data.data());
  EXPECT_LE(dref.rel(), 0.6);  // golden_test's bf16 bound
  EXPECT_GE(1.0 - double(dref.argmax_mismatch) / double(T), 0.9);
  const Diff dref1 = report("FP8 native vs transformers fp32, token by token", nd, ref.data.data());
  EXPECT_LE(dref1.rel(), 0.6);
  EXPECT_GE(1.0 - double(dref1.argmax_mismatch) / double(T), 0.9);
  // Fixed-shape decode (graph-ready buffers): FP8 native vs dequantised.
  auto nfix = load(dir, gpu::DensePath::kNative, DecodePath::kFixed, &n_native);
  const auto nx = run(*nfix, ids, one);
  nfix.reset();
  auto dfix = load(dir, gpu::DensePath::kDequantised, DecodePath::kFixed, &n_deq);
  const auto dx = run(*dfix, ids, one);
  const Diff fx = report("fixed decode path FP8 native vs dequantised", nx, dx.data<float>());
  EXPECT_LE(fx.rel(), 0.5);
  EXPECT_GE(1.0 - double(fx.argmax_mismatch) / double(T), 0.95);
}

// linear_many (wq_a + wkv in one gemm_fp8w_multi launch) vs one launch each: the same logits bit
// for bit on the general path (one chunk, token by token, random chunks; the 600-token chunk takes
// the prefill path, not grouped), on replayed decode graphs, and in batch-invariant mode, whose
// 600-token chunk runs gemm_fp8w_multi in 64-row chunks.
TEST(DenseFp8Model, TinyOfficialMultiLinearBitIdentical) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = deepinfer::testing::golden_dir("tiny_official");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  const auto inputs = deepinfer::testing::read_inputs(dir);
  const std::vector<int32_t>& ids = inputs.at("long");
  const int64_t T = int64_t(ids.size());
  std::vector<int32_t> ids2 = ids;
  ids2.insert(ids2.end(), ids.begin(), ids.end());
  const int64_t T2 = int64_t(ids2.size());
  const auto one = deepinfer::testing::fixed_chunks(T, 1), rnd = deepinfer::testing::random_chunks(T, 7);
  struct Run {
    const char* what;
    DecodePath decode;
    bool invariant;
    const std::vector<int32_t>* ids;
    std::vector<int64_t> chunks;
  };
  const std::vector<Run> runs = {{"general, one chunk", DecodePath::kGeneral, false, &ids, {T}},
                                 {"general, token by token", DecodePath::kGeneral, false, &ids, one},
                                 {"general, random chunks 1..40", DecodePath::kGeneral, false, &ids, rnd},
                                 {"general, 600 tokens (prefill path)", DecodePath::kGeneral, false, &ids2, {T2}},
                                 {"graph decode, token by token", DecodePath::kGraph, false, &ids, one},
                                 {"batch-invariant, 600 tokens", DecodePath::kGeneral, true, &ids2, {T2}},
                                 {"batch-invariant, token by token", DecodePath::kGeneral, true, &ids, one}};
  for (const Run& r : runs) {
    Tensor logits[2];
    int64_t fused[2] = {0, 0}, graphs = 0;
    for (int multi = 0; multi < 2; ++multi) {
      CudaModelOptions o;
      o.numerics = gpu::Numerics::kBf16;
      o.progress = false;
      o.max_batch_tokens = 1024;
      o.max_seqs = 2;
      o.max_context = 2048;
      o.decode = r.decode;
      o.batch_invariant = r.invariant;
      o.multi_linear = multi == 1;
      auto m = DeepseekV4CudaModel::load(dir, o);
      m->allocate_cache_for(1, 1024);
      logits[multi] = run(*m, *r.ids, r.chunks);
      fused[multi] = m->cuda().multi_linear_launches();
      if (multi) graphs = m->graphs_captured();
    }
    const int64_t n = int64_t(r.ids->size());
    const bool same = logits[0].nbytes() == logits[1].nbytes() &&
                      std::memcmp(logits[0].raw_data(), logits[1].raw_data(), logits[0].nbytes()) == 0;
    std::printf("[gpu-fp8] tiny_official multi-linear %s (T=%lld): %lld fused launches enqueued, %lld graphs; "
                "vs one launch each %s\n",
                r.what, (long long)n, (long long)fused[1], (long long)graphs, same ? "bit identical" : "DIFFER");
    EXPECT_TRUE(same) << r.what;
    EXPECT_EQ(fused[0], 0) << r.what;
    if (r.decode == DecodePath::kGraph) {
      EXPECT_GT(graphs, 0) << r.what;
    }
    // Every layer of every step fuses wq_a + wkv (K = 128: one split each) unless the step takes
    // the prefill path (> kDenseFp8PrefillM tokens outside batch-invariant mode). A graph replays
    // without enqueueing, so there only the captures count.
    if (n > gpu::kDenseFp8PrefillM && !r.invariant) {
      EXPECT_EQ(fused[1], 0) << r.what;
    } else {
      EXPECT_GT(fused[1], 0) << r.what;
    }
  }
}

}  // namespace
}  // namespace deepinfer::model::v4
