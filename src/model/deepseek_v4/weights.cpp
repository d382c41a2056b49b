// DeepseekV4Weights::load: both checkpoint layouts into the canonical structs, as views.
//
// Every tensor is looked up under the release name (`layers.L.attn.wkv.weight`) and the
// transformers 5.17 name (`model.layers.L.self_attn.kv_proj.weight`), each with and without a
// `model.` prefix — transformers' save_pretrained writes a mix of both (it un-renames most keys
// but keeps `model.`, and writes attn.kv_norm as `attn.norm`). Fused HF experts
// (gate_up_proj [E,2I,D], down_proj [E,D,I]) are split into per-expert views.
#include <algorithm>
#include <set>
#include <unordered_set>

#include "core/logging.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/weights.h"
#include "model/weight_checks.h"

namespace deepinfer::model::v4 {
namespace {

using DTypes = std::initializer_list<DType>;
constexpr DTypes kFloat = {DType::kBF16, DType::kF32};

std::string dtypes_str(DTypes ds) {
  std::string s;
  for (DType d : ds) s += (s.empty() ? "" : "/") + std::string(dtype_to_safetensors(d));
  return s;
}

// Name lookup, validation and bookkeeping of which tensors were used.
class Loader {
 public:
  Loader(const io::Checkpoint& ck, const DeepseekV4Config& cfg) : ck_(ck), cfg_(cfg) {
    if (ck.contains("embed.weight") || ck.contains("model.embed.weight")) layout_ = CheckpointLayout::kOfficial;
    else if (ck.contains("model.embed_tokens.weight") || ck.contains("embed_tokens.weight"))
      layout_ = CheckpointLayout::kTransformers;
    else
      DI_THROW(CheckpointError, ck.dir(), ": missing tensor 'embed.weight' (official layout) or "
                                          "'model.embed_tokens.weight' (transformers layout)");
  }
  CheckpointLayout layout() const { return layout_; }
  const DeepseekV4Config& cfg() const { return cfg_; }

  // First present name among the official/HF spellings ("" if none). `off`/`hf` are full
  // names without the optional `model.` prefix.
  std::string resolve(const std::string& off, const std::string& hf, const std::string& alias = "") const {
    for (const std::string* n : {&off, &hf, &alias}) {
      if (n->empty()) continue;
      if (ck_.contains(*n)) return *n;
      if (ck_.contains("model." + *n)) return "model." + *n;
    }
    return "";
  }
  std::string preferred(const std::string& off, const std::string& hf) const {
    return layout_ == CheckpointLayout::kOfficial ? off : "model." + hf;
  }
  bool has(const std::string& off, const std::string& hf, const std::string& alias = "") const {
    return !resolve(off, hf, alias).empty();
  }
  [[noreturn]] void missing(const std::string& off, const std::string& hf) const {
    DI_THROW(CheckpointError, ck_.dir(), ": missing tensor '", preferred(off, hf), "'");
  }

  // Every entry of a hash-routing table [V, k] must name a routed expert: checked once here, so
  // no forward path (the GPU's device-routed MoE has no host check) can meet a bad id.
  void check_expert_ids(const std::string& off, const std::string& hf, const Tensor& t, int64_t experts) const {
    const Tensor c = t.contiguous();
    const int64_t n = c.numel(), k = c.size(1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = c.dtype() == DType::kI64 ? c.data<int64_t>()[i] : int64_t(c.data<int32_t>()[i]);
      if (v < 0 || v >= experts) {
        const std::string name = resolve(off, hf);
        DI_THROW(CheckpointError, ck_.file_of(name), ": tensor '", name, "' entry [", i / k, ", ", i % k, "] is ", v,
                 ", not an expert id in [0, ", experts, ")");
      }
    }
  }

  // Fetch + check dtype and shape.
  Tensor get(const std::string& off, const std::string& hf, DTypes dts, const Shape& shape,
             const std::string& alias = "") {
    std::string n = resolve(off, hf, alias);
    if (n.empty()) missing(off, hf);
    return checked(n, dts, shape);
  }
  Tensor checked(const std::string& n, DTypes dts, const Shape& shape) {
    const io::TensorInfo& ti = ck_.info(n);
    if (std::find(dts.begin(), dts.end(), ti.dtype) == dts.end())
      DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "' has dtype ", ti.st_dtype, ", expected ",
               dtypes_str(dts));
    if (ti.shape != shape)
      DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "' has shape ", shape_str(ti.shape), ", expected ",
               shape_str(shape));
    used_.insert(n);
    return ck_.get(n);
  }

  // A linear [out, in]: bf16/f32, fp8 e4m3 + block scale, or packed fp4 (i8 [out, in/2]) + scale.
  Linear linear(const std::string& off, const std::string& hf, int64_t out, int64_t in) {
    std::string n = resolve(off, hf);
    if (n.empty()) missing(off, hf);
    const io::TensorInfo& ti = ck_.info(n);
    Linear l;
    switch (ti.dtype) {
      case DType::kBF16: case DType::kF32:
        l.weight = checked(n, kFloat, {out, in});
        l.format = ti.dtype == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
        return l;
      case DType::kF8E4M3: {
        const int64_t b = cfg_.fp8_block;
        l.weight = checked(n, {DType::kF8E4M3}, {out, in});
        l.scale = scale_of(n, {(out + b - 1) / b, (in + b - 1) / b});
        l.format = WeightFormat::kFP8Block;
        return l;
      }
      case DType::kI8: case DType::kU8: case DType::kFP4E2M1: {
        const int64_t b = cfg_.fp4_block;
        if (in % cfg_.fp4_block != 0)
          DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "': fp4 input dim ", in,
                   " is not a multiple of the scale block ", b);
        // Packed bytes: two e2m1 values per byte along `in`, so the stored shape is [out, in/2].
        Tensor raw = ti.dtype == DType::kFP4E2M1 ? checked(n, {DType::kFP4E2M1}, {out, in})
                                                 : checked(n, {DType::kI8, DType::kU8}, {out, in / 2});
        l.weight = Tensor(raw.storage(), raw.byte_offset(), {out, in}, contiguous_strides({out, in}), DType::kFP4E2M1);
        l.scale = scale_of(n, {out, in / b});
        l.format = WeightFormat::kFP4;
        return l;
      }
      default:
        DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "' has dtype ", ti.st_dtype,
                 ", expected BF16/F32 (plain), F8_E4M3 (+scale) or I8 (packed fp4, +scale)");
    }
  }

  Tensor scale_of(const std::string& weight_name, const Shape& shape) {
    std::string s = weight_name;
    const std::string suffix = ".weight";
    if (s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0)
      s = s.substr(0, s.size() - suffix.size());
    std::string sn;
    for (const char* suf : {".scale", ".weight_scale_inv", ".weight_scale"})
      if (ck_.contains(s + suf)) { sn = s + suf; break; }
    if (sn.empty()) DI_THROW(CheckpointError, ck_.dir(), ": missing tensor '", s, ".scale' (scale of quantised '",
                             weight_name, "')");
    return checked(sn, {DType::kE8M0, DType::kF32}, shape);
  }

  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& n : ck_.names())
      if (!used_.count(n)) out.push_back(n);
    return out;
  }
  bool any_with_prefix(const std::string& p) const {
    for (const auto& n : ck_.names())
      if (n.rfind(p, 0) == 0 || n.rfind("model." + p, 0) == 0) return true;
    return false;
  }

 private:
  const io::Checkpoint& ck_;
  const DeepseekV4Config& cfg_;
  CheckpointLayout layout_;
  std::unordered_set<std::string> used_;
};

// Name prefixes of one block: `layers.L.` / `mtp.K.` (release) and their HF spelling.
struct Prefix {
  std::string off, hf;
};

HcParams load_hc(Loader& ld, const Prefix& p, const char* site_off, const char* site_hf) {
  const DeepseekV4Config& c = ld.cfg();
  HcParams h;
  const std::string o = p.off + "hc_" + site_off + "_", f = p.hf + site_hf + "_hc.";
  h.fn = ld.get(o + "fn", f + "fn", kFloat, {c.hc_mix_dim(), c.hc_dim()});
  h.base = ld.get(o + "base", f + "base", kFloat, {c.hc_mix_dim()});
  h.scale = ld.get(o + "scale", f + "scale", kFloat, {3});
  return h;
}

// attn.compressor.* or attn.indexer.compressor.* (HF: self_attn.compressor[.indexer].*).
CompressorWeights load_compressor(Loader& ld, const std::string& off, const std::string& hf, int64_t ratio,
                                  int64_t d, bool overlap) {
  const DeepseekV4Config& c = ld.cfg();
  const int64_t width = overlap ? 2 * d : d;  // CSA keeps two halves per token
  CompressorWeights w;
  w.ratio = ratio;
  w.wkv = ld.linear(off + "wkv.weight", hf + "kv_proj.weight", width, c.hidden_size);
  w.wgate = ld.linear(off + "wgate.weight", hf + "gate_proj.weight", width, c.hidden_size);
  w.ape = ld.get(off + "ape", hf + "position_bias", kFloat, {ratio, width});
  w.norm = ld.get(off + "norm.weight", hf + "kv_norm.weight", kFloat, {d});
  return w;
}

AttentionWeights load_attention(Loader& ld, const Prefix& p, AttnKind kind, int64_t ratio) {
  const DeepseekV4Config& c = ld.cfg();
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank;
  const std::string o = p.off + "attn.", f = p.hf + "self_attn.";
  AttentionWeights a;
  a.wq_a = ld.linear(o + "wq_a.weight", f + "q_a_proj.weight", r, D);
  a.q_norm = ld.get(o + "q_norm.weight", f + "q_a_norm.weight", kFloat, {r});
  a.wq_b = ld.linear(o + "wq_b.weight", f + "q_b_proj.weight", H * d, r);
  a.wkv = ld.linear(o + "wkv.weight", f + "kv_proj.weight", d, D);
  a.kv_norm = ld.get(o + "kv_norm.weight", f + "kv_norm.weight", kFloat, {d}, o + "norm.weight");
  a.wo_a = ld.linear(o + "wo_a.weight", f + "o_a_proj.weight", c.o_groups * c.o_lora_rank, H * d / c.o_groups);
  a.wo_b = ld.linear(o + "wo_b.weight", f + "o_b_proj.weight", D, c.o_groups * c.o_lora_rank);
  a.sink = ld.get(o + "attn_sink", f + "sinks", kFloat, {H});
  if (kind == AttnKind::kSliding) return a;
  a.compressor = load_compressor(ld, o + "compressor.", f + "compressor.", ratio, d, kind == AttnKind::kCSA);
  if (kind == AttnKind::kCSA) {
    const std::string io = o + "indexer.", ih = f + "compressor.indexer.";
    IndexerWeights ix;
    ix.wq_b = ld.linear(io + "wq_b.weight", ih + "q_b_proj.weight", c.index_n_heads * c.index_head_dim, r);
    ix.weights_proj = ld.linear(io + "weights_proj.weight", ih + "scorer.weights_proj.weight", c.index_n_heads, D);
    ix.compressor = load_compressor(ld, io + "compressor.", ih, ratio, c.index_head_dim, true);
    a.indexer = std::move(ix);
  }
  return a;
}

MoEWeights load_moe(Loader& ld, const Prefix& p, MlpKind kind) {
  const DeepseekV4Config& c = ld.cfg();
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  const std::string o = p.off + "ffn.", f = p.hf + "mlp.";
  MoEWeights m;
  m.gate = ld.get(o + "gate.weight", f + "gate.weight", kFloat, {E, D});
  if (kind == MlpKind::kHashMoE)
  {
    m.tid2eid = ld.get(o + "gate.tid2eid", f + "gate.tid2eid", {DType::kI64, DType::kI32},
                       {c.vocab_size, c.num_experts_per_tok});
    ld.check_expert_ids(o + "gate.tid2eid", f + "gate.tid2eid", m.tid2eid, E);
  } else
    m.bias = ld.get(o + "gate.bias", f + "gate.e_score_correction_bias", kFloat, {E});
  if (c.n_shared_experts > 0) {
    const std::string so = o + "shared_experts.", sf = f + "shared_experts.";
    m.shared.w1 = ld.linear(so + "w1.weight", sf + "gate_proj.weight", I, D);
    m.shared.w3 = ld.linear(so + "w3.weight", sf + "up_proj.weight", I, D);
    m.shared.w2 = ld.linear(so + "w2.weight", sf + "down_proj.weight", D, I);
  }
  m.experts.resize(size_t(E));
  if (ld.has("", f + "experts.gate_up_proj")) {  // HF fused: [E, 2I, D] = [W1; W3], [E, D, I]
    Tensor gu = ld.get("", f + "experts.gate_up_proj", kFloat, {E, 2 * I, D});
    Tensor dn = ld.get("", f + "experts.down_proj", kFloat, {E, D, I});
    const WeightFormat fmt = gu.dtype() == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
    const WeightFormat fmt_dn = dn.dtype() == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
    for (int64_t e = 0; e < E; ++e) {
      Tensor g = gu.select(0, e);
      m.experts[e].w1 = {g.slice(0, 0, I), Tensor(), fmt};
      m.experts[e].w3 = {g.slice(0, I, 2 * I), Tensor(), fmt};
      m.experts[e].w2 = {dn.select(0, e), Tensor(), fmt_dn};
    }
    return m;
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string eo = o + "experts." + std::to_string(e) + ".";
    m.experts[e].w1 = ld.linear(eo + "w1.weight", "", I, D);
    m.experts[e].w3 = ld.linear(eo + "w3.weight", "", I, D);
    m.experts[e].w2 = ld.linear(eo + "w2.weight", "", D, I);
  }
  return m;
}

LayerWeights load_layer(Loader& ld, const Prefix& p, AttnKind kind, int64_t ratio, MlpKind mlp) {
  const int64_t D = ld.cfg().hidden_size;
  LayerWeights w;
  w.attn_norm = ld.get(p.off + "attn_norm.weight", p.hf + "input_layernorm.weight", kFloat, {D});
  w.ffn_norm = ld.get(p.off + "ffn_norm.weight", p.hf + "post_attention_layernorm.weight", kFloat, {D});
  w.hc_attn = load_hc(ld, p, "attn", "attn");
  w.hc_ffn = load_hc(ld, p, "ffn", "ffn");
  w.attn = load_attention(ld, p, kind, ratio);
  w.ffn = load_moe(ld, p, mlp);
  return w;
}

HcHeadParams load_hc_head(Loader& ld, const std::string& off, const std::string& hf) {
  const DeepseekV4Config& c = ld.cfg();
  HcHeadParams h;
  h.fn = ld.get(off + "hc_head_fn", hf + "hc_head.hc_fn", kFloat, {c.hc_mult, c.hc_dim()});
  h.base = ld.get(off + "hc_head_base", hf + "hc_head.hc_base", kFloat, {c.hc_mult});
  h.scale = ld.get(off + "hc_head_scale", hf + "hc_head.hc_scale", kFloat, {1});
  return h;
}

MtpWeights load_mtp(Loader& ld, int64_t k) {
  const DeepseekV4Config& c = ld.cfg();
  const int64_t D = c.hidden_size;
  const std::string o = "mtp." + std::to_string(k) + ".";
  const Prefix p{o, o};  // transformers does not model MTP; only release names exist
  MtpWeights m;
  m.e_proj = ld.linear(o + "e_proj.weight", "", D, D);
  m.h_proj = ld.linear(o + "h_proj.weight", "", D, D);
  m.enorm = ld.get(o + "enorm.weight", "", kFloat, {D});
  m.hnorm = ld.get(o + "hnorm.weight", "", kFloat, {D});
  m.norm = ld.get(o + "norm.weight", "", kFloat, {D});
  m.hc_head = load_hc_head(ld, o, o);
  const int64_t ratio = k < int64_t(c.mtp_compress_ratio.size()) ? c.mtp_compress_ratio[k] : 0;
  const AttnKind kind = ratio == 0 ? AttnKind::kSliding : ratio == 4 ? AttnKind::kCSA : AttnKind::kHCA;
  m.block = load_layer(ld, p, kind, ratio, MlpKind::kMoE);
  return m;
}

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kFP8Block: return "fp8";
    case WeightFormat::kFP4: return "fp4";
  }
  return "?";
}
}  // namespace

DeepseekV4Weights DeepseekV4Weights::load(const std::string& dir, const DeepseekV4Config& cfg) {
  return load(dir, cfg, LoadOptions{});
}

DeepseekV4Weights DeepseekV4Weights::load(const std::string& dir, const DeepseekV4Config& cfg,
                                          const LoadOptions& opts) {
  auto ck = std::make_shared<io::Checkpoint>(io::Checkpoint::open(dir, opts.progress));
  check_finite_weights(*ck);  // NaN/Inf weights: an error naming the tensor, not NaN logits
  Loader ld(*ck, cfg);
  DeepseekV4Weights w;
  w.layout = ld.layout();
  w.keepalive = ck;
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size;
  w.embed = ld.get("embed.weight", "embed_tokens.weight", kFloat, {V, D});
  w.head = cfg.tie_word_embeddings && !ld.has("head.weight", "lm_head.weight")
               ? w.embed
               : ld.get("head.weight", "lm_head.weight", kFloat, {V, D});
  w.norm = ld.get("norm.weight", "norm.weight", kFloat, {D});
  w.hc_head = load_hc_head(ld, "", "");
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string ls = "layers." + std::to_string(l) + ".";
    w.layers.push_back(load_layer(ld, {ls, ls}, cfg.layer_types[l], cfg.compress_ratio[l], cfg.mlp_types[l]));
  }
  if (cfg.num_mtp_layers > 0) {
    if (ld.any_with_prefix("mtp.")) {
      for (int64_t k = 0; k < cfg.num_mtp_layers; ++k) w.mtp.push_back(load_mtp(ld, k));
    } else if (w.layout == CheckpointLayout::kOfficial && opts.warn_unused) {
      DI_WARN(dir, ": config says num_nextn_predict_layers=", cfg.num_mtp_layers,
              " but the checkpoint has no mtp.* tensors; MTP drafting is unavailable");
    }
  }
  // Config/checkpoint agreement on quantisation is advisory: kernels follow Linear::format.
  const Linear& probe = w.layers[0].attn.wq_a;
  if (opts.warn_unused && probe.format != cfg.dense_format && cfg.layout == CheckpointLayout::kOfficial)
    DI_WARN(dir, ": config.json implies ", format_name(cfg.dense_format), " dense weights but the checkpoint stores ",
            format_name(probe.format));
  w.ignored_tensors = ld.unused();
  if (opts.warn_unused) {
    const auto& extra = w.ignored_tensors;
    if (!extra.empty()) {
      std::string some;
      for (size_t i = 0; i < extra.size() && i < 5; ++i) some += (i ? ", " : "") + extra[i];
      DI_WARN(dir, ": ", extra.size(), " unexpected tensor(s) ignored, e.g. ", some);
    }
  }
  return w;
}

}  // namespace deepinfer::model::v4
