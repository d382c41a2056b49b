// The CUDA backend's DeepSeek-V4.1 pieces beyond the shared ops: the Engram rows a step gathers on
// the host (DeepseekV41Model::before_step -> stage_engram_ids: uploaded in stored form and widened
// on the device to the activation dtype the wkv linear reads; stage_engram_rows, the host-widened
// f32 path, stays for DEEPINFER_ENGRAM_HOST_WIDEN=1), and the gated injection (ops/cuda/engram.h, CPU twin
// ops/cpu/engram.h). Run by the V4.1 GPU model (v41_cuda_model.h; H200 parity: docs/MODEL-V41.md
// "Phase 4: the GPU").
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/numeric.h"
#include "core/parallel.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/cuda_backend.h"
#include "model/deepseek_v41/engram_rows.h"
#include "ops/cuda/engram.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;


// Fixed-shape steps (graphs) read the rows through a captured pointer and run padded rows past
// the step's tokens: each layer's buffer is sized at first use for the largest fixed step (and
// the step at hand), so decode/verify steps never move it; a longer general step that grows it
// drops the captured graphs (recaptured lazily, as after allocate_cache). Padded rows read
// whatever an earlier step left there (finite values; their outputs are never used).
void CudaBackend::reserve_engram_rows(size_t l, int64_t values) {
  const int64_t width = weights_->refs.layers.at(l).engram.wkv.in;
  DI_CHECK(width > 0 && values % width == 0, "engram rows of layer ", l, ": ", values, " values, width ", width);
  const size_t elem = act_ == DType::kF32 ? 4 : 2;
  const size_t need = std::max<size_t>(size_t(values), size_t(fixed_limits().max_tokens * width)) * elem;
  if (engram_dev_[l].size_bytes() >= need) return;
  const bool moved = engram_dev_[l].size_bytes() > 0;
  engram_dev_[l] = dc::DeviceBuffer();
  engram_dev_[l] = dc::DeviceBuffer(need, opts_.device);
  DI_CUDA_CHECK(cudaMemsetAsync(engram_dev_[l].data(), 0, need, stream_.get()));
  if (moved) {
    graphs_.clear();
    warmed_.clear();
  }
}

void CudaBackend::stage_engram_rows(std::vector<std::vector<float>> rows) {
  const size_t L = rows.size();
  engram_dev_.resize(std::max(engram_dev_.size(), L));
  engram_host_.resize(std::max(engram_host_.size(), L));
  engram_staged_.assign(std::max(engram_staged_.size(), L), 0);
  const size_t elem = act_ == DType::kF32 ? 4 : 2;
  for (size_t l = 0; l < L; ++l)
    if (!rows[l].empty()) reserve_engram_rows(l, int64_t(rows[l].size()));
  for (size_t l = 0; l < L; ++l) {
    std::vector<char>& h = engram_host_[l];
    if (rows[l].empty()) {
      h.clear();
      continue;
    }
    engram_staged_[l] = int64_t(rows[l].size());
    h.resize(rows[l].size() * elem);
    if (act_ == DType::kF32) {
      std::memcpy(h.data(), rows[l].data(), h.size());
    } else {
      DI_CHECK(act_ == DType::kBF16, "engram rows in ", dtype_name(act_));
      uint16_t* o = reinterpret_cast<uint16_t*>(h.data());
      const float* in = rows[l].data();
      const int64_t n = int64_t(rows[l].size());
      constexpr int64_t kChunk = 1 << 15;  // a prefill's rows are tens of millions of values
      parallel_for(0, (n + kChunk - 1) / kChunk, [&](int64_t ch) {
        for (int64_t i = ch * kChunk, e = std::min(n, i + kChunk); i < e; ++i) o[i] = f32_to_bf16(in[i]);
      });
    }
    // Stream-ordered after the previous step's reads; pageable source, so the call returns once
    // the bytes are staged (the host copy may change afterwards).
    dc::copy_h2d(engram_dev_[l].data(), h.data(), h.size(), stream_.get(), false);
  }
}

// The device-widen path (issue #13 item 5): a prefill of 4,096 tokens gathers 98K rows per Engram
// layer; widened to f32 on the host they were 100 MB written + 50 MB of bf16 uploaded from pageable
// memory, where the stored rows are 25 MB of FP8 codes + 0.8 MB of scales. Here each layer's rows
// are copied in stored form into pinned memory, uploaded asynchronously (the next layer's gather
// overlaps the copy) and widened on the stream (ops/cuda engram_widen, bit-identical to the host
// widen). DEEPINFER_ENGRAM_WIDEN=host (or DEEPINFER_ENGRAM_HOST_WIDEN=1) keeps the host path,
// =device takes this one; unset, kEngramDeviceWidenByDefault decides.
// Off until a device run has checked the staging (session 16 had no GPU): opt in with =device.
constexpr bool kEngramDeviceWidenByDefault = false;

bool CudaBackend::stage_engram_ids(const std::vector<EngramStepIds>& layers) {
  static const bool device_widen = [] {
    const char* w = std::getenv("DEEPINFER_ENGRAM_WIDEN");
    const char* h = std::getenv("DEEPINFER_ENGRAM_HOST_WIDEN");  // = DEEPINFER_ENGRAM_WIDEN=host
    if (w && *w) {
      const std::string v(w);
      if (v != "device" && v != "host")
        DI_THROW(ConfigError, "DEEPINFER_ENGRAM_WIDEN=", v, ": expected device or host");
      return v == "device";
    }
    if (h && *h) {
      if (std::string(h) != "0" && std::string(h) != "1")
        DI_THROW(ConfigError, "DEEPINFER_ENGRAM_HOST_WIDEN=", h, ": expected 0 or 1");
      if (std::string(h) == "1") return false;
    }
    return kEngramDeviceWidenByDefault;
  }();
  if (!device_widen) return false;
  DI_CHECK(act_ == DType::kBF16 || act_ == DType::kF32, "engram rows in ", dtype_name(act_));
  const size_t L = layers.size();
  engram_dev_.resize(std::max(engram_dev_.size(), L));
  engram_host_.resize(std::max(engram_host_.size(), L));
  engram_staged_.assign(std::max(engram_staged_.size(), L), 0);
  engram_pinned_.resize(std::max(engram_pinned_.size(), L));
  while (engram_uploaded_.size() < L) engram_uploaded_.emplace_back(false);
  engram_upload_pending_.resize(std::max(engram_upload_pending_.size(), L), false);
  const auto scales_at = [](size_t values_bytes) { return (values_bytes + 255) / 256 * 256; };
  size_t dev_need = 0;
  for (size_t l = 0; l < L; ++l) {
    if (!layers[l].table || layers[l].ids.empty()) continue;
    const EngramRef& g = *layers[l].table;
    const int64_t n = int64_t(layers[l].ids.size());
    reserve_engram_rows(l, n * g.dim);
    dev_need = std::max(dev_need, scales_at(v41::engram_stored_values_bytes(g, n)) + v41::engram_stored_scales_bytes(g, n));
  }
  // Both staging buffers grow by at least half when they grow (prefill chunks of rising length
  // would otherwise reallocate, and a cudaFree / cudaFreeHost waits for the device, every step).
  const auto grown = [](size_t have, size_t need) { return have == 0 ? need : std::max(need, have + have / 2); };
  if (engram_stored_dev_.size_bytes() < dev_need) {
    const size_t bytes = grown(engram_stored_dev_.size_bytes(), dev_need);
    engram_stored_dev_ = dc::DeviceBuffer();  // cudaFree waits for the earlier widens that read it
    engram_stored_dev_ = dc::DeviceBuffer(bytes, opts_.device);
  }
  for (size_t l = 0; l < L; ++l) {
    engram_host_[l].clear();
    if (!layers[l].table || layers[l].ids.empty()) continue;
    const EngramRef& g = *layers[l].table;
    const int64_t n = int64_t(layers[l].ids.size());
    const size_t vb = v41::engram_stored_values_bytes(g, n), off = scales_at(vb);
    const size_t total = off + v41::engram_stored_scales_bytes(g, n);
    // The previous step's upload from this layer's pinned rows must be done before they change.
    if (engram_upload_pending_[l]) engram_uploaded_[l].synchronize();
    engram_upload_pending_[l] = false;
    if (engram_pinned_[l].size_bytes() < total) {
      const size_t bytes = grown(engram_pinned_[l].size_bytes(), total);
      engram_pinned_[l] = dc::PinnedBuffer();
      engram_pinned_[l] = dc::PinnedBuffer(bytes);
    }
    auto* host = engram_pinned_[l].as<uint8_t>();
    v41::engram_gather_stored(g, layers[l].ids.data(), n, host, host + off);
    auto* dev = engram_stored_dev_.as<uint8_t>();
    // Timed as an op (bench-flash --breakdown): the upload and the widen are step-stream time.
    const OpTimer::Scope op_scope_ = op_scope("engram_upload_widen");
    dc::copy_h2d(dev, host, total, stream_.get(), false);
    engram_uploaded_[l].record(stream_.get());
    engram_upload_pending_[l] = true;
    ops::cuda::engram_widen({.values = dev, .scales = dev + off, .in = g.table_dtype, .out = engram_dev_[l].data(),
                             .out_dtype = act_, .rows = n, .dim = g.dim},
                            stream_.get());
    engram_staged_[l] = n * g.dim;
  }
  return true;
}

const void* CudaBackend::engram_rows(int64_t layer) const {
  if (layer < 0 || size_t(layer) >= engram_staged_.size() || engram_staged_[size_t(layer)] == 0)
    DI_THROW(InternalError, "cuda backend: no Engram rows staged for layer ", layer);
  return engram_dev_[size_t(layer)].data();
}

void CudaBackend::engram_inject(float* x, const float* kv, const float* w, int64_t tokens) {
  const Dims& g = arch_.dims;
  ops::cuda::engram_inject({.x = x, .x_stride = g.streams * g.hidden, .kv = kv, .kv_stride = (g.streams + 1) * g.hidden,
                            .w = w, .dead = nullptr, .tokens = tokens, .n = int(g.streams), .dim = g.hidden,
                            .eps = g.eps},
                           stream_.get());
}

}  // namespace deepinfer::model::ds::cuda
