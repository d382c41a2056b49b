// Linear::dequantize_f32 and parameter counting (host reference paths, not hot).
#include <cstring>

#include "core/numeric.h"
#include "core/parallel.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer::model::v4 {

Tensor Linear::dequantize_f32(int64_t fp8_block, int64_t fp4_block) const {
  DI_CHECK(weight.defined() && weight.dim() == 2, "dequantize_f32 on ", weight.defined() ? weight.str() : "undefined");
  if (format == WeightFormat::kBF16 || format == WeightFormat::kF32) return weight.to_f32();
  Tensor w = Tensor::empty({weight.size(0), weight.size(1)}, DType::kF32);
  dequantize_f32_into(w.data<float>(), fp8_block, fp4_block);
  return w;
}

void Linear::dequantize_f32_into(float* pw, int64_t fp8_block, int64_t fp4_block) const {
  DI_CHECK(weight.defined() && weight.dim() == 2, "dequantize_f32 on ", weight.defined() ? weight.str() : "undefined");
  if (format == WeightFormat::kBF16 || format == WeightFormat::kF32) {
    const Tensor f = weight.to_f32().contiguous();
    std::memcpy(pw, f.raw_data(), f.nbytes());
    return;
  }
  DI_CHECK(scale.defined() && scale.dim() == 2, "quantised linear without a 2-d scale");
  const Tensor s = scale.to_f32();  // e8m0 -> 2^(e-127), or f32 scales as stored
  const int64_t out = weight.size(0), in = weight.size(1);
  // Block geometry: fp8 has square blocks over (out, in); fp4 one scale per `fp4_block` inputs of a row.
  const int64_t bo = format == WeightFormat::kFP8Block ? fp8_block : 1;
  const int64_t bi = format == WeightFormat::kFP8Block ? fp8_block : fp4_block;
  DI_CHECK(s.size(0) == (out + bo - 1) / bo && s.size(1) == (in + bi - 1) / bi, "scale ", s.str(), " does not tile ",
           weight.str(), " with blocks ", bo, "x", bi);
  const float* ps = s.data<float>();
  const DType dt = weight.dtype();
  if (weight.is_contiguous() && (dt == DType::kFP4E2M1 || dt == DType::kF8E4M3) && in % 2 == 0) {
    // Fast path (weight upload of full-size checkpoints): table decode and scale in one pass,
    // rows in parallel. Same f32 products as the generic path below, so the same bits.
    float lut[256];
    for (int c = 0; c < 256; ++c) lut[c] = dt == DType::kFP4E2M1 ? fp4e2m1_to_f32(uint8_t(c & 15)) : fp8e4m3_to_f32(uint8_t(c));
    const uint8_t* src = static_cast<const uint8_t*>(weight.raw_data());
    const int64_t ns = s.size(1);
    parallel_for(0, out, [&](int64_t i) {
      const float* srow = ps + (i / bo) * ns;
      float* wrow = pw + i * in;
      if (dt == DType::kFP4E2M1) {
        const uint8_t* b = src + i * in / 2;  // element 2k in the low nibble
        for (int64_t j = 0; j < in; j += 2) {
          wrow[j] = lut[b[j / 2] & 15] * srow[j / bi];
          wrow[j + 1] = lut[b[j / 2] >> 4] * srow[(j + 1) / bi];
        }
      } else {
        const uint8_t* b = src + i * in;
        for (int64_t j = 0; j < in; ++j) wrow[j] = lut[b[j]] * srow[j / bi];
      }
    }, 8);
    return;
  }
  const Tensor w = weight.to_f32().contiguous();  // decodes bf16 / fp8 e4m3 / packed fp4 (low nibble first)
  std::memcpy(pw, w.raw_data(), w.nbytes());
  for (int64_t i = 0; i < out; ++i) {
    const float* srow = ps + (i / bo) * s.size(1);
    float* wrow = pw + i * in;
    for (int64_t j = 0; j < in; ++j) wrow[j] *= srow[j / bi];
  }
}

namespace {
int64_t lin_params(const Linear& l) { return l.weight.defined() ? l.weight.numel() : 0; }
int64_t t_params(const Tensor& t) { return t.defined() ? t.numel() : 0; }
int64_t compressor_params(const CompressorWeights& c) {
  return lin_params(c.wkv) + lin_params(c.wgate) + t_params(c.ape) + t_params(c.norm);
}
int64_t expert_params(const ExpertWeights& e) { return lin_params(e.w1) + lin_params(e.w2) + lin_params(e.w3); }

// Everything in a block except routed experts (tid2eid is an index table, not a parameter).
int64_t dense_params(const LayerWeights& l) {
  int64_t n = t_params(l.attn_norm) + t_params(l.ffn_norm);
  for (const HcParams* h : {&l.hc_attn, &l.hc_ffn}) n += t_params(h->fn) + t_params(h->base) + t_params(h->scale);
  const AttentionWeights& a = l.attn;
  n += lin_params(a.wq_a) + t_params(a.q_norm) + lin_params(a.wq_b) + lin_params(a.wkv) + t_params(a.kv_norm) +
       lin_params(a.wo_a) + lin_params(a.wo_b) + t_params(a.sink);
  if (a.compressor) n += compressor_params(*a.compressor);
  if (a.indexer) n += lin_params(a.indexer->wq_b) + lin_params(a.indexer->weights_proj) + compressor_params(a.indexer->compressor);
  n += t_params(l.ffn.gate) + t_params(l.ffn.bias) + expert_params(l.ffn.shared);
  return n;
}
int64_t routed_params(const LayerWeights& l) {
  int64_t n = 0;
  for (const auto& e : l.ffn.experts) n += expert_params(e);
  return n;
}
}  // namespace

ParamCounts DeepseekV4Weights::param_counts(const DeepseekV4Config& cfg) const {
  ParamCounts p;
  p.embed = t_params(embed);
  int64_t dense = t_params(norm) + t_params(hc_head.fn) + t_params(hc_head.base) + t_params(hc_head.scale);
  if (!head.defined() || head.storage() != embed.storage() || head.byte_offset() != embed.byte_offset())
    dense += t_params(head);
  for (const auto& l : layers) {
    dense += dense_params(l);
    p.routed += routed_params(l);
  }
  for (const auto& m : mtp) {
    p.mtp += lin_params(m.e_proj) + lin_params(m.h_proj) + t_params(m.enorm) + t_params(m.hnorm) + t_params(m.norm) +
             t_params(m.hc_head.fn) + t_params(m.hc_head.base) + t_params(m.hc_head.scale) + dense_params(m.block) +
             routed_params(m.block);
  }
  p.total = p.embed + dense + p.routed + p.mtp;
  const double frac = cfg.n_routed_experts ? double(cfg.num_experts_per_tok) / double(cfg.n_routed_experts) : 0.0;
  p.active = dense + int64_t(double(p.routed) * frac + 0.5);
  return p;
}

}  // namespace deepinfer::model::v4
