#include <cstring>

#include "core/check.h"
#include "model/deepseek_v4/prepare.h"
#include "ops/cpu/rope.h"

namespace deepinfer::model::v4 {
namespace {
std::vector<float> inv_freq_for(const RopeParams& p, int64_t rope_dim) {
  if (!p.yarn) return ops::cpu::rope_inv_freq(p.theta, rope_dim, nullptr);
  ops::cpu::YarnScaling y{p.factor, double(p.original_max_position), p.beta_fast, p.beta_slow};
  return ops::cpu::rope_inv_freq(p.theta, rope_dim, &y);
}

// f32 [out, in] of one part (quantised linears dequantised exactly; float tensors widened).
Tensor part_f32(const TensorPart& p, const DeepseekV4Config& cfg) {
  if (p.lin) return p.lin->dequantize_f32(cfg.fp8_block, cfg.fp4_block).contiguous();
  DI_CHECK(p.t && p.t->defined(), "tensor '", p.name, "' was not loaded");
  return p.t->to_f32().contiguous();
}

// The entry's parts stacked by rows into one f32 tensor.
Tensor stacked_f32(const TensorEntry& e, const DeepseekV4Config& cfg) {
  if (e.parts.size() == 1) return part_f32(e.parts[0], cfg);
  Tensor out = Tensor::empty({e.rows(), e.cols()}, DType::kF32);
  size_t off = 0;
  for (const TensorPart& p : e.parts) {
    const Tensor t = part_f32(p, cfg);
    DI_CHECK(t.numel() == p.shape[0] * e.cols(), "tensor '", p.name, "' has ", t.numel(), " values");
    std::memcpy(static_cast<char*>(out.raw_data()) + off, t.raw_data(), t.nbytes());
    off += t.nbytes();
  }
  return out;
}
}  // namespace

std::vector<float> inv_freq_main(const DeepseekV4Config& c) { return inv_freq_for(c.rope, c.rope_head_dim); }
std::vector<float> inv_freq_compress(const DeepseekV4Config& c) { return inv_freq_for(c.compress_rope, c.rope_head_dim); }

std::unique_ptr<ds::CpuWeightStore> prepare_cpu(const DeepseekV4Config& cfg, const ModelPlan& plan,
                                                const DeepseekV4Weights& canon,
                                                const std::optional<parallel::ExpertShard>& shard) {
  auto store = std::make_unique<ds::CpuWeightStore>();
  // The table points into the canonical views (read only here) and the store's refs.
  TensorTable table = v4_tensor_table(cfg, plan, const_cast<DeepseekV4Weights*>(&canon), &store->refs);
  if (shard) keep_expert_shard(table, *shard, int32_t(cfg.n_routed_experts), int64_t(plan.layers.size()));
  for (const TensorEntry& e : table.entries) {
    switch (e.kind) {
      case EntryKind::kLinear: {
        Tensor t = stacked_f32(e, cfg);
        ds::LinearRef& r = *e.lin;
        r.dtype = DType::kF32;
        r.out = t.size(0);
        r.in = t.size(1);
        // Every linear in 16-column panels (the packed kernel, no per-call packing); all but the
        // head keep their f32 rows too (batch-invariant mode's gemm_fixed, expert moves).
        store->packed.push_back(std::make_unique<ops::cpu::PackedWeight>(
            ops::cpu::pack_weight(t.data<float>(), t.size(0), t.size(1), t.size(1))));
        r.panels = true;
        r.packed = store->packed.back().get();
        if (e.role == LinearRole::kHead) break;  // streamed once per step: panels only
        r.w = t.raw_data();
        store->tensors.push_back(std::move(t));
        break;
      }
      case EntryKind::kFloat: {
        Tensor t = part_f32(e.parts[0], cfg);
        *e.vec = {t.data<float>(), t.numel()};
        store->tensors.push_back(std::move(t));
        break;
      }
      case EntryKind::kTable: {
        const Tensor t = e.parts[0].t->to_f32();  // ids < 2^24, exact in f32
        auto ids = std::make_unique<std::vector<int32_t>>(size_t(t.numel()));
        for (int64_t i = 0; i < t.numel(); ++i) (*ids)[size_t(i)] = int32_t(t.data<float>()[i]);
        *e.table = ids->data();
        *e.table_rows = t.size(0);
        store->tables.push_back(std::move(ids));
        break;
      }
    }
  }
  store->rope.push_back(std::make_unique<std::vector<float>>(inv_freq_main(cfg)));
  store->rope.push_back(std::make_unique<std::vector<float>>(inv_freq_compress(cfg)));
  ds::ModelRef& m = store->refs;
  m.inv_freq_main = {store->rope[0]->data(), int64_t(store->rope[0]->size())};
  m.inv_freq_compress = {store->rope[1]->data(), int64_t(store->rope[1]->size())};
  auto rope_of = [&](const LayerPlan& p) { return p.rope == RopeKind::kMain ? m.inv_freq_main.p : m.inv_freq_compress.p; };
  for (size_t l = 0; l < plan.layers.size(); ++l) m.layers[l].attn.inv_freq = rope_of(plan.layers[l]);
  for (size_t k = 0; k < plan.drafter.size(); ++k) m.mtp[k].block.attn.inv_freq = rope_of(plan.drafter[k]);
  return store;
}

}  // namespace deepinfer::model::v4
