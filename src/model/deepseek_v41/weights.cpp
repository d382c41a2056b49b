#include "model/deepseek_v41/weights.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/logging.h"
#include "core/numeric.h"
#include "deepinfer/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/plan.h"
#include "model/weight_checks.h"

namespace deepinfer::model::v41 {
namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Loader {
 public:
  Loader(const io::Checkpoint& ck, const DeepseekV41Config& c, V41Layout layout) : ck_(ck), c_(c), layout_(layout) {}

  v4::Linear part(const V41Entry& e, const V41Part& p) {
    const std::string n = layout_ == V41Layout::kRelease ? p.name : (p.hf.empty() ? "model." + p.name : p.hf);
    if (!ck_.contains(n)) DI_THROW(CheckpointError, ck_.dir(), ": missing tensor '", n, "'");
    const io::TensorInfo& ti = ck_.info(n);
    v4::Linear l;
    const bool is_float = ti.dtype == DType::kBF16 || ti.dtype == DType::kF32;
    if (is_float) {
      l.weight = checked(n, p.shape);
      l.format = ti.dtype == DType::kBF16 ? v4::WeightFormat::kBF16 : v4::WeightFormat::kF32;
      if (e.store == V41Store::kEngramTable) mark_scale(n, {p.shape[0], p.shape[1] / 32});  // all ones: unused
      return l;
    }
    const int64_t out = p.shape[0], in = p.shape.size() > 1 ? p.shape[1] : 0;
    if (ti.dtype == DType::kF8E4M3 && (e.store == V41Store::kDense || e.store == V41Store::kEngramTable)) {
      l.weight = checked(n, p.shape);
      l.format = v4::WeightFormat::kFP8Block;
      l.scale = e.store == V41Store::kDense
                    ? scale(n, {ceil_div(out, c_.fp8_block_out), ceil_div(in, c_.fp8_block_in)})
                    : scale(n, {out, in / 32});
      return l;
    }
    if ((ti.dtype == DType::kI8 || ti.dtype == DType::kU8) && e.store == V41Store::kExpert) {
      if (in % c_.fp4_block)
        DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "': fp4 input dim ", in, " is not a multiple of ",
                 c_.fp4_block);
      const Tensor raw = checked(n, {out, in / 2});
      l.weight = Tensor(raw.storage(), raw.byte_offset(), {out, in}, contiguous_strides({out, in}), DType::kFP4E2M1);
      l.scale = scale(n, {out, in / c_.fp4_block});
      l.format = v4::WeightFormat::kFP4;
      return l;
    }
    DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "' has dtype ", ti.st_dtype, ", expected ",
             e.store == V41Store::kDense         ? "BF16/F32 or F8_E4M3 (+scale)"
             : e.store == V41Store::kExpert      ? "BF16/F32 or I8 (packed fp4, +scale)"
             : e.store == V41Store::kEngramTable ? "F8_E4M3 (+scale) or BF16/F32"
                                                 : "BF16/F32",
             " (", v41_store_name(e.store), " tensor)");
  }

  std::vector<std::string> unlisted() const {
    std::vector<std::string> out;
    for (const std::string& n : ck_.names())
      if (!used_.count(n)) out.push_back(n);
    return out;
  }

 private:
  Tensor checked(const std::string& n, const Shape& shape) {
    const io::TensorInfo& ti = ck_.info(n);
    if (ti.shape != shape)
      DI_THROW(CheckpointError, ck_.file_of(n), ": tensor '", n, "' has shape ", shape_str(ti.shape), ", expected ",
               shape_str(shape));
    used_.insert(n);
    return ck_.get(n);
  }
  static std::string scale_name(const std::string& weight) {
    const std::string suf = ".weight";
    const bool w = weight.size() > suf.size() && weight.compare(weight.size() - suf.size(), suf.size(), suf) == 0;
    return (w ? weight.substr(0, weight.size() - suf.size()) : weight) + ".scale";
  }
  Tensor scale(const std::string& weight, const Shape& shape) {
    const std::string s = scale_name(weight);
    if (!ck_.contains(s))
      DI_THROW(CheckpointError, ck_.dir(), ": missing tensor '", s, "' (scale of quantised '", weight, "')");
    const io::TensorInfo& ti = ck_.info(s);
    if (ti.dtype != DType::kE8M0 && ti.dtype != DType::kF32)
      DI_THROW(CheckpointError, ck_.file_of(s), ": tensor '", s, "' has dtype ", ti.st_dtype, ", expected F8_E8M0/F32");
    return checked(s, shape);
  }
  void mark_scale(const std::string& weight, const Shape& shape) {
    const std::string s = scale_name(weight);
    if (ck_.contains(s)) checked(s, shape);
  }

  const io::Checkpoint& ck_;
  const DeepseekV41Config& c_;
  V41Layout layout_;
  std::set<std::string> used_;
};
}  // namespace

V41Weights V41Weights::load(const std::string& dir, const DeepseekV41Config& cfg, bool progress) {
  auto ck = std::make_shared<io::Checkpoint>(io::Checkpoint::open(dir, progress));
  check_finite_weights(*ck);
  V41Weights w;
  if (ck->contains("embed.weight")) w.layout = V41Layout::kRelease;
  else if (ck->contains("model.embed.weight")) w.layout = V41Layout::kTransformers;
  else
    DI_THROW(CheckpointError, dir, ": missing tensor 'embed.weight' (release layout) or 'model.embed.weight' "
                                   "(transformers layout)");
  w.table = v41_tensor_table(cfg, v41_plan(cfg, {}));
  if (cfg.dspark.num_stages > 0 && (ck->contains("mtp.0.attn_norm.weight") || ck->contains("model.mtp.0.attn_norm.weight"))) {
    for (V41Entry& e : v41_dspark_table(cfg).entries) w.table.entries.push_back(std::move(e));
    w.num_dspark = cfg.dspark.num_stages;
  }
  Loader ld(*ck, cfg, w.layout);
  w.parts.resize(w.table.entries.size());
  for (size_t i = 0; i < w.table.entries.size(); ++i)
    for (const V41Part& p : w.table.entries[i].parts) w.parts[i].push_back(ld.part(w.table.entries[i], p));
  for (const std::string& n : ld.unlisted()) {
    if (!v41_skipped_tensor(n))
      DI_THROW(CheckpointError, ck->file_of(n), ": unexpected tensor '", n,
               "' (not part of DeepSeek-V4.1 as this engine knows it)");
    w.skipped.push_back(n);
  }
  // The vision tower is not run: say so once, loudly (a user may expect images to work).
  size_t vision = 0;
  for (const std::string& n : w.skipped) vision += n.find("mtp.") == std::string::npos;
  if (vision > 0)
    DI_WARN(dir, ": the vision tower is not run: ", vision, " tensor(s) (vision.*, aligner.*, image_*) skipped, e.g. ",
            w.skipped[0], "; prompts are text only");
  if (w.skipped.size() > vision)
    DI_INFO(dir, ": ", w.skipped.size() - vision, " DSpark (mtp.*) tensor(s) not listed for this load skipped");
  w.keepalive = ck;
  return w;
}

int64_t V41Weights::find(const std::string& name) const {
  for (size_t i = 0; i < table.entries.size(); ++i)
    if (table.entries[i].name() == name) return int64_t(i);
  return -1;
}

Tensor V41Weights::entry_f32(size_t entry, const DeepseekV41Config& cfg) const {
  DI_CHECK(entry < parts.size(), "entry ", entry, " of ", parts.size());
  const V41Entry& e = table.entries[entry];
  DI_CHECK(e.store != V41Store::kEngramTable, "the Engram table '", e.name(), "' is read by row (engram_rows_f32)");
  DI_CHECK(cfg.fp8_block_out == cfg.fp8_block_in, "non-square fp8 blocks");
  std::vector<Tensor> ts;
  for (const v4::Linear& l : parts[entry]) {
    const bool plain = l.format == v4::WeightFormat::kBF16 || l.format == v4::WeightFormat::kF32;
    ts.push_back((plain ? l.weight.to_f32() : l.dequantize_f32(cfg.fp8_block_out, cfg.fp4_block)).contiguous());
  }
  if (ts.size() == 1) return ts[0];
  int64_t rows = 0;
  for (const Tensor& t : ts) rows += t.size(0);
  Tensor out = Tensor::empty({rows, ts[0].size(1)}, DType::kF32);
  size_t off = 0;
  for (const Tensor& t : ts) {
    std::memcpy(static_cast<char*>(out.raw_data()) + off, t.raw_data(), t.nbytes());
    off += t.nbytes();
  }
  return out;
}

void engram_rows_f32(const v4::Linear& table, const int64_t* ids, int64_t n, float* out) {
  const Tensor& w = table.weight;
  DI_CHECK(w.defined() && w.dim() == 2 && w.is_contiguous(), "engram table view");
  const int64_t rows = w.size(0), dim = w.size(1);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= rows)
      DI_THROW(InvalidArgument, "engram_rows_f32: row id ", ids[i], " at position ", i, " outside the table's ", rows,
               " rows");
  if (table.format != v4::WeightFormat::kFP8Block) {
    for (int64_t i = 0; i < n; ++i) {
      const Tensor r = w.select(0, ids[i]).to_f32();
      std::memcpy(out + i * dim, r.raw_data(), size_t(dim) * sizeof(float));
    }
    return;
  }
  DI_CHECK(table.scale.defined() && table.scale.size(0) == rows && table.scale.size(1) * 32 == dim,
           "engram table scale ", table.scale.defined() ? table.scale.str() : "undefined");
  const auto* codes = static_cast<const uint8_t*>(w.raw_data());
  const Tensor& s = table.scale;
  const bool e8 = s.dtype() == DType::kE8M0;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = codes + ids[i] * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const int64_t k = ids[i] * (dim / 32) + j / 32;
      const float sc = e8 ? e8m0_to_f32(static_cast<const uint8_t*>(s.raw_data())[k]) : s.data<float>()[k];
      out[i * dim + j] = fp8e4m3_to_f32(row[j]) * sc;
    }
  }
}

}  // namespace deepinfer::model::v41
