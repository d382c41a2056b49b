#include "model/deepseek_v4/cuda/cuda_weights.h"

#include <cstdio>
#include <atomic>
#include <cstring>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/cuda/cuda_plan.h"
#include "ops/cpu/rope.h"
#include "ops/cuda/gemm_fp8w.h"

namespace deepinfer::model::v4::gpu {
namespace {

// Uploads host bytes, counting them for the progress bar (one line, redrawn every 2%).
class Uploader {
 public:
  Uploader(size_t planned, bool progress, cudaStream_t s) : planned_(planned), progress_(progress), stream_(s) {}
  ~Uploader() { finish(); }
  cuda::DeviceBuffer put(const void* src, size_t n) {
    cuda::DeviceBuffer b(n == 0 ? 16 : n);
    if (n) cuda::copy_h2d(b.data(), src, n, stream_, /*sync=*/true);
    done_ += n;
    draw();
    return b;
  }
  size_t done() const { return done_; }
  void finish() {
    if (progress_ && drawn_ >= 0) std::fprintf(stderr, "\n");
    drawn_ = -1;
    progress_ = false;
  }

 private:
  void draw() {
    if (!progress_) return;
    const size_t total = std::max(planned_, done_);
    const int pct = total ? int(100.0 * double(done_) / double(total)) : 100;
    if (pct < drawn_ + 2 && pct != 100) return;
    if (pct == drawn_) return;
    drawn_ = pct;
    char bar[41];
    for (int i = 0; i < 40; ++i) bar[i] = i < pct * 40 / 100 ? '#' : '.';
    bar[40] = 0;
    std::fprintf(stderr, "\rdeepinfer: uploading weights to the GPU [%s] %3d%% (%.2f / %.2f GiB)", bar, pct,
                 double(done_) / (1 << 30), double(total) / (1 << 30));
    std::fflush(stderr);
  }
  size_t planned_, done_ = 0;
  bool progress_;
  int drawn_ = -2;
  cudaStream_t stream_;
};

// Uploader plus the mode's linear storage dtype and how routed experts are kept.
struct Up {
  Uploader& u;
  const DeepseekV4Config& cfg;
  DType dt;                     // bf16 | f32
  WeightFormat experts;         // device_expert_format: kFP4 / kFP8Block native, else dequantised
  bool dense_fp8 = false;       // device_dense_fp8: dense FP8 linears stay FP8
  size_t expert_bytes = 0;      // routed experts uploaded
  int64_t fp8_kept = 0, fp8_dequantised = 0;
};

// dt [out, in] host copy of a linear in any stored format (f32: the exact dequantised values).
Tensor host_linear(const Linear& l, const DeepseekV4Config& cfg, DType dt) {
  DI_CHECK(l.weight.defined() && l.weight.dim() == 2, "linear weight missing");
  if (l.format == WeightFormat::kBF16 && l.weight.dtype() == dt) return l.weight.contiguous();
  Tensor f = l.dequantize_f32(cfg.fp8_block, cfg.fp4_block).contiguous();
  return dt == DType::kF32 ? f : f.to(dt);
}

DevLinear up_linear(Up& U, const Linear& l) {
  DevLinear d;
  if (!l.weight.defined()) return d;
  Tensor h = host_linear(l, U.cfg, U.dt);
  d.out = h.size(0);
  d.in = h.size(1);
  d.dtype = U.dt;
  d.w = U.u.put(h.raw_data(), h.nbytes());
  return d;
}

// [a; b] stacked along rows (same in-width): one GEMM gives both outputs.
DevLinear up_fused(Up& U, const Linear& a, const Linear& b) {
  Tensor ha = host_linear(a, U.cfg, U.dt), hb = host_linear(b, U.cfg, U.dt);
  DI_CHECK(ha.size(1) == hb.size(1), "fused linears differ in input width: ", ha.str(), " vs ", hb.str());
  std::vector<uint8_t> buf(ha.nbytes() + hb.nbytes());
  std::memcpy(buf.data(), ha.raw_data(), ha.nbytes());
  std::memcpy(buf.data() + ha.nbytes(), hb.raw_data(), hb.nbytes());
  DevLinear d;
  d.out = ha.size(0) + hb.size(0);
  d.in = ha.size(1);
  d.dtype = U.dt;
  d.w = U.u.put(buf.data(), buf.size());
  return d;
}

// e8m0 byte of a power-of-two f32 scale (NaN -> 255), or -1 when it is not one.
int e8m0_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (v != v) return 255;
  if (u == 0x00400000u) return 0;  // 2^-127
  const uint32_t e = u >> 23;      // sign bit must be clear
  return (u & 0x7fffffu) == 0 && e >= 1 && e <= 254 ? int(e) : -1;
}

// A scale tensor (e8m0, or f32/bf16 powers of two) as row-major e8m0 exponent bytes; nullopt when
// a scale is not a power of two.
std::optional<std::vector<uint8_t>> e8m0_grid(const Tensor& scale) {
  const Tensor st = scale.contiguous();
  std::vector<uint8_t> grid(size_t(st.numel()));
  if (st.dtype() == DType::kE8M0) {
    std::memcpy(grid.data(), st.raw_data(), grid.size());
    return grid;
  }
  const Tensor f32 = st.to_f32();
  for (size_t i = 0; i < grid.size(); ++i) {
    const int e = e8m0_of(f32.data<float>()[i]);
    if (e < 0) return std::nullopt;
    grid[i] = uint8_t(e);
  }
  return grid;
}

// e8m0 grid of a dense FP8 linear ([ceil(out/128), ceil(in/128)], f32 power-of-two scales
// converted), or nullopt when gemm_fp8w cannot read it as stored: not FP8, input width not a
// multiple of 16, a scale not a power of two or above 2^(kFp8wMaxScaleExp-127).
std::optional<std::vector<uint8_t>> dense_fp8_grid(const Linear& l) {
  if (l.format != WeightFormat::kFP8Block || !l.weight.defined() || l.weight.dim() != 2 ||
      l.weight.dtype() != DType::kF8E4M3 || !l.scale.defined() || l.scale.dim() != 2)
    return std::nullopt;
  const int64_t out = l.weight.size(0), in = l.weight.size(1);
  if (in % 16 || l.scale.size(0) != (out + 127) / 128 || l.scale.size(1) != (in + 127) / 128) return std::nullopt;
  std::optional<std::vector<uint8_t>> grid = e8m0_grid(l.scale);
  if (!grid) return std::nullopt;
  for (uint8_t e : *grid)
    if (e > ops::cuda::kFp8wMaxScaleExp) return std::nullopt;
  return *grid;
}

// Dense linears [a; b; ...] stacked by rows: FP8 as stored when the mode and every part allow it
// (parts' scale grids stacked; per 16 rows when a part before the last is not 128-row aligned),
// else dequantised to the storage dtype (with a warning when the mode wanted FP8).
DevLinear up_dense(Up& U, std::initializer_list<const Linear*> parts, const char* what) {
  if (U.dense_fp8) {
    bool ok = true, aligned = true;
    std::vector<std::optional<std::vector<uint8_t>>> grids;
    int64_t in = -1;
    size_t i = 0;
    for (const Linear* l : parts) {
      grids.push_back(dense_fp8_grid(*l));
      ok = ok && grids.back().has_value() && (in < 0 || in == l->in_features());
      in = l->in_features();
      if (++i < parts.size()) {
        aligned = aligned && l->out_features() % 128 == 0;
        ok = ok && l->out_features() % 16 == 0;
      }
    }
    if (ok) {
      DevLinear d;
      d.dtype = DType::kF8E4M3;
      d.in = in;
      d.scale_rows = aligned ? 128 : 16;
      const int64_t kb = (in + 127) / 128;
      std::vector<uint8_t> w, s;
      i = 0;
      for (const Linear* l : parts) {
        const Tensor wc = l->weight.contiguous();
        const uint8_t* pw = static_cast<const uint8_t*>(wc.raw_data());
        w.insert(w.end(), pw, pw + wc.nbytes());
        const std::vector<uint8_t>& g = *grids[i++];
        const int64_t out = l->out_features();
        if (aligned) {
          s.insert(s.end(), g.begin(), g.end());
        } else {  // one grid row per 16 rows, copied from the 128-row block holding them
          for (int64_t r = 0; r < out; r += 16) s.insert(s.end(), g.begin() + (r / 128) * kb, g.begin() + (r / 128 + 1) * kb);
        }
        d.out += out;
      }
      d.w = U.u.put(w.data(), w.size());
      d.scale = U.u.put(s.data(), s.size());
      U.fp8_kept++;
      return d;
    }
    bool any_fp8 = false;
    for (const Linear* l : parts) any_fp8 = any_fp8 || l->format == WeightFormat::kFP8Block;
    if (any_fp8) {
      U.fp8_dequantised++;
      DI_WARN("deepseek_v4 cuda: ", what, " cannot stay FP8 on the device (scales not powers of two <= 2^7, input "
              "width not a multiple of 16, or stacked parts not 16-row aligned); dequantising it to ",
              dtype_name(U.dt), " (more memory than planned)");
    }
  }
  if (parts.size() == 1) return up_linear(U, **parts.begin());
  DI_CHECK(parts.size() == 2, "up_dense: stacks of ", parts.size(), " parts");
  return up_fused(U, **parts.begin(), **(parts.begin() + 1));
}

DevF32 up_f32(Uploader& u, const Tensor& t) {
  DevF32 d;
  if (!t.defined()) return d;
  Tensor h = t.to_f32().contiguous();
  d.numel = h.numel();
  d.b = u.put(h.raw_data(), h.nbytes());
  return d;
}
DevF32 up_vec(Uploader& u, const std::vector<float>& v) {
  DevF32 d;
  d.numel = int64_t(v.size());
  d.b = u.put(v.data(), v.size() * sizeof(float));
  return d;
}

GpuHc up_hc(Uploader& u, const Tensor& fn, const Tensor& base, const Tensor& scale) {
  return {up_f32(u, fn), up_f32(u, base), up_f32(u, scale)};
}

GpuCompressor up_compressor(Up& U, const CompressorWeights& w, int64_t ratio) {
  Uploader& u = U.u;
  GpuCompressor c;
  c.ratio = ratio;
  c.width = w.wkv.out_features();
  c.wkv_gate = up_fused(U, w.wkv, w.wgate);
  c.ape = up_f32(u, w.ape);
  c.norm = up_f32(u, w.norm);
  DI_CHECK(c.ape.numel == ratio * c.width, "compressor ape has ", c.ape.numel, " values, expected ", ratio, "x", c.width);
  return c;
}

Linear plain(const Tensor& t) {
  Linear l;
  l.weight = t;
  return l;
}

GpuExpert up_expert(Up& U, const ExpertWeights& e) { return {up_fused(U, e.w1, e.w3), up_linear(U, e.w2)}; }

// Appends one expert matrix in its release format: weight bytes as stored and e8m0 scales per
// row (FP4 [out, in/32]; FP8's [ceil(out/128), ceil(in/128)] grid repeated for each row).
// False when the linear is not in format `f` or a scale is not a power of two (f32 scales of
// some FP8 checkpoints): the caller then dequantises the layer's experts.
bool append_native(const Linear& l, WeightFormat f, std::vector<uint8_t>& w, std::vector<uint8_t>& s) {
  const DType wd = f == WeightFormat::kFP4 ? DType::kFP4E2M1 : DType::kF8E4M3;
  if (l.format != f || !l.weight.defined() || l.weight.dim() != 2 || l.weight.dtype() != wd || !l.scale.defined() ||
      l.scale.dim() != 2)
    return false;
  const int64_t out = l.weight.size(0), in = l.weight.size(1);
  const int64_t bi = f == WeightFormat::kFP4 ? 32 : 128, bo = f == WeightFormat::kFP4 ? 1 : 128;
  if (in % 32 || l.scale.size(0) != (out + bo - 1) / bo || l.scale.size(1) != (in + bi - 1) / bi) return false;
  const std::optional<std::vector<uint8_t>> grid = e8m0_grid(l.scale);
  if (!grid) return false;
  const Tensor wc = l.weight.contiguous();
  const uint8_t* pw = static_cast<const uint8_t*>(wc.raw_data());
  w.insert(w.end(), pw, pw + wc.nbytes());
  const int64_t sc = l.scale.size(1);
  for (int64_t r = 0; r < out; ++r) {
    const uint8_t* row = grid->data() + (r / bo) * sc;
    s.insert(s.end(), row, row + sc);
  }
  return true;
}

// [a; b; ...] stacked by rows in release format (W1|W3 -> one [2I, D] matrix); nullopt when a
// part cannot stay native.
std::optional<DevLinear> up_native(Up& U, std::initializer_list<const Linear*> parts) {
  std::vector<uint8_t> w, s;
  DevLinear d;
  for (const Linear* l : parts) {
    if (!append_native(*l, U.experts, w, s)) return std::nullopt;
    if (d.in && d.in != l->in_features()) return std::nullopt;
    d.in = l->in_features();
    d.out += l->out_features();
  }
  d.dtype = U.experts == WeightFormat::kFP4 ? DType::kFP4E2M1 : DType::kF8E4M3;
  d.w = U.u.put(w.data(), w.size());
  d.scale = U.u.put(s.data(), s.size());
  return d;
}

// The routed experts of one layer: native when the mode and every expert allow it, else
// dequantised (then a warning names the layer: the memory plan counted native bytes).
void up_routed(Up& U, const MoEWeights& m, GpuMoE& M, int64_t layer) {
  namespace oc = ops::cuda;
  M.format = oc::ExpertFormat::kPlain;
  M.host_routed = expert_path() == ExpertPath::kHostRouted;
  if (U.experts == WeightFormat::kFP4 || U.experts == WeightFormat::kFP8Block) {
    bool ok = true;
    for (const auto& e : m.experts) {
      auto w13 = up_native(U, {&e.w1, &e.w3});
      auto w2 = w13 ? up_native(U, {&e.w2}) : std::nullopt;
      if (!w13 || !w2) {
        ok = false;
        break;
      }
      M.experts.push_back({std::move(*w13), std::move(*w2)});
    }
    if (ok) {
      M.format = U.experts == WeightFormat::kFP4 ? oc::ExpertFormat::kFP4 : oc::ExpertFormat::kFP8;
    } else {
      M.experts.clear();
      DI_WARN("deepseek_v4 cuda: layer ", layer, " routed experts are not all ", (U.experts == WeightFormat::kFP4 ? "FP4" : "FP8"),
              " with power-of-two scales; dequantising them to ", dtype_name(U.dt), " (more memory than planned)");
    }
  }
  if (M.experts.empty())
    for (const auto& e : m.experts) M.experts.push_back(up_expert(U, e));
  // pointer tables for the device-side MoE (moe_decode.h, grouped_gemm.h)
  std::vector<const void*> w13, w2, s13, s2;
  for (const auto& e : M.experts) {
    w13.push_back(e.w13.data());
    w2.push_back(e.w2.data());
    s13.push_back(e.w13.scale.data());
    s2.push_back(e.w2.scale.data());
  }
  if (w13.empty()) w13 = w2 = s13 = s2 = {nullptr};
  M.w13_ptrs = U.u.put(w13.data(), w13.size() * sizeof(void*));
  M.w2_ptrs = U.u.put(w2.data(), w2.size() * sizeof(void*));
  M.w13_scale_ptrs = U.u.put(s13.data(), s13.size() * sizeof(void*));
  M.w2_scale_ptrs = U.u.put(s2.data(), s2.size() * sizeof(void*));
}

GpuLayer up_layer(Up& U, const LayerWeights& lw, AttnKind kind, int64_t ratio, const GpuWeights& model, int64_t layer) {
  Uploader& u = U.u;
  GpuLayer L;
  L.attn_norm = up_f32(u, lw.attn_norm);
  L.ffn_norm = up_f32(u, lw.ffn_norm);
  L.hc_attn = up_hc(u, lw.hc_attn.fn, lw.hc_attn.base, lw.hc_attn.scale);
  L.hc_ffn = up_hc(u, lw.hc_ffn.fn, lw.hc_ffn.base, lw.hc_ffn.scale);
  const AttentionWeights& a = lw.attn;
  GpuAttention& A = L.attn;
  A.kind = kind;
  A.ratio = ratio;
  A.wq_a = up_dense(U, {&a.wq_a}, "wq_a");
  A.wq_b = up_dense(U, {&a.wq_b}, "wq_b");
  A.wkv = up_dense(U, {&a.wkv}, "wkv");
  A.wo_a = up_dense(U, {&a.wo_a}, "wo_a");
  A.wo_b = up_dense(U, {&a.wo_b}, "wo_b");
  A.q_norm = up_f32(u, a.q_norm);
  A.kv_norm = up_f32(u, a.kv_norm);
  A.sink = up_f32(u, a.sink);
  A.inv_freq = kind == AttnKind::kSliding ? model.inv_freq_main.data() : model.inv_freq_compress.data();
  if (kind != AttnKind::kSliding) {
    DI_CHECK(a.compressor.has_value(), "compressed layer without compressor weights");
    A.comp = up_compressor(U, *a.compressor, ratio);
  }
  if (kind == AttnKind::kCSA) {
    DI_CHECK(a.indexer.has_value(), "CSA layer without indexer weights");
    A.icomp = up_compressor(U, a.indexer->compressor, ratio);
    A.index_wq_b = up_dense(U, {&a.indexer->wq_b}, "indexer wq_b");
    A.index_weights = up_linear(U, a.indexer->weights_proj);
  }
  const MoEWeights& m = lw.ffn;
  L.ffn.gate = up_linear(U, plain(m.gate));
  L.ffn.bias = up_f32(u, m.bias);
  if (m.tid2eid.defined()) {
    Tensor t = m.tid2eid.to_f32();  // ids < 2^24: exact
    std::vector<int32_t> ids(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) ids[size_t(i)] = int32_t(t.data<float>()[i]);
    L.ffn.tid2eid = u.put(ids.data(), ids.size() * sizeof(int32_t));
    L.ffn.tid2eid_rows = t.size(0);
  }
  const size_t before = u.done();
  up_routed(U, m, L.ffn, layer);
  U.expert_bytes += u.done() - before;
  L.ffn.shared = {up_dense(U, {&m.shared.w1, &m.shared.w3}, "shared expert w1|w3"),
                  up_dense(U, {&m.shared.w2}, "shared expert w2")};
  return L;
}

std::atomic<int64_t> g_last_kept{0}, g_last_dequantised{0};
std::vector<float> inv_freq_for(const RopeParams& p, int64_t rope_dim) {
  if (!p.yarn) return ops::cpu::rope_inv_freq(p.theta, rope_dim, nullptr);
  ops::cpu::YarnScaling y{p.factor, double(p.original_max_position), p.beta_fast, p.beta_slow};
  return ops::cpu::rope_inv_freq(p.theta, rope_dim, &y);
}
}  // namespace

std::pair<int64_t, int64_t> last_upload_dense_fp8() { return {g_last_kept.load(), g_last_dequantised.load()}; }

GpuWeights upload_weights(const DeepseekV4Weights& w, const DeepseekV4Config& cfg, DType linear_dtype,
                          size_t planned_bytes, bool progress, cudaStream_t stream) {
  DI_CHECK(linear_dtype == DType::kBF16 || linear_dtype == DType::kF32, "upload_weights: linear dtype ",
           dtype_name(linear_dtype), " (bf16 or f32)");
  Uploader u(planned_bytes, progress, stream);
  const Numerics mode = linear_dtype == DType::kF32 ? Numerics::kExact : Numerics::kBf16;
  Up U{u, cfg, linear_dtype, device_expert_format(cfg, mode), device_dense_fp8(cfg, mode)};
  GpuWeights g;
  g.inv_freq_main = up_vec(u, inv_freq_for(cfg.rope, cfg.rope_head_dim));
  g.inv_freq_compress = up_vec(u, inv_freq_for(cfg.compress_rope, cfg.rope_head_dim));
  g.embed = up_linear(U, plain(w.embed));
  g.head = up_linear(U, plain(w.head));
  g.norm = up_f32(u, w.norm);
  g.hc_head = up_hc(u, w.hc_head.fn, w.hc_head.base, w.hc_head.scale);
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    g.layers.push_back(up_layer(U, w.layers[size_t(l)], cfg.layer_types[size_t(l)], cfg.compress_ratio[size_t(l)], g, l));
  g.bytes = u.done();
  g.expert_bytes = U.expert_bytes;
  g.dense_fp8 = U.fp8_kept;
  g.dense_fp8_dequantised = U.fp8_dequantised;
  g_last_kept = U.fp8_kept;
  g_last_dequantised = U.fp8_dequantised;
  u.finish();
  return g;
}

}  // namespace deepinfer::model::v4::gpu
