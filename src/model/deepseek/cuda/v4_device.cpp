#include "model/deepseek/cuda/v4_device.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/prepare.h"
#include "ops/cuda/gemm_fp8w.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;
using v4::EntryKind;
using v4::LinearRole;
using v4::TensorEntry;
using v4::TensorPart;
using v4::WeightFormat;

DeviceFormats v4_device_formats(const v4::DeepseekV4Config& cfg) {
  return {.dense = cfg.dense_format, .experts = cfg.expert_format, .fp8_block = cfg.fp8_block,
          .fp4_block = cfg.fp4_block, .hidden = cfg.hidden_size, .moe_inter = cfg.moe_intermediate_size,
          .n_experts = cfg.n_routed_experts, .rope_dim = cfg.rope_head_dim, .family = "deepseek_v4"};
}

WeightFormat device_expert_format(const DeviceFormats& d, Numerics numerics, ExpertPath experts) {
  const WeightFormat f = d.experts;
  if (numerics == Numerics::kExact || experts != ExpertPath::kNative) return WeightFormat::kBF16;
  if (f != WeightFormat::kFP4 && f != WeightFormat::kFP8Block) return WeightFormat::kBF16;
  if (d.hidden % 32 || d.moe_inter % 32) return WeightFormat::kBF16;
  if (f == WeightFormat::kFP4 && d.fp4_block != 32) return WeightFormat::kBF16;
  if (f == WeightFormat::kFP8Block && d.fp8_block != 128) return WeightFormat::kBF16;
  return f;
}

bool device_dense_fp8(const DeviceFormats& d, Numerics numerics, DensePath dense) {
  return numerics != Numerics::kExact && dense == DensePath::kNative && d.dense == WeightFormat::kFP8Block &&
         (d.fp8_block == 128 || d.fp8_block == 32);
}

WeightFormat v4_expert_format(const v4::DeepseekV4Config& cfg, Numerics numerics, ExpertPath experts) {
  return device_expert_format(v4_device_formats(cfg), numerics, experts);
}
bool v4_dense_fp8(const v4::DeepseekV4Config& cfg, Numerics numerics, DensePath dense) {
  return device_dense_fp8(v4_device_formats(cfg), numerics, dense);
}

int64_t expert_matrix_bytes(WeightFormat f, int64_t n, int64_t k, int64_t elem_bytes) {
  if (f == WeightFormat::kFP4) return n * (k / 2) + n * ((k + 31) / 32);
  if (f == WeightFormat::kFP8Block) return n * k + n * ((k + 127) / 128);
  return n * k * elem_bytes;
}

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Rows per FP8 scale row of a dense entry stacked from its parts: the block edge (128 / 32), or 16
// when a part before the last is not block-row aligned (its grid rows are then repeated per 16 rows).
int64_t dense_scale_rows(const TensorEntry& e, int64_t block) {
  for (size_t i = 0; i + 1 < e.parts.size(); ++i)
    if (e.parts[i].shape[0] % block) return 16;
  return block;
}
int64_t dense_fp8_bytes(const TensorEntry& e, int64_t block) {
  const int64_t rows = e.rows(), cols = e.cols(), sr = dense_scale_rows(e, block);
  return rows * cols + (rows + sr - 1) / sr * ((cols + block - 1) / block);
}

}  // namespace

// ---- the upload ----

// Uploads host bytes, counting them for the progress bar (one line, redrawn every 2%).
class Uploader {
 public:
  Uploader(size_t planned, bool progress, int device, cudaStream_t s)
      : planned_(planned), progress_(progress), device_(device), stream_(s) {}
  ~Uploader() { finish(); }
  dc::DeviceBuffer alloc(size_t n) { return dc::DeviceBuffer(n == 0 ? 16 : n, device_); }
  void put_at(void* dst, const void* src, size_t n) {
    if (n) dc::copy_h2d(dst, src, n, stream_, /*sync=*/true);
    done_ += n;
    draw();
  }
  dc::DeviceBuffer put(const void* src, size_t n) {
    dc::DeviceBuffer b = alloc(n);
    put_at(b.data(), src, n);
    return b;
  }
  size_t done() const { return done_; }
  // A page-locked host buffer of at least n bytes, reused between calls (grown when needed): the
  // exact mode's f32 experts are dequantised straight into it and copied from it, so a 50 GiB
  // upload neither page-faults fresh host memory per expert nor copies through pageable memory.
  void* staging(size_t n) {
    if (stage_.size_bytes() < n) stage_ = dc::PinnedBuffer(std::max(n, stage_.size_bytes() * 2));
    return stage_.data();
  }
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
    if ((pct < drawn_ + 2 && pct != 100) || pct == drawn_) return;
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
  int device_;
  cudaStream_t stream_;
  dc::PinnedBuffer stage_;
};

namespace {

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

// e8m0 grid of a dense FP8 linear ([ceil(out/block), ceil(in/block)]), or nullopt when gemm_fp8w
// cannot read it as stored: not FP8, input width not a multiple of 16, a scale not a power of two or
// above 2^(kFp8wMaxScaleExp-127).
std::optional<std::vector<uint8_t>> dense_fp8_grid(const v4::Linear& l, int64_t block) {
  if (l.format != WeightFormat::kFP8Block || !l.weight.defined() || l.weight.dim() != 2 ||
      l.weight.dtype() != DType::kF8E4M3 || !l.scale.defined() || l.scale.dim() != 2)
    return std::nullopt;
  const int64_t out = l.weight.size(0), in = l.weight.size(1);
  if (in % 16 || l.scale.size(0) != (out + block - 1) / block || l.scale.size(1) != (in + block - 1) / block)
    return std::nullopt;
  std::optional<std::vector<uint8_t>> grid = e8m0_grid(l.scale);
  if (!grid) return std::nullopt;
  for (uint8_t e : *grid)
    if (e > ops::cuda::kFp8wMaxScaleExp) return std::nullopt;
  return grid;
}

// One routed-expert matrix's release bytes (weights as stored, e8m0 scales per row: FP4 [out, in/32];
// FP8's 128x128 grid repeated for each row). False when it is not in format `f` or a scale is not a
// power of two: the caller then dequantises the layer's experts.
bool native_bytes(const v4::Linear& l, WeightFormat f, std::vector<uint8_t>* w, std::vector<uint8_t>* s) {
  const DType wd = f == WeightFormat::kFP4 ? DType::kFP4E2M1 : DType::kF8E4M3;
  if (l.format != f || !l.weight.defined() || l.weight.dim() != 2 || l.weight.dtype() != wd || !l.scale.defined() ||
      l.scale.dim() != 2)
    return false;
  const int64_t out = l.weight.size(0), in = l.weight.size(1);
  const int64_t bi = f == WeightFormat::kFP4 ? 32 : 128, bo = f == WeightFormat::kFP4 ? 1 : 128;
  if (in % 32 || l.scale.size(0) != (out + bo - 1) / bo || l.scale.size(1) != (in + bi - 1) / bi) return false;
  const std::optional<std::vector<uint8_t>> grid = e8m0_grid(l.scale);
  if (!grid) return false;
  if (!w) return true;
  const Tensor wc = l.weight.contiguous();
  const uint8_t* pw = static_cast<const uint8_t*>(wc.raw_data());
  w->insert(w->end(), pw, pw + wc.nbytes());
  const int64_t sc = l.scale.size(1);
  for (int64_t r = 0; r < out; ++r) {
    const uint8_t* row = grid->data() + (r / bo) * sc;
    s->insert(s->end(), row, row + sc);
  }
  return true;
}

class TableUpload {
 public:
  TableUpload(const DeviceFormats& f, const CudaModelOptions& o, Uploader& u, GpuWeightStore& st)
      : f_(f), u_(u), st_(st), dt_(storage_dtype(o.storage_numerics())),
        experts_(device_expert_format(f, o.storage_numerics(), o.experts)),
        dense_fp8_(device_dense_fp8(f, o.storage_numerics(), o.dense)), host_routed_(o.experts == ExpertPath::kHostRouted) {}

  void run(const v4::TensorTable& table, const std::vector<ds::MoeRef*>& moes) {
    const auto& E = table.entries;
    for (size_t i = 0; i < E.size();) {
      if (E[i].role == LinearRole::kExpert) {  // all routed experts of a layer at once
        size_t j = i;
        while (j < E.size() && E[j].role == LinearRole::kExpert && E[j].layer == E[i].layer) ++j;
        experts(E, i, j, E[i].layer);
        i = j;
        continue;
      }
      entry(E[i++]);
    }
    for (ds::MoeRef* m : moes) m->host_routed = host_routed_;
  }

 private:
  // dt_ [out, in] host copy of a part in any stored format (f32: the exact dequantised values).
  Tensor host_part(const TensorPart& p) const {
    if (!p.lin) return dt_ == DType::kF32 ? p.t->to_f32().contiguous() : p.t->to(dt_).contiguous();
    const v4::Linear& l = *p.lin;
    DI_CHECK(l.weight.defined() && l.weight.dim() == 2, "linear '", p.name, "' missing");
    if (l.format == WeightFormat::kBF16 && l.weight.dtype() == dt_) return l.weight.contiguous();
    Tensor f = l.dequantize_f32(f_.fp8_block, f_.fp4_block).contiguous();
    return dt_ == DType::kF32 ? f : f.to(dt_);
  }
  // The entry's parts stacked by rows in dt_ (plain storage).
  ds::LinearRef plain(const TensorEntry& e) {
    std::vector<uint8_t> buf;
    for (const TensorPart& p : e.parts) {
      const Tensor h = host_part(p);
      const uint8_t* b = static_cast<const uint8_t*>(h.raw_data());
      buf.insert(buf.end(), b, b + h.nbytes());
    }
    st_.buffers.push_back(u_.put(buf.data(), buf.size()));
    return {.w = st_.buffers.back().data(), .dtype = dt_, .out = e.rows(), .in = e.cols()};
  }
  // Dense FP8 as stored when the mode and every part allow it, else plain (with a warning when
  // the mode wanted FP8).
  ds::LinearRef dense(const TensorEntry& e) {
    if (dense_fp8_) {
      bool ok = true;
      std::vector<std::optional<std::vector<uint8_t>>> grids;
      for (size_t i = 0; i < e.parts.size(); ++i) {
        grids.push_back(e.parts[i].lin ? dense_fp8_grid(*e.parts[i].lin, f_.fp8_block) : std::nullopt);
        ok = ok && grids.back().has_value();
        if (i + 1 < e.parts.size()) ok = ok && e.parts[i].shape[0] % 16 == 0;
      }
      if (ok) {
        const int64_t in = e.cols(), b = f_.fp8_block, kb = (in + b - 1) / b, sr = dense_scale_rows(e, b);
        std::vector<uint8_t> w, s;
        for (size_t i = 0; i < e.parts.size(); ++i) {
          const Tensor wc = e.parts[i].lin->weight.contiguous();
          const uint8_t* pw = static_cast<const uint8_t*>(wc.raw_data());
          w.insert(w.end(), pw, pw + wc.nbytes());
          const std::vector<uint8_t>& g = *grids[i];
          if (sr == b) {
            s.insert(s.end(), g.begin(), g.end());
          } else {  // one grid row per 16 rows, copied from the block-row holding them
            for (int64_t r = 0; r < e.parts[i].shape[0]; r += 16)
              s.insert(s.end(), g.begin() + (r / b) * kb, g.begin() + (r / b + 1) * kb);
          }
        }
        st_.buffers.push_back(u_.put(w.data(), w.size()));
        const void* wp = st_.buffers.back().data();
        st_.buffers.push_back(u_.put(s.data(), s.size()));
        st_.dense_fp8++;
        return {.w = wp, .scale = st_.buffers.back().data(), .dtype = DType::kF8E4M3, .out = e.rows(), .in = in,
                .scale_rows = sr, .scale_cols = b};
      }
      bool any_fp8 = false;
      for (const TensorPart& p : e.parts) any_fp8 = any_fp8 || (p.lin && p.lin->format == WeightFormat::kFP8Block);
      if (any_fp8) {
        st_.dense_fp8_dequantised++;
        DI_WARN(f_.family, " cuda: ", e.name(), " cannot stay FP8 on the device (scales not powers of two <= 2^7, "
                "input width not a multiple of 16, or stacked parts not 16-row aligned); dequantising it to ",
                dtype_name(dt_), " (more memory than planned)");
      }
    }
    return plain(e);
  }
  void entry(const TensorEntry& e) {
    switch (e.kind) {
      case EntryKind::kLinear:
        *e.lin = e.role == LinearRole::kDense ? dense(e) : plain(e);
        return;
      case EntryKind::kFloat: {
        const Tensor h = e.parts[0].t->to_f32().contiguous();
        st_.buffers.push_back(u_.put(h.raw_data(), h.nbytes()));
        *e.vec = {st_.buffers.back().as<const float>(), h.numel()};
        return;
      }
      case EntryKind::kTable: {
        const Tensor t = e.parts[0].t->to_f32();  // ids < 2^24: exact
        std::vector<int32_t> ids(size_t(t.numel()));
        for (int64_t i = 0; i < t.numel(); ++i) ids[size_t(i)] = int32_t(t.data<float>()[i]);
        st_.buffers.push_back(u_.put(ids.data(), ids.size() * sizeof(int32_t)));
        *e.table = st_.buffers.back().as<const int32_t>();
        *e.table_rows = t.size(0);
        return;
      }
    }
  }
  // The routed experts [i, j) of one layer in one allocation: weights, then scales (native), or
  // the dequantised storage dtype when any expert cannot stay as released.
  void experts(const std::vector<TensorEntry>& E, size_t i, size_t j, int32_t layer) {
    const size_t before = u_.done();
    bool native = experts_ == WeightFormat::kFP4 || experts_ == WeightFormat::kFP8Block;
    for (size_t k = i; native && k < j; ++k)
      for (const TensorPart& p : E[k].parts) native = native && p.lin && native_bytes(*p.lin, experts_, nullptr, nullptr);
    if (!native && (experts_ == WeightFormat::kFP4 || experts_ == WeightFormat::kFP8Block))
      DI_WARN(f_.family, " cuda: layer ", layer, " routed experts are not all ",
              (experts_ == WeightFormat::kFP4 ? "FP4" : "FP8"), " with power-of-two scales; dequantising them to ",
              dtype_name(dt_), " (more memory than planned)");
    const WeightFormat f = native ? experts_ : WeightFormat::kBF16;
    size_t wbytes = 0, sbytes = 0;
    for (size_t k = i; k < j; ++k) {
      const int64_t all = expert_matrix_bytes(f, E[k].rows(), E[k].cols(), int64_t((dtype_bits(dt_) / 8)));
      const int64_t w = native ? (f == WeightFormat::kFP4 ? E[k].numel() / 2 : E[k].numel()) : all;
      wbytes += align256(size_t(w));
      sbytes += align256(size_t(all - w));
    }
    st_.buffers.push_back(u_.alloc(wbytes + sbytes));
    char* base = st_.buffers.back().as<char>();
    size_t woff = 0, soff = wbytes;
    const DType d = f == WeightFormat::kFP4 ? DType::kFP4E2M1 : f == WeightFormat::kFP8Block ? DType::kF8E4M3 : dt_;
    for (size_t k = i; k < j; ++k) {
      const TensorEntry& e = E[k];
      std::vector<uint8_t> w, s;
      if (native) {
        for (const TensorPart& p : e.parts) native_bytes(*p.lin, f, &w, &s);
      } else if (dt_ == DType::kF32) {  // exact: dequantised into the pinned staging buffer
        const size_t n = size_t(e.numel()) * sizeof(float);
        float* st = static_cast<float*>(u_.staging(n));
        int64_t off = 0;
        for (const TensorPart& p : e.parts) {
          DI_CHECK(off + (p.lin ? p.lin->weight.numel() : p.t->numel()) <= e.numel(), "expert '", e.name(),
                   "' parts overflow it");
          if (p.lin) {
            p.lin->dequantize_f32_into(st + off, f_.fp8_block, f_.fp4_block);
            off += p.lin->weight.numel();
          } else {
            const Tensor h = host_part(p);
            std::memcpy(st + off, h.raw_data(), h.nbytes());
            off += h.numel();
          }
        }
        DI_CHECK(size_t(off) * sizeof(float) == n, "expert '", e.name(), "' parts do not fill it");
        u_.put_at(base + woff, st, n);
        *e.lin = {.w = base + woff, .dtype = d, .out = e.rows(), .in = e.cols()};
        woff += align256(n);
        continue;
      } else {
        for (const TensorPart& p : e.parts) {
          const Tensor h = host_part(p);
          const uint8_t* b = static_cast<const uint8_t*>(h.raw_data());
          w.insert(w.end(), b, b + h.nbytes());
        }
      }
      u_.put_at(base + woff, w.data(), w.size());
      ds::LinearRef r{.w = base + woff, .dtype = d, .out = e.rows(), .in = e.cols()};
      woff += align256(w.size());
      if (!s.empty()) {
        u_.put_at(base + soff, s.data(), s.size());
        r.scale = base + soff;
        soff += align256(s.size());
      }
      *e.lin = r;
    }
    st_.expert_bytes += u_.done() - before;
    expert_layers_.push_back({layer, d});
  }

 public:
  struct ExpertLayer {
    int32_t layer;
    DType dtype;
  };
  std::vector<ExpertLayer> expert_layers_;

 private:
  const DeviceFormats& f_;
  Uploader& u_;
  GpuWeightStore& st_;
  DType dt_;
  WeightFormat experts_;
  bool dense_fp8_, host_routed_;
};

// Device pointer tables of one layer's experts for the device-side MoE (moe_decode, grouped_gemm).
void expert_tables(ds::MoeRef& M, DType dtype, Uploader& u, GpuWeightStore& st) {
  std::vector<const void*> w13, w2, s13, s2;
  for (const auto& e : M.experts) {
    w13.push_back(e.w13.w);
    w2.push_back(e.w2.w);
    s13.push_back(e.w13.scale);
    s2.push_back(e.w2.scale);
  }
  if (w13.empty()) w13 = w2 = s13 = s2 = {nullptr};
  auto put = [&](const std::vector<const void*>& v) {
    st.buffers.push_back(u.put(v.data(), v.size() * sizeof(void*)));
    return st.buffers.back().data();
  };
  M.tables.w13 = static_cast<const void* const*>(put(w13));
  M.tables.w2 = static_cast<const void* const*>(put(w2));
  M.tables.w13_scale = static_cast<const uint8_t* const*>(put(s13));
  M.tables.w2_scale = static_cast<const uint8_t* const*>(put(s2));
  M.tables.dtype = dtype;
}
}  // namespace

size_t device_weight_bytes(const DeviceFormats& f, const v4::TensorTable& table, const CudaModelOptions& o) {
  const Numerics n = o.storage_numerics();
  const size_t lb = storage_bytes(n);
  const WeightFormat ef = device_expert_format(f, n, o.experts);
  const bool fp8 = device_dense_fp8(f, n, o.dense);
  size_t bytes = size_t(f.rope_dim) * sizeof(float);  // two rope tables of rope_dim/2
  int64_t expert_layers = 0, last_layer = -2;
  for (const TensorEntry& e : table.entries) {
    switch (e.kind) {
      case EntryKind::kFloat: case EntryKind::kTable: bytes += size_t(e.numel()) * 4; break;
      case EntryKind::kLinear:
        if (e.role == LinearRole::kExpert) {
          bytes += size_t(expert_matrix_bytes(ef, e.rows(), e.cols(), int64_t(lb)));
          if (e.layer != last_layer) ++expert_layers, last_layer = e.layer;
        } else if (e.role == LinearRole::kDense && fp8) {
          bytes += size_t(dense_fp8_bytes(e, f.fp8_block));
        } else {
          bytes += size_t(e.numel()) * lb;
        }
        break;
    }
  }
  return bytes + size_t(expert_layers) * 4 * size_t(f.n_experts) * sizeof(void*);
}

size_t v4_device_weight_bytes(const v4::DeepseekV4Config& cfg, const v4::TensorTable& table,
                              const CudaModelOptions& o) {
  return device_weight_bytes(v4_device_formats(cfg), table, o);
}

void device_fp8_workspace(const DeviceFormats& f, const v4::TensorTable& table, const CudaModelOptions& o,
                          int64_t tokens, size_t* fp8_ws_bytes, size_t* wdq_bytes) {
  *fp8_ws_bytes = *wdq_bytes = 0;
  constexpr int kMaxSms = 256;  // SM count the K-split workspace is sized for
  if (tokens > 0 && o.batch_invariant) {  // every product through gemm_fp8w, any M (64-row chunks)
    for (const TensorEntry& e : table.entries) {
      if (e.kind != EntryKind::kLinear || e.role == LinearRole::kExpert || e.role == LinearRole::kEmbed) continue;
      *fp8_ws_bytes = std::max(*fp8_ws_bytes,
                               ops::cuda::fp8w_workspace_bytes(tokens, e.rows() / e.groups, e.cols(), e.groups, kMaxSms));
    }
    return;
  }
  if (tokens <= 0 || !device_dense_fp8(f, o.storage_numerics(), o.dense)) return;
  for (const TensorEntry& e : table.entries) {
    if (e.kind != EntryKind::kLinear || e.role != LinearRole::kDense) continue;
    const int64_t n = e.rows() / e.groups, k = e.cols();
    if (tokens <= kDenseFp8PrefillM)
      *fp8_ws_bytes = std::max(*fp8_ws_bytes, ops::cuda::fp8w_workspace_bytes(tokens, n, k, e.groups, kMaxSms));
    else
      *wdq_bytes = std::max(*wdq_bytes, size_t(e.rows() * k) * 2);
  }
}

void v4_fp8_workspace(const v4::DeepseekV4Config& cfg, const v4::TensorTable& table, const CudaModelOptions& o,
                      int64_t tokens, size_t* fp8_ws_bytes, size_t* wdq_bytes) {
  device_fp8_workspace(v4_device_formats(cfg), table, o, tokens, fp8_ws_bytes, wdq_bytes);
}

DeviceUpload::DeviceUpload(const DeviceFormats& f, const CudaModelOptions& o, size_t planned_bytes,
                           cudaStream_t stream, GpuWeightStore& st)
    : u_(std::make_unique<Uploader>(planned_bytes, o.progress, o.device, stream)), f_(f), o_(o), st_(st) {}

DeviceUpload::~DeviceUpload() = default;

void DeviceUpload::entries(const v4::TensorTable& table, const std::function<ds::MoeRef&(int32_t layer)>& moe_of,
                           const std::vector<ds::MoeRef*>& all_moes) {
  TableUpload up(f_, o_, *u_, st_);
  up.run(table, all_moes);
  for (const auto& x : up.expert_layers_) expert_tables(moe_of(x.layer), x.dtype, *u_, st_);
}

ds::VecRef DeviceUpload::floats(const float* p, int64_t n) {
  st_.buffers.push_back(u_->put(p, size_t(n) * sizeof(float)));
  return {st_.buffers.back().as<const float>(), n};
}

void DeviceUpload::finish() {
  st_.bytes = u_->done();
  u_->finish();
}

std::unique_ptr<GpuWeightStore> upload_v4(const v4::DeepseekV4Config& cfg, const ModelPlan& plan,
                                          const v4::DeepseekV4Weights& canon, const CudaModelOptions& o,
                                          size_t planned_bytes, cudaStream_t stream) {
  auto st = std::make_unique<GpuWeightStore>();
  DeviceUpload up(v4_device_formats(cfg), o, planned_bytes, stream, *st);
  // The table points into the canonical views (read only here) and the store's refs.
  v4::TensorTable both = v4::v4_tensor_table(cfg, plan, const_cast<v4::DeepseekV4Weights*>(&canon), &st->refs);
  if (o.expert_shard)  // another rank's experts stay undefined (null in the device pointer tables)
    v4::keep_expert_shard(both, *o.expert_shard, int32_t(cfg.n_routed_experts), int64_t(plan.layers.size()));
  std::vector<ds::MoeRef*> moes;
  for (auto& L : st->refs.layers) moes.push_back(&L.ffn);
  for (auto& M : st->refs.mtp) moes.push_back(&M.block.ffn);
  up.entries(
      both,
      [&](int32_t layer) -> ds::MoeRef& {
        const size_t L = size_t(layer);
        return L < st->refs.layers.size() ? st->refs.layers[L].ffn : st->refs.mtp[L - st->refs.layers.size()].block.ffn;
      },
      moes);
  const std::vector<float> main = v4::inv_freq_main(cfg), comp = v4::inv_freq_compress(cfg);
  st->refs.inv_freq_main = up.floats(main.data(), int64_t(main.size()));
  st->refs.inv_freq_compress = up.floats(comp.data(), int64_t(comp.size()));
  auto rope_of = [&](const LayerPlan& p) {
    return p.rope == RopeKind::kMain ? st->refs.inv_freq_main.p : st->refs.inv_freq_compress.p;
  };
  for (size_t l = 0; l < plan.layers.size(); ++l) st->refs.layers[l].attn.inv_freq = rope_of(plan.layers[l]);
  for (size_t k = 0; k < plan.drafter.size(); ++k) st->refs.mtp[k].block.attn.inv_freq = rope_of(plan.drafter[k]);
  up.finish();
  return st;
}

}  // namespace deepinfer::model::ds::cuda
