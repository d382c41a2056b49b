// The CPU backend's routed experts as an ExpertWeightStore (expert_weights.h): EPLB on a sharded
// model moves them between ranks. An expert is two f32 tensors of the store (w13 [2I, D], w2
// [D, I]); its packed form is w13's values then w2's.
#include <cstring>

#include "deepinfer/error.h"
#include "model/deepseek/cpu/cpu_backend.h"

namespace deepinfer::model::ds {

const ExpertRef& CpuBackend::expert_ref(int64_t layer, int32_t expert) const {
  const ModelRef& m = store_->refs;
  if (layer < 0 || layer >= int64_t(m.layers.size()))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " of ", m.layers.size());
  const std::vector<ExpertRef>& ex = m.layers[size_t(layer)].ffn.experts;
  if (expert < 0 || expert >= int32_t(ex.size()))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " has no expert ", expert, " (", ex.size(), " experts)");
  return ex[size_t(expert)];
}

bool CpuBackend::holds_expert(int64_t layer, int32_t expert) const {
  const ExpertRef& e = expert_ref(layer, expert);
  return e.w13.defined() && e.w2.defined();
}

int64_t CpuBackend::expert_bytes(int64_t layer) const {
  const Dims& g = arch_.dims;
  (void)expert_ref(layer, 0);
  return 3 * g.moe_inter * g.hidden * int64_t(sizeof(float));
}

void CpuBackend::pack_expert(int64_t layer, int32_t expert, std::span<std::byte> dst) const {
  const ExpertRef& e = expert_ref(layer, expert);
  if (!holds_expert(layer, expert))
    DI_THROW(InternalError, "expert store: layer ", layer, " expert ", expert, " is not held here, cannot send it");
  const int64_t w13 = 2 * arch_.dims.moe_inter * arch_.dims.hidden * int64_t(sizeof(float));
  if (int64_t(dst.size()) != expert_bytes(layer))
    DI_THROW(InternalError, "expert store: pack buffer of ", dst.size(), " bytes, expert needs ", expert_bytes(layer));
  std::memcpy(dst.data(), e.w13.w, size_t(w13));
  std::memcpy(dst.data() + w13, e.w2.w, dst.size() - size_t(w13));
}

void CpuBackend::adopt_expert(int64_t layer, int32_t expert, std::span<const std::byte> src) {
  const Dims& g = arch_.dims;
  const int64_t I = g.moe_inter, D = g.hidden;
  if (holds_expert(layer, expert))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " expert ", expert, " is held already");
  if (int64_t(src.size()) != expert_bytes(layer))
    DI_THROW(InvalidArgument, "expert store: layer ", layer, " expert ", expert, " arrived with ", src.size(),
             " bytes, expected ", expert_bytes(layer));
  Tensor w13 = Tensor::empty({2 * I, D}, DType::kF32), w2 = Tensor::empty({D, I}, DType::kF32);
  std::memcpy(w13.raw_data(), src.data(), w13.nbytes());
  std::memcpy(w2.raw_data(), src.data() + w13.nbytes(), w2.nbytes());
  ExpertRef& e = store_->refs.layers[size_t(layer)].ffn.experts[size_t(expert)];
  e.w13 = {.w = w13.raw_data(), .dtype = DType::kF32, .out = 2 * I, .in = D};
  e.w2 = {.w = w2.raw_data(), .dtype = DType::kF32, .out = D, .in = I};
  for (LinearRef* r : {&e.w13, &e.w2}) {  // panels too, as at load: the same kernel as the experts held from the start
    store_->packed.push_back(std::make_unique<ops::cpu::PackedWeight>(
        ops::cpu::pack_weight(static_cast<const float*>(r->w), r->out, r->in, r->in)));
    r->panels = true;
    r->packed = store_->packed.back().get();
  }
  store_->tensors.push_back(std::move(w13));
  store_->tensors.push_back(std::move(w2));
}

void CpuBackend::release_expert(int64_t layer, int32_t expert) {
  if (!holds_expert(layer, expert))
    DI_THROW(InternalError, "expert store: layer ", layer, " expert ", expert, " is not held, cannot free it");
  ExpertRef& e = store_->refs.layers[size_t(layer)].ffn.experts[size_t(expert)];
  free_tensor(e.w13.w);
  free_tensor(e.w2.w);
  free_packed(e.w13.packed);
  free_packed(e.w2.packed);
  e = ExpertRef{};
}

void CpuBackend::free_packed(const void* packed) {
  if (!packed) return;
  for (auto& p : store_->packed)
    if (p.get() == packed) {
      p.reset();
      return;
    }
}

// A linear scan: moves are rare (an EPLB round) and the store holds a few thousand tensors.
void CpuBackend::free_tensor(const void* data) {
  for (Tensor& t : store_->tensors)
    if (t.defined() && t.raw_data() == data) {
      t = Tensor{};
      return;
    }
  DI_THROW(InternalError, "expert store: no tensor holds the expert weights at ", data);
}

}  // namespace deepinfer::model::ds
