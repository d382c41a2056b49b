// The CUDA backend's routed experts as an ExpertWeightStore (expert_weights.h): EPLB on a sharded
// GPU model moves experts between ranks (ExpertParallel::move_weights: pack on the old holder,
// the group's all-to-all, adopt on the new one).
//
// An expert is four device regions as the upload left them (v4_device.h): w13's weights and its
// per-row scales, w2's weights and scales (no scales for bf16 / f32 experts). Its packed form is
// those regions back to back, in that order, copied through the host. Adopting writes the bytes
// into a freed expert's regions of the same layer when there is one (every expert of a layer has
// the same shape), else into a new allocation, then points the expert's refs and its entries of
// the layer's device pointer tables (what the grouped kernels and CUDA graphs read) at them. The
// upload's one-allocation-per-layer regions cannot be returned one expert at a time, so a released
// expert's regions go to the layer's free list: a rank's expert memory stays bounded by the most
// experts it held at once.
#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/cuda_backend.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;

namespace {
// Bytes of one expert matrix [n, k] stored as `dtype`: the weights, then the scales (e8m0 per
// row per 32 inputs for FP4, per 128 for FP8; none otherwise).
std::pair<int64_t, int64_t> matrix_bytes(DType dtype, int64_t n, int64_t k) {
  switch (dtype) {
    case DType::kFP4E2M1: return {n * (k / 2), n * ((k + 31) / 32)};
    case DType::kF8E4M3: return {n * k, n * ((k + 127) / 128)};
    default: return {int64_t(dtype_nbytes(dtype, n * k)), 0};
  }
}

// The four regions of an expert, in packed order.
struct Region {
  const void* LinearRef::*field;
  bool w13;
  bool scale;
};
constexpr Region kRegions[4] = {{&LinearRef::w, true, false}, {&LinearRef::scale, true, true},
                                {&LinearRef::w, false, false}, {&LinearRef::scale, false, true}};
}  // namespace

// How the layer's experts are stored: as a held expert says (every expert of a layer is stored
// alike), else as the layer's device tables record.
static DType expert_dtype(const MoeRef& M) {
  for (const ExpertRef& e : M.experts)
    if (e.w13.defined()) return e.w13.dtype;
  return M.tables.dtype;
}

MoeRef& CudaBackend::expert_layer(int64_t layer) const {
  std::vector<LayerRef>& layers = weights_->refs.layers;
  if (layer < 0 || layer >= int64_t(layers.size()))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " of ", layers.size());
  return layers[size_t(layer)].ffn;
}

const ExpertRef& CudaBackend::expert_ref(int64_t layer, int32_t expert) const {
  const MoeRef& M = expert_layer(layer);
  if (expert < 0 || expert >= int32_t(M.experts.size()))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " has no expert ", expert, " (", M.experts.size(),
             " experts)");
  return M.experts[size_t(expert)];
}

bool CudaBackend::holds_expert(int64_t layer, int32_t expert) const {
  const ExpertRef& e = expert_ref(layer, expert);
  return e.w13.defined() && e.w2.defined();
}

// Sizes of the four regions of one expert of `layer`, from the model's widths and the layer's format.
std::array<int64_t, 4> CudaBackend::expert_regions(int64_t layer) const {
  const MoeRef& M = expert_layer(layer);
  const int64_t I = arch_.dims.moe_inter, D = arch_.dims.hidden;
  const DType dt = expert_dtype(M);
  const auto [w13, s13] = matrix_bytes(dt, 2 * I, D);
  const auto [w2, s2] = matrix_bytes(dt, D, I);
  return {w13, s13, w2, s2};
}

int64_t CudaBackend::expert_bytes(int64_t layer) const {
  const std::array<int64_t, 4> r = expert_regions(layer);
  return r[0] + r[1] + r[2] + r[3];
}

void CudaBackend::pack_expert(int64_t layer, int32_t expert, std::span<std::byte> dst) const {
  if (!holds_expert(layer, expert))
    DI_THROW(InternalError, "expert store: layer ", layer, " expert ", expert, " is not held here, cannot send it");
  if (int64_t(dst.size()) != expert_bytes(layer))
    DI_THROW(InternalError, "expert store: pack buffer of ", dst.size(), " bytes, expert needs ", expert_bytes(layer));
  const ExpertRef& e = expert_ref(layer, expert);
  const std::array<int64_t, 4> sizes = expert_regions(layer);
  int64_t off = 0;
  for (int i = 0; i < 4; ++i) {
    const LinearRef& r = kRegions[i].w13 ? e.w13 : e.w2;
    const void* src = r.*kRegions[i].field;
    DI_CHECK(sizes[size_t(i)] == 0 || src, "expert store: layer ", layer, " expert ", expert, " region ", i, " unset");
    dc::copy_d2h(dst.data() + off, src, size_t(sizes[size_t(i)]), stream_.get(), false);
    off += sizes[size_t(i)];
  }
  stream_.synchronize();
}

void CudaBackend::adopt_expert(int64_t layer, int32_t expert, std::span<const std::byte> src) {
  if (holds_expert(layer, expert))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " expert ", expert, " is held already");
  if (int64_t(src.size()) != expert_bytes(layer))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " expert ", expert, " arrived with ", src.size(),
             " bytes, expected ", expert_bytes(layer));
  MoeRef& M = expert_layer(layer);
  const std::array<int64_t, 4> sizes = expert_regions(layer);
  std::array<void*, 4> at{};
  std::vector<std::array<void*, 4>>& spare = spare_experts_[layer];
  if (!spare.empty()) {
    at = spare.back();
    spare.pop_back();
  } else {
    deepinfer::cuda::DeviceBuffer b(size_t(expert_bytes(layer)) + 4 * 256, opts_.device);
    char* p = b.as<char>();
    for (int i = 0; i < 4; ++i) {
      at[size_t(i)] = sizes[size_t(i)] ? p : nullptr;
      p += (sizes[size_t(i)] + 255) / 256 * 256;  // each region 256-byte aligned, as uploaded
    }
    weights_->buffers.push_back(std::move(b));
  }
  int64_t off = 0;
  for (int i = 0; i < 4; ++i) {
    dc::copy_h2d(at[size_t(i)], src.data() + off, size_t(sizes[size_t(i)]), stream_.get(), false);
    off += sizes[size_t(i)];
  }
  // Every expert of a layer has the same shape and dtype: take them from the layer's format.
  const int64_t I = arch_.dims.moe_inter, D = arch_.dims.hidden;
  ExpertRef& e = M.experts[size_t(expert)];
  const DType dt = expert_dtype(M);
  e.w13 = {.w = at[0], .scale = at[1], .dtype = dt, .out = 2 * I, .in = D};
  e.w2 = {.w = at[2], .scale = at[3], .dtype = dt, .out = D, .in = I};
  set_expert_tables(M, expert);  // synchronizes: `src` is read before the call returns
}

void CudaBackend::release_expert(int64_t layer, int32_t expert) {
  if (!holds_expert(layer, expert))
    DI_THROW(InternalError, "expert store: layer ", layer, " expert ", expert, " is not held, cannot free it");
  MoeRef& M = expert_layer(layer);
  ExpertRef& e = M.experts[size_t(expert)];
  spare_experts_[layer].push_back({const_cast<void*>(e.w13.w), const_cast<void*>(e.w13.scale),
                                   const_cast<void*>(e.w2.w), const_cast<void*>(e.w2.scale)});
  e = ExpertRef{};
  set_expert_tables(M, expert);
}

// The expert's entries of the layer's device pointer tables (null for an expert not held here).
void CudaBackend::set_expert_tables(MoeRef& M, int32_t expert) {
  if (!M.tables.w13) return;  // a layer without device tables
  const ExpertRef& e = M.experts[size_t(expert)];
  const void* tables[4] = {M.tables.w13, M.tables.w13_scale, M.tables.w2, M.tables.w2_scale};
  const void* values[4] = {e.w13.w, e.w13.scale, e.w2.w, e.w2.scale};
  for (int i = 0; i < 4; ++i) {
    auto* entry = static_cast<char*>(const_cast<void*>(tables[i])) + size_t(expert) * sizeof(void*);
    dc::copy_h2d(entry, &values[i], sizeof(void*), stream_.get(), false);
  }
  stream_.synchronize();  // `values` lives on this stack frame
}

}  // namespace deepinfer::model::ds::cuda
