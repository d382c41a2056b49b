// DeepseekV4Weights::load on generated checkpoints in both layouts, dequantisation, and one test
// per kind of bad checkpoint (missing tensor, wrong shape, wrong dtype, missing scale).
#include <cmath>
#include <functional>

#include "core/numeric.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "model/deepseek_v4/weights.h"
#include "test_util.h"

using namespace deepinfer;
using namespace deepinfer::model::v4;
using namespace di_test;

namespace {
// Default-model geometry with a small vocab so tests stay fast.
DeepseekV4Config test_config(CheckpointLayout layout) {
  DeepseekV4Config c = default_model_config(layout);
  c.vocab_size = 512;
  return c;
}

fs::path make(const std::string& name, CheckpointLayout layout, int shards = 1, DType dt = DType::kF32) {
  fs::path d = fresh_dir(name);
  write_random_checkpoint(d.string(), test_config(layout), {.seed = 7, .layout = layout, .dtype = dt, .num_shards = shards});
  return d;
}

DeepseekV4Weights load(const fs::path& d) {
  return DeepseekV4Weights::load(d.string(), DeepseekV4Config::from_file(d.string()), {.progress = false});
}

// Rewrites model.safetensors of `d` through `edit(name, tensor, writer)`, which adds what it wants.
void rewrite(const fs::path& d, const std::function<void(const std::string&, const Tensor&, io::SafetensorsWriter&)>& edit) {
  io::SafetensorsWriter w;
  {
    auto f = io::SafetensorsFile::open((d / "model.safetensors").string());
    for (const auto& ti : f->tensors()) edit(ti.name, f->tensor(ti), w);
  }
  w.write((d / "model.safetensors").string());
}

// Largest |a-b| - bound(b, i) over all elements (<= 0 means within the bound everywhere).
float worst(const Tensor& a, const Tensor& b, const std::function<float(float, int64_t)>& bound) {
  EXPECT_EQ(a.shape(), b.shape());
  const float *pa = a.data<float>(), *pb = b.data<float>();
  float w = -1e30f;
  for (int64_t i = 0; i < a.numel(); ++i) w = std::max(w, std::fabs(pa[i] - pb[i]) - bound(pb[i], i));
  return w;
}
}  // namespace

TEST(Weights, TransformersLayoutStructureAndExpertViews) {
  fs::path d = make("hf", CheckpointLayout::kTransformers);
  DeepseekV4Config c = DeepseekV4Config::from_file(d.string());
  DeepseekV4Weights w = load(d);
  EXPECT_EQ(w.layout, CheckpointLayout::kTransformers);
  EXPECT_TRUE(w.ignored_tensors.empty());
  ASSERT_EQ(w.layers.size(), 6u);
  EXPECT_TRUE(w.mtp.empty());
  EXPECT_FALSE(w.layers[0].attn.compressor.has_value());
  EXPECT_TRUE(w.layers[2].attn.indexer.has_value());
  EXPECT_EQ(w.layers[2].attn.compressor->wkv.weight.shape(), (Shape{128, 128}));  // CSA: 2*head_dim
  EXPECT_EQ(w.layers[3].attn.compressor->ape.shape(), (Shape{16, 64}));          // HCA ratio 16
  EXPECT_FALSE(w.layers[3].attn.indexer.has_value());
  EXPECT_EQ(w.layers[2].attn.indexer->compressor.norm.shape(), (Shape{32}));
  EXPECT_TRUE(w.layers[0].ffn.tid2eid.defined());
  EXPECT_FALSE(w.layers[0].ffn.bias.defined());
  EXPECT_TRUE(w.layers[4].ffn.bias.defined());
  // Expert views into the fused tensors: w1 = gate_up[e, :I], w3 = gate_up[e, I:], w2 = down[e].
  auto ck = io::Checkpoint::open(d.string());
  Tensor gu = ck.get("model.layers.4.mlp.experts.gate_up_proj").to_f32(), dn = ck.get("model.layers.4.mlp.experts.down_proj").to_f32();
  const int64_t I = c.moe_intermediate_size, D = c.hidden_size;
  const ExpertWeights& e5 = w.layers[4].ffn.experts[5];
  EXPECT_EQ(e5.w3.weight.shape(), (Shape{I, D}));
  EXPECT_TRUE(e5.w3.weight.is_contiguous());
  Tensor w1 = e5.w1.dequantize_f32(), w3 = e5.w3.dequantize_f32(), w2 = e5.w2.dequantize_f32();
  EXPECT_EQ(w1.data<float>()[7], gu.data<float>()[(5 * 2 * I) * D + 7]);
  EXPECT_EQ(w3.data<float>()[3 * D + 1], gu.data<float>()[(5 * 2 * I + I + 3) * D + 1]);
  EXPECT_EQ(w2.data<float>()[2 * I + 9], dn.data<float>()[(5 * D + 2) * I + 9]);
  // Parameter count = every float element (tid2eid excluded).
  ParamCounts p = w.param_counts(c);
  int64_t n = 0;
  for (const auto& name : ck.names())
    if (ck.info(name).dtype != DType::kI64) n += ck.get(name).numel();
  EXPECT_EQ(p.total, n);
  EXPECT_EQ(p.active, p.total - p.embed - p.routed + p.routed * 2 / 8);
}

TEST(Weights, OfficialLayoutDequantisesToTheTransformersWeights) {
  fs::path dh = make("pair_hf", CheckpointLayout::kTransformers), doff = make("pair_off", CheckpointLayout::kOfficial, 3);
  DeepseekV4Weights h = load(dh), o = load(doff);
  EXPECT_EQ(o.layout, CheckpointLayout::kOfficial);
  EXPECT_TRUE(o.ignored_tensors.empty());
  ASSERT_EQ(o.mtp.size(), 1u);
  EXPECT_EQ(o.mtp[0].e_proj.format, WeightFormat::kFP8Block);
  EXPECT_FALSE(o.mtp[0].block.attn.compressor.has_value());
  const auto& lo = o.layers[2];
  EXPECT_EQ(lo.attn.wq_b.format, WeightFormat::kFP8Block);
  EXPECT_EQ(lo.attn.wq_b.scale.dtype(), DType::kE8M0);
  EXPECT_EQ(lo.ffn.experts[0].w2.format, WeightFormat::kFP4);
  EXPECT_EQ(lo.ffn.experts[0].w2.weight.dtype(), DType::kFP4E2M1);
  EXPECT_EQ(lo.ffn.experts[0].w2.weight.shape(), (Shape{128, 64}));
  EXPECT_EQ(lo.attn.compressor->wkv.format, WeightFormat::kBF16);

  // FP8 e4m3 (3 mantissa bits): |err| <= 2^-4 |x|, or half a subnormal step 2^-10 * scale.
  auto fp8_ok = [](const Linear& q, const Linear& ref) {
    Tensor s = q.scale.to_f32();
    const int64_t in = ref.in_features(), sc = s.size(1);
    return worst(q.dequantize_f32(), ref.dequantize_f32(), [&](float x, int64_t i) {
      float scale = s.data<float>()[(i / in / 128) * sc + (i % in) / 128];
      return std::max(std::fabs(x) / 16.f, scale / 1024.f) * 1.0001f;
    });
  };
  // FP4 e2m1 ({0,.5,1,1.5,2,3,4,6}·scale): |err| <= max(0.25·scale, |x|/4).
  auto fp4_ok = [](const Linear& q, const Linear& ref) {
    Tensor s = q.scale.to_f32();
    const int64_t in = ref.in_features();
    return worst(q.dequantize_f32(), ref.dequantize_f32(), [&](float x, int64_t i) {
      float scale = s.data<float>()[(i / in) * (in / 32) + (i % in) / 32];
      return std::max(0.25f * scale, std::fabs(x) / 4.f) * 1.0001f;
    });
  };
  for (size_t l = 0; l < o.layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const auto &a = o.layers[l].attn, &b = h.layers[l].attn;
    for (auto [q, r] : {std::pair{&a.wq_a, &b.wq_a}, {&a.wq_b, &b.wq_b}, {&a.wkv, &b.wkv}, {&a.wo_a, &b.wo_a},
                        {&a.wo_b, &b.wo_b}, {&o.layers[l].ffn.shared.w2, &h.layers[l].ffn.shared.w2}})
      EXPECT_LE(fp8_ok(*q, *r), 0.f);
    for (size_t e = 0; e < o.layers[l].ffn.experts.size(); ++e) {
      EXPECT_LE(fp4_ok(o.layers[l].ffn.experts[e].w1, h.layers[l].ffn.experts[e].w1), 0.f);
      EXPECT_LE(fp4_ok(o.layers[l].ffn.experts[e].w2, h.layers[l].ffn.experts[e].w2), 0.f);
    }
    // bf16-stored tensors: relative 2^-8; f32-stored ones are identical.
    EXPECT_LE(worst(o.layers[l].attn_norm.to_f32(), h.layers[l].attn_norm.to_f32(),
                    [](float x, int64_t) { return std::fabs(x) / 256.f; }), 0.f);
    EXPECT_LE(worst(o.layers[l].hc_ffn.fn.to_f32(), h.layers[l].hc_ffn.fn.to_f32(), [](float, int64_t) { return 0.f; }), 0.f);
  }
}

TEST(Weights, DequantizeKnownFp4AndFp8Values) {
  // fp4: byte 0x2A -> element 0 = low nibble 0xA (-1.0), element 1 = high nibble 0x2 (+1.0).
  std::vector<uint8_t> packed(32, 0x2A);  // [1, 64] elements
  std::vector<uint8_t> s4 = {128, 126};   // 2^1 for elements 0..31, 2^-1 for 32..63
  Linear l4;
  l4.weight = Tensor::from_blob(packed.data(), {1, 64}, DType::kFP4E2M1, nullptr);
  l4.scale = Tensor::from_blob(s4.data(), {1, 2}, DType::kE8M0, nullptr);
  l4.format = WeightFormat::kFP4;
  Tensor f = l4.dequantize_f32();
  EXPECT_FLOAT_EQ(f.data<float>()[0], -2.f);
  EXPECT_FLOAT_EQ(f.data<float>()[1], 2.f);
  EXPECT_FLOAT_EQ(f.data<float>()[62], -0.5f);
  EXPECT_FLOAT_EQ(f.data<float>()[63], 0.5f);
  // fp8 with 2x2 blocks over [3, 3]: block (1,1) covers only element (2,2).
  std::vector<uint8_t> w8(9, f32_to_fp8e4m3(1.5f)), s8 = {127, 128, 129, 120};
  Linear l8;
  l8.weight = Tensor::from_blob(w8.data(), {3, 3}, DType::kF8E4M3, nullptr);
  l8.scale = Tensor::from_blob(s8.data(), {2, 2}, DType::kE8M0, nullptr);
  l8.format = WeightFormat::kFP8Block;
  Tensor g = l8.dequantize_f32(/*fp8_block=*/2);
  EXPECT_FLOAT_EQ(g.data<float>()[0], 1.5f);
  EXPECT_FLOAT_EQ(g.data<float>()[2], 3.f);
  EXPECT_FLOAT_EQ(g.data<float>()[6], 6.f);
  EXPECT_FLOAT_EQ(g.data<float>()[8], 1.5f / 128.f);
}

TEST(Weights, ExtraTensorIsAWarningNotAnError) {
  fs::path d = make("extra", CheckpointLayout::kTransformers);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    w.add(n, t);
    if (n == "lm_head.weight") w.add("model.rotary_emb.inv_freq", Tensor::zeros({8}, DType::kF32));
  });
  DeepseekV4Weights w = load(d);
  EXPECT_EQ(w.ignored_tensors, (std::vector<std::string>{"model.rotary_emb.inv_freq"}));
}

TEST(WeightsErrors, MissingTensor) {
  fs::path d = make("missing", CheckpointLayout::kTransformers);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    if (n != "model.layers.3.self_attn.kv_proj.weight") w.add(n, t);
  });
  std::string e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, ": missing tensor 'model.layers.3.self_attn.kv_proj.weight'");
  EXPECT_HAS(e, d.string());
}

TEST(WeightsErrors, WrongShape) {
  fs::path d = make("shape", CheckpointLayout::kTransformers);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    w.add(n, n == "model.layers.3.self_attn.kv_proj.weight" ? Tensor::zeros({64, 100}, DType::kF32) : t);
  });
  std::string e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "model.safetensors: tensor 'model.layers.3.self_attn.kv_proj.weight' has shape [64,100], expected [64,128]");
}

TEST(WeightsErrors, WrongDtype) {
  fs::path d = make("dtype", CheckpointLayout::kTransformers);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    w.add(n, n == "model.layers.1.mlp.gate.tid2eid" ? t.to_f32() : t);
  });
  std::string e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "model.safetensors: tensor 'model.layers.1.mlp.gate.tid2eid' has dtype F32, expected I64/I32");
  d = make("dtype2", CheckpointLayout::kTransformers);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    w.add(n, n == "model.norm.weight" ? t.to_f32().to(DType::kF8E4M3) : t);
  });
  e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "tensor 'model.norm.weight' has dtype F8_E4M3, expected BF16/F32");
}

TEST(WeightsErrors, HashTableNamesAMissingExpert) {
  fs::path d = make("tid2eid", CheckpointLayout::kTransformers);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    if (n != "model.layers.1.mlp.gate.tid2eid") return w.add(n, t);
    Tensor bad = t.contiguous().clone();
    bad.data<int64_t>()[5] = 1000;  // no expert has this id
    w.add(n, bad);
  });
  std::string e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "tensor 'model.layers.1.mlp.gate.tid2eid' entry [");
  EXPECT_HAS(e, "] is 1000, not an expert id in [0, ");
}

TEST(WeightsErrors, OfficialMissingScaleAndWrongScaleShape) {
  fs::path d = make("scale", CheckpointLayout::kOfficial);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    if (n != "layers.2.attn.wq_b.scale") w.add(n, t);
  });
  std::string e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "missing tensor 'layers.2.attn.wq_b.scale' (scale of quantised 'layers.2.attn.wq_b.weight')");
  d = make("scale2", CheckpointLayout::kOfficial);
  rewrite(d, [](const std::string& n, const Tensor& t, io::SafetensorsWriter& w) {
    if (n == "layers.1.ffn.experts.3.w2.scale") w.add(n, t.view({-1}));
    else w.add(n, t);
  });
  e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "tensor 'layers.1.ffn.experts.3.w2.scale' has shape [256], expected [128,2]");
}

TEST(WeightsErrors, ConfigDisagreesWithCheckpoint) {
  fs::path d = make("cfgdiff", CheckpointLayout::kTransformers);
  DeepseekV4Config c = DeepseekV4Config::from_file(d.string());
  c.n_routed_experts = 16;
  std::string e = error_of<CheckpointError>([&] { DeepseekV4Weights::load(d.string(), c, {.progress = false}); });
  EXPECT_HAS(e, "tensor 'model.layers.0.mlp.gate.weight' has shape [8,128], expected [16,128]");
}
