#include "model/deepseek_v4/cpu_weights.h"

#include <cstring>

#include "core/check.h"

namespace deepinfer::model::v4 {

Tensor to_f32_contig(const Tensor& t) {
  if (!t.defined()) return t;
  return t.to_f32().contiguous();
}

CpuLinear to_cpu_linear(const Linear& l, const DeepseekV4Config& cfg) {
  CpuLinear c;
  if (!l.weight.defined()) return c;
  c.w = l.dequantize_f32(cfg.fp8_block, cfg.fp4_block).contiguous();
  c.out = c.w.size(0);
  c.in = c.w.size(1);
  return c;
}

namespace {
CpuHc to_cpu_hc(const Tensor& fn, const Tensor& base, const Tensor& scale) {
  return {to_f32_contig(fn), to_f32_contig(base), to_f32_contig(scale)};
}

CpuCompressor to_cpu_compressor(const CompressorWeights& cw, const DeepseekV4Config& cfg) {
  CpuCompressor c;
  c.ratio = cw.ratio;
  CpuLinear kv = to_cpu_linear(cw.wkv, cfg), gate = to_cpu_linear(cw.wgate, cfg);
  DI_CHECK(kv.out == gate.out && kv.in == gate.in, "compressor wkv/wgate shapes differ");
  c.width = kv.out;
  c.wkv_gate.w = Tensor::empty({2 * kv.out, kv.in}, DType::kF32);
  c.wkv_gate.out = 2 * kv.out;
  c.wkv_gate.in = kv.in;
  std::memcpy(c.wkv_gate.w.data<float>(), kv.data(), kv.w.nbytes());
  std::memcpy(c.wkv_gate.w.data<float>() + kv.w.numel(), gate.data(), gate.w.nbytes());
  c.ape = to_f32_contig(cw.ape);
  c.norm = to_f32_contig(cw.norm);
  return c;
}

CpuExpert to_cpu_expert(const ExpertWeights& e, const DeepseekV4Config& cfg) {
  return {to_cpu_linear(e.w1, cfg), to_cpu_linear(e.w3, cfg), to_cpu_linear(e.w2, cfg)};
}
}  // namespace

CpuLayer to_cpu_layer(const LayerWeights& lw, AttnKind kind, int64_t ratio, const DeepseekV4Config& cfg,
                      const CpuModelWeights& model) {
  CpuLayer L;
  L.attn_norm = to_f32_contig(lw.attn_norm);
  L.ffn_norm = to_f32_contig(lw.ffn_norm);
  L.hc_attn = to_cpu_hc(lw.hc_attn.fn, lw.hc_attn.base, lw.hc_attn.scale);
  L.hc_ffn = to_cpu_hc(lw.hc_ffn.fn, lw.hc_ffn.base, lw.hc_ffn.scale);

  const AttentionWeights& a = lw.attn;
  CpuAttention& A = L.attn;
  A.kind = kind;
  A.ratio = ratio;
  A.wq_a = to_cpu_linear(a.wq_a, cfg);
  A.wq_b = to_cpu_linear(a.wq_b, cfg);
  A.wkv = to_cpu_linear(a.wkv, cfg);
  A.wo_a = to_cpu_linear(a.wo_a, cfg);
  A.wo_b = to_cpu_linear(a.wo_b, cfg);
  A.q_norm = to_f32_contig(a.q_norm);
  A.kv_norm = to_f32_contig(a.kv_norm);
  A.sink = to_f32_contig(a.sink);
  A.inv_freq = kind == AttnKind::kSliding ? &model.inv_freq_main : &model.inv_freq_compress;
  if (kind != AttnKind::kSliding) {
    DI_CHECK(a.compressor.has_value(), "compressed layer without compressor weights");
    A.compressor = to_cpu_compressor(*a.compressor, cfg);
    A.compressor->ratio = ratio;
  }
  if (kind == AttnKind::kCSA) {
    DI_CHECK(a.indexer.has_value(), "CSA layer without indexer weights");
    A.index_compressor = to_cpu_compressor(a.indexer->compressor, cfg);
    A.index_compressor->ratio = ratio;
    A.index_wq_b = to_cpu_linear(a.indexer->wq_b, cfg);
    A.index_weights = to_cpu_linear(a.indexer->weights_proj, cfg);
  }

  const MoEWeights& m = lw.ffn;
  L.ffn.gate.w = to_f32_contig(m.gate);
  L.ffn.gate.out = L.ffn.gate.w.size(0);
  L.ffn.gate.in = L.ffn.gate.w.size(1);
  L.ffn.bias = to_f32_contig(m.bias);
  if (m.tid2eid.defined()) {
    Tensor t = m.tid2eid.to_f32();  // ids < 2^24, exact in f32
    L.ffn.tid2eid.resize(size_t(t.numel()));
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) L.ffn.tid2eid[i] = int32_t(p[i]);
  }
  for (const auto& e : m.experts) L.ffn.experts.push_back(to_cpu_expert(e, cfg));
  L.ffn.shared = to_cpu_expert(m.shared, cfg);
  return L;
}

}  // namespace deepinfer::model::v4
