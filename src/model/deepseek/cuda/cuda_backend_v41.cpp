// The CUDA backend's DeepSeek-V4.1 pieces beyond the shared ops: the Engram rows a step gathers on
// the host (DeepseekV41Model::before_step -> stage_engram_rows), uploaded in the activation dtype
// (the wkv linear reads act() rows), and the gated injection (ops/cuda/engram.h, CPU twin
// ops/cpu/engram.h). Run by the V4.1 GPU model (v41_cuda_model.h; H200 parity: docs/MODEL-V41.md
// "Phase 4: the GPU").
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/numeric.h"
#include "core/parallel.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/cuda_backend.h"
#include "ops/cuda/engram.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;


// Fixed-shape steps (graphs) read the rows through a captured pointer and run padded rows past
// the step's tokens: each layer's buffer is sized at first use for the largest fixed step (and
// the step at hand), so decode/verify steps never move it; a longer general step that grows it
// drops the captured graphs (recaptured lazily, as after allocate_cache). Padded rows read
// whatever an earlier step left there (finite values; their outputs are never used).
void CudaBackend::stage_engram_rows(std::vector<std::vector<float>> rows) {
  const size_t L = rows.size();
  engram_dev_.resize(std::max(engram_dev_.size(), L));
  engram_host_.resize(std::max(engram_host_.size(), L));
  const size_t elem = act_ == DType::kF32 ? 4 : 2;
  for (size_t l = 0; l < L; ++l) {
    if (rows[l].empty()) continue;
    const int64_t width = weights_->refs.layers.at(l).engram.wkv.in;
    DI_CHECK(width > 0 && int64_t(rows[l].size()) % width == 0, "engram rows of layer ", l, ": ", rows[l].size(),
             " values, width ", width);
    const size_t need = std::max<size_t>(rows[l].size(), size_t(fixed_limits().max_tokens * width)) * elem;
    if (engram_dev_[l].size_bytes() < need) {
      const bool moved = engram_dev_[l].size_bytes() > 0;
      engram_dev_[l] = dc::DeviceBuffer();
      engram_dev_[l] = dc::DeviceBuffer(need, opts_.device);
      DI_CUDA_CHECK(cudaMemsetAsync(engram_dev_[l].data(), 0, need, stream_.get()));
      if (moved) {
        graphs_.clear();
        warmed_.clear();
      }
    }
  }
  for (size_t l = 0; l < L; ++l) {
    std::vector<char>& h = engram_host_[l];
    if (rows[l].empty()) {
      h.clear();
      continue;
    }
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

const void* CudaBackend::engram_rows(int64_t layer) const {
  if (layer < 0 || size_t(layer) >= engram_host_.size() || engram_host_[size_t(layer)].empty())
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
