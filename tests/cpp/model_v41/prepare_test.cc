// v41_prepare_cpu on the goldens: every layer's refs are filled as its plan says (compressor with
// and without a gate, keys from the latent, index queries, Engram, experts), values equal the exact
// dequantisation, both layouts prepare to the same values, rope tables follow the layer's rope.
#include "model/deepseek_v41/prepare.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "model/deepseek_v41/plan.h"
#include "model/plan/cache_specs.h"
#include "ops/cpu/hc.h"
#include "ops/cpu/qat.h"
#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using v41_test::golden;

struct Prepared {
  DeepseekV41Config cfg;
  ModelPlan plan;
  V41Weights w;
  std::unique_ptr<ds::CpuWeightStore> store;
};

Prepared prepare(const std::string& dir) {
  Prepared p;
  p.cfg = DeepseekV41Config::from_file((golden(dir) / "config.json").string());
  p.plan = v41_plan(p.cfg, {});
  p.w = V41Weights::load(golden(dir).string(), p.cfg);
  p.store = v41_prepare_cpu(p.cfg, p.plan, p.w);
  return p;
}

bool same(const void* a, const Tensor& b) { return std::memcmp(a, b.raw_data(), b.nbytes()) == 0; }

TEST(V41PrepareCpu, RefsFollowThePlan) {
  const Prepared p = prepare("v41_a_release");
  const ds::ModelRef& m = p.store->refs;
  const DeepseekV41Config& c = p.cfg;
  const int64_t D = c.hidden_size, d = c.head_dim;
  EXPECT_TRUE(m.embed.defined() && m.head.panels && m.norm.defined());
  EXPECT_FALSE(m.hc_head.fn.defined());  // single-pass mHC: no hc_head
  ASSERT_EQ(int64_t(m.layers.size()), c.num_layers);
  for (const LayerPlan& lp : p.plan.layers) {
    SCOPED_TRACE(lp.index);
    const ds::LayerRef& L = m.layers[size_t(lp.index)];
    EXPECT_EQ(L.attn_norm.n, D);
    EXPECT_EQ(L.hc_attn.fn.n, c.hc_mix_dim() * c.hc_dim());
    EXPECT_EQ(L.hc_ffn.scale.n, 3);
    EXPECT_EQ(L.attn.sink.n, c.num_heads);
    EXPECT_EQ(L.attn.wq_b.out, c.num_heads * d);
    EXPECT_EQ(L.attn.comp.has_value(), lp.owns_entries());
    if (lp.owns_entries()) {
      EXPECT_EQ(L.attn.comp->ratio, lp.ratio);
      EXPECT_EQ(L.attn.comp->width, d);
      EXPECT_EQ(L.attn.comp->wkv_gate.out, lp.compressor == CompressorKind::kPool ? 2 * d : d);  // no gate at ratio 1
      EXPECT_FALSE(L.attn.comp->ape.defined());
      EXPECT_EQ(L.attn.comp->norm.n, d);
    }
    EXPECT_EQ(L.attn.index_wk.defined(), lp.owns_keys());
    EXPECT_EQ(L.attn.index_k_norm.defined(), lp.owns_keys());
    EXPECT_EQ(L.attn.index_wq_b.defined(), lp.select == SelectKind::kScore);
    EXPECT_EQ(L.attn.index_weights.defined(), lp.select == SelectKind::kScore);
    EXPECT_EQ(L.attn.inv_freq, lp.ratio > 0 ? m.inv_freq_compress.p : m.inv_freq_main.p);
    EXPECT_EQ(int64_t(L.ffn.experts.size()), c.n_routed_experts);
    for (const ds::ExpertRef& x : L.ffn.experts) EXPECT_TRUE(x.w13.out == 2 * c.moe_intermediate_size && x.w2.in == c.moe_intermediate_size);
    EXPECT_TRUE(L.ffn.shared.w13.defined() && L.ffn.bias.defined() && L.ffn.gate.defined());
    EXPECT_EQ(L.engram.defined(), lp.engram);
    if (lp.engram) {
      EXPECT_EQ(L.engram.table_dtype, DType::kF8E4M3);
      EXPECT_NE(L.engram.table_scale, nullptr);
      EXPECT_EQ(L.engram.dim, c.engram.head_dim);
      EXPECT_EQ(L.engram.wkv.out, (c.hc_mult + 1) * D);
      EXPECT_EQ(L.engram.w.n, c.hc_mult * D);
    }
  }
  const std::vector<float> main = v41_inv_freq(c.rope, c.rope_head_dim), comp = v41_inv_freq(c.compress_rope, c.rope_head_dim);
  EXPECT_EQ(std::vector<float>(m.inv_freq_main.p, m.inv_freq_main.p + m.inv_freq_main.n), main);
  EXPECT_EQ(std::vector<float>(m.inv_freq_compress.p, m.inv_freq_compress.p + m.inv_freq_compress.n), comp);
  EXPECT_NE(main, comp);
}

TEST(V41PrepareCpu, ValuesAreTheExactDequantisation) {
  const Prepared r = prepare("v41_a_release"), h = prepare("v41_a");
  const DeepseekV41Config& c = r.cfg;
  auto entry = [&](const Prepared& p, const std::string& n) { return p.w.entry_f32(size_t(p.w.find(n)), c); };
  const ds::LayerRef& L2 = r.store->refs.layers[2];
  EXPECT_TRUE(same(L2.attn.comp->wkv_gate.w, entry(r, "layers.2.attn.compressor.wkv.weight")));  // Wkv|Wgate
  EXPECT_TRUE(same(r.store->refs.layers[3].attn.wq_b.w, entry(r, "layers.3.attn.wq_b.weight")));  // FP8 32x32
  EXPECT_TRUE(same(r.store->refs.layers[7].ffn.experts[5].w13.w, entry(r, "layers.7.ffn.experts.5.w1.weight")));
  EXPECT_TRUE(same(r.store->refs.layers[6].attn.index_wk.w, entry(r, "layers.6.attn.indexer.wk.weight")));
  // Both layouts prepare to the same dense values (FP8 decode == the HF floats).
  const ds::LinearRef& a = r.store->refs.layers[4].attn.wo_b;
  const ds::LinearRef& b = h.store->refs.layers[4].attn.wo_b;
  ASSERT_EQ(a.out * a.in, b.out * b.in);
  EXPECT_EQ(std::memcmp(a.w, b.w, size_t(a.out * a.in) * sizeof(float)), 0);
  // Engram: w = q ⊙ k; the table row read through the ref's view equals engram_rows_f32.
  for (int64_t l : c.engram.layer_ids) {
    const ds::EngramRef& g = r.store->refs.layers[size_t(l)].engram;
    const std::string o = "layers." + std::to_string(l) + ".engram.";
    const Tensor q = entry(r, o + "q_weight"), k = entry(r, o + "k_weight");
    for (int64_t j = 0; j < q.numel(); ++j) ASSERT_EQ(g.w.p[j], q.data<float>()[j] * k.data<float>()[j]);
    const int64_t id = g.rows - 2;
    std::vector<float> row(size_t(g.dim)), via_weights(size_t(g.dim));
    engram_rows_f32(r.w.parts[size_t(r.w.find(o + "embed.weight"))][0], &id, 1, via_weights.data());
    const auto* codes = static_cast<const uint8_t*>(g.table) + id * g.dim;
    const auto* sc = static_cast<const uint8_t*>(g.table_scale) + id * (g.dim / 32);
    for (int64_t j = 0; j < g.dim; ++j) row[size_t(j)] = fp8e4m3_to_f32(codes[j]) * e8m0_to_f32(sc[j / 32]);
    EXPECT_EQ(row, via_weights);
  }
}


// The CPU backend over a V4.1 model applies the QAT formats of its plans (window FP8/32, entries
// FP4/16 e4m3, keys and queries FP4/32) exactly as the ops do, at row strides; V4's GPU-only
// production formats and non-f32 rows are refused.
TEST(V41CpuBackend, RoundTripsTheQatFormats) {
  Prepared p = prepare("v41_a");
  const ds::Arch arch = v41_arch(p.cfg, {});
  ds::CpuBackend be(arch, cache_specs(arch.plan, {.head_dim = p.cfg.head_dim, .index_head_dim = p.cfg.index_head_dim}),
                    std::move(p.store));
  const int64_t rows = 7, dim = 64, ld = 70;
  std::vector<float> x(size_t(rows * ld));
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (float& v : x) v = nd(g);
  for (auto [rf, qf] : {std::pair{RowFormat::kFp8Block32, ops::cpu::QatFormat::kFp8Ue8m0Block32},
                        std::pair{RowFormat::kFp4E4m3Block16, ops::cpu::QatFormat::kFp4E4m3Block16},
                        std::pair{RowFormat::kFp4Ue8m0Block32, ops::cpu::QatFormat::kFp4Ue8m0Block32}}) {
    std::vector<float> a = x, b = x;
    be.round_trip(a.data(), DType::kF32, ld, rows, dim, rf);
    ops::cpu::qat_round_trip(qf, b.data(), rows, dim, ld);
    EXPECT_EQ(a, b) << row_format_name(rf);
    EXPECT_NE(a, x) << row_format_name(rf);  // it did round
    EXPECT_EQ(std::vector<float>(a.begin() + dim, a.begin() + ld), std::vector<float>(x.begin() + dim, x.begin() + ld));
  }
  std::vector<float> a = x;
  be.round_trip(a.data(), DType::kF32, ld, rows, dim, RowFormat::kPlain);
  EXPECT_EQ(a, x);
  EXPECT_THROW(be.round_trip(a.data(), DType::kF32, ld, rows, dim, RowFormat::kFp8Nope64), InternalError);
  EXPECT_THROW(be.round_trip(a.data(), DType::kBF16, ld, rows, dim, RowFormat::kFp8Block32), InternalError);
}


// Single-pass mHC through the CPU backend: a mixes-only site (u null) keeps exactly hc_mix's
// post/comb/pre, and hc_collapse with it (or with no previous site: stream 0) equals the ops.
TEST(V41CpuBackend, SinglePassHcMatchesTheOps) {
  Prepared p = prepare("v41_a");
  const ds::Arch arch = v41_arch(p.cfg, {});
  const ds::HcRef hc = p.store->refs.layers[3].hc_ffn;
  ds::CpuBackend be(arch, cache_specs(arch.plan, {.head_dim = p.cfg.head_dim, .index_head_dim = p.cfg.index_head_dim}),
                    std::move(p.store));
  const int64_t T = 5, n = arch.dims.streams, D = arch.dims.hidden;
  std::vector<float> x(size_t(T * n * D)), x2(x.size()), mix(size_t(T * arch.dims.mix_dim())), u(size_t(T * D)),
      u0(u.size());
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : x) v = nd(g);
  for (float& v : x2) v = nd(g);
  be.hc_site({.x = x.data(), .w = &hc, .u = nullptr, .mix = mix.data(), .tokens = T});
  be.hc_collapse(x2.data(), mix.data(), u.data(), T);
  be.hc_collapse(x2.data(), nullptr, u0.data(), T);
  // The backend runs the mix logits on the packed kernel (its fn repacked): the ops with that kernel.
  const ops::cpu::PackedWeight fn_packed = ops::cpu::pack_weight(hc.fn.p, arch.dims.mix_dim(), n * D, n * D);
  const ops::cpu::HcSpec spec{.n = n, .dim = D, .sinkhorn_iters = arch.dims.sinkhorn_iters, .rms_eps = arch.dims.eps,
                              .hc_eps = arch.dims.hc_eps, .fn_packed = &fn_packed};
  std::vector<float> pre(size_t(T * n)), post(size_t(T * n)), comb(size_t(T * n * n)), ru(u.size()), ru0(u.size());
  ops::cpu::hc_mix(x.data(), T, spec, hc.fn.p, hc.base.p, hc.scale.p, pre.data(), post.data(), comb.data());
  ops::cpu::hc_collapse(x2.data(), T, spec, pre.data(), ru.data());
  ops::cpu::hc_collapse(x2.data(), T, spec, nullptr, ru0.data());
  EXPECT_EQ(std::vector<float>(mix.begin(), mix.begin() + T * n), post);
  EXPECT_EQ(std::vector<float>(mix.begin() + T * n, mix.begin() + T * n * (n + 1)), comb);
  EXPECT_EQ(u, ru);
  EXPECT_EQ(u0, ru0);
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(u0[size_t(t * D)], x2[size_t(t * n * D)]);
}

}  // namespace
}  // namespace deepinfer::model::v41
