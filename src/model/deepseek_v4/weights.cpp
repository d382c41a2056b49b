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
#include "model/deepseek_v4/plan.h"
#include "model/deepseek_v4/tensors.h"
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

namespace {
// Routed experts of layers stored the transformers way (fused gate_up_proj [E, 2I, D], down_proj
// [E, D, I]): per-expert views sliced from them, keyed by layer, fetched when the layer's first
// expert entry is met (so tensors listed earlier report their own errors first).
struct HfExperts {
  bool checked = false;
  Tensor gate_up, down;
};

const HfExperts& hf_experts(Loader& ld, const DeepseekV4Config& cfg, int32_t layer, std::vector<HfExperts>& hf) {
  HfExperts& x = hf[size_t(layer)];
  if (x.checked) return x;
  x.checked = true;
  const int64_t E = cfg.n_routed_experts, I = cfg.moe_intermediate_size, D = cfg.hidden_size;
  const std::string f = "layers." + std::to_string(layer) + ".mlp.";
  if (!ld.has("", f + "experts.gate_up_proj")) return x;
  x.gate_up = ld.get("", f + "experts.gate_up_proj", kFloat, {E, 2 * I, D});
  x.down = ld.get("", f + "experts.down_proj", kFloat, {E, D, I});
  return x;
}

void load_entry(Loader& ld, const TensorEntry& e, const DeepseekV4Config& cfg, std::vector<HfExperts>& hf,
                DeepseekV4Weights& w) {
  for (size_t i = 0; i < e.parts.size(); ++i) {
    const TensorPart& p = e.parts[i];
    if (e.role == LinearRole::kHead && cfg.tie_word_embeddings && !ld.has(p.name, p.hf)) {
      *p.t = w.embed;
      continue;
    }
    if (e.role == LinearRole::kExpert && e.layer >= 0 && size_t(e.layer) < hf.size() &&
        hf_experts(ld, cfg, e.layer, hf).down.defined()) {
      const HfExperts& x = hf[size_t(e.layer)];
      const int64_t I = cfg.moe_intermediate_size;
      Tensor src = e.expert_w13 ? x.gate_up.select(0, e.expert) : x.down.select(0, e.expert);
      if (e.expert_w13) src = i == 0 ? src.slice(0, 0, I) : src.slice(0, I, 2 * I);
      *p.lin = {src, Tensor(), src.dtype() == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32};
      continue;
    }
    switch (e.kind) {
      case EntryKind::kLinear:
        if (p.lin)
          *p.lin = ld.linear(p.name, p.hf, p.shape[0], p.shape[1]);
        else
          *p.t = ld.get(p.name, p.hf, kFloat, p.shape, p.alias);
        break;
      case EntryKind::kFloat: *p.t = ld.get(p.name, p.hf, kFloat, p.shape, p.alias); break;
      case EntryKind::kTable:
        *p.t = ld.get(p.name, p.hf, {DType::kI64, DType::kI32}, p.shape);
        ld.check_expert_ids(p.name, p.hf, *p.t, cfg.n_routed_experts);
        break;
    }
  }
}
}  // namespace

DeepseekV4Weights DeepseekV4Weights::load(const std::string& dir, const DeepseekV4Config& cfg,
                                          const LoadOptions& opts) {
  auto ck = std::make_shared<io::Checkpoint>(io::Checkpoint::open(dir, opts.progress));
  check_finite_weights(*ck);  // NaN/Inf weights: an error naming the tensor, not NaN logits
  Loader ld(*ck, cfg);
  DeepseekV4Weights w;
  w.layout = ld.layout();
  w.keepalive = ck;
  int64_t num_mtp = 0;
  if (cfg.num_mtp_layers > 0) {
    if (ld.any_with_prefix("mtp.")) {
      num_mtp = cfg.num_mtp_layers;
    } else if (w.layout == CheckpointLayout::kOfficial && opts.warn_unused) {
      DI_WARN(dir, ": config says num_nextn_predict_layers=", cfg.num_mtp_layers,
              " but the checkpoint has no mtp.* tensors; MTP drafting is unavailable");
    }
  }
  const ModelPlan plan = v4_plan(cfg, {.num_mtp = num_mtp});
  const TensorTable table = v4_tensor_table(cfg, plan, &w, nullptr);
  std::vector<HfExperts> hf(size_t(cfg.num_layers));
  for (const TensorEntry& e : table.entries) load_entry(ld, e, cfg, hf, w);
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
