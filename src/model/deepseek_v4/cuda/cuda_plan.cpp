#include "model/deepseek_v4/cuda/cuda_plan.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <unordered_set>

#include "deepinfer/error.h"
#include "model/deepseek_v4/cuda/arena.h"
#include "ops/cuda/sampling.h"

namespace deepinfer::model::v4::gpu {

std::vector<kv::LayerCacheSpec> cache_specs_for(const DeepseekV4Config& cfg, int64_t num_mtp) {
  std::vector<kv::LayerCacheSpec> specs;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    kv::LayerCacheSpec s{.window = cfg.sliding_window, .head_dim = cfg.head_dim, .ratio = cfg.compress_ratio[l]};
    if (s.ratio > 0) {
      s.overlap = cfg.layer_types[l] == AttnKind::kCSA;
      s.comp_width = s.overlap ? 2 * cfg.head_dim : cfg.head_dim;
      if (s.overlap) {
        s.index_dim = cfg.index_head_dim;
        s.index_width = 2 * cfg.index_head_dim;
      }
    }
    specs.push_back(s);
  }
  for (int64_t k = 0; k < num_mtp; ++k) specs.push_back({.window = cfg.sliding_window, .head_dim = cfg.head_dim});
  return specs;
}

size_t gpu_block_bytes(const std::vector<kv::LayerCacheSpec>& layers, int64_t block_tokens, size_t kv_bytes) {
  size_t n = 0;
  for (const auto& s : layers)
    if (s.ratio > 0) n += size_t(block_tokens / s.ratio) * size_t(s.head_dim + s.index_dim) * kv_bytes;
  return n;
}

size_t gpu_slot_bytes(const std::vector<kv::LayerCacheSpec>& layers, size_t kv_bytes) {
  size_t n = 0;
  for (const auto& s : layers) {
    n += size_t(s.window * s.head_dim) * kv_bytes;                // window ring
    n += size_t(s.state_rows() * 2 * s.comp_width) * 4;           // f32 compressor partials
    if (s.index_dim > 0) n += size_t(2 * s.ratio * 2 * s.index_width) * 4;
  }
  return n;
}

kv::CacheGeometry plan_gpu_cache(const std::vector<kv::LayerCacheSpec>& layers, size_t budget_bytes,
                                 int64_t max_slots, size_t kv_bytes) {
  if (max_slots <= 0) DI_THROW(InvalidArgument, "plan_cache: max_slots must be > 0, got ", max_slots);
  kv::CacheGeometry g;
  g.block_tokens = kv::KvCache::default_block_tokens(layers);
  g.num_slots = max_slots;
  g.bytes_per_block = gpu_block_bytes(layers, g.block_tokens, kv_bytes);
  g.bytes_per_slot = gpu_slot_bytes(layers, kv_bytes);
  const size_t fixed = g.bytes_per_slot * size_t(max_slots);
  if (fixed > budget_bytes)
    DI_THROW(OutOfMemory, "GPU kv cache: ", max_slots, " slots need ", fixed, " bytes (", g.bytes_per_slot,
             " per slot), the cache budget is ", budget_bytes, " bytes");
  g.num_blocks = g.bytes_per_block ? int64_t((budget_bytes - fixed) / g.bytes_per_block) : 0;
  return g;
}

namespace {
std::atomic<ExpertPath> g_expert_path{ExpertPath::kNative};
}  // namespace

void set_expert_path(ExpertPath p) { g_expert_path = p; }
ExpertPath expert_path() { return g_expert_path; }

WeightFormat device_expert_format(const DeepseekV4Config& cfg, Numerics numerics) {
  const WeightFormat f = cfg.expert_format;
  if (numerics == Numerics::kExact || g_expert_path != ExpertPath::kNative) return WeightFormat::kBF16;
  if (f != WeightFormat::kFP4 && f != WeightFormat::kFP8Block) return WeightFormat::kBF16;
  if (cfg.hidden_size % 32 || cfg.moe_intermediate_size % 32) return WeightFormat::kBF16;
  if (f == WeightFormat::kFP4 && cfg.fp4_block != 32) return WeightFormat::kBF16;
  if (f == WeightFormat::kFP8Block && cfg.fp8_block != 128) return WeightFormat::kBF16;
  return f;
}

namespace {
std::atomic<DensePath> g_dense_path{DensePath::kNative};
}  // namespace

void set_dense_path(DensePath p) { g_dense_path = p; }
DensePath dense_path() { return g_dense_path; }

bool device_dense_fp8(const DeepseekV4Config& cfg, Numerics numerics) {
  return numerics != Numerics::kExact && g_dense_path == DensePath::kNative &&
         cfg.dense_format == WeightFormat::kFP8Block && cfg.fp8_block == 128;
}

std::vector<DenseShape> dense_fp8_shapes(const DeepseekV4Config& c, AttnKind kind) {
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank;
  const int64_t G = std::max<int64_t>(c.o_groups, 1), R = c.o_lora_rank, I = c.moe_intermediate_size;
  std::vector<DenseShape> v{{r, D}, {H * d, r}, {d, D}, {R, H * d / G, G}, {D, G * R}, {2 * I, D, 1, I % 128 ? 16 : 128}, {D, I}};
  if (kind == AttnKind::kCSA) v.push_back({c.index_n_heads * c.index_head_dim, r});
  return v;
}

int64_t device_expert_matrix_bytes(WeightFormat f, int64_t n, int64_t k, int64_t elem_bytes) {
  if (f == WeightFormat::kFP4) return n * (k / 2) + n * ((k + 31) / 32);
  if (f == WeightFormat::kFP8Block) return n * k + n * ((k + 127) / 128);
  return n * k * elem_bytes;
}

namespace {
// Dense linears and the shared expert in elements of the linear dtype; routed experts separately.
int64_t layer_dense_elems_bf16(const DeepseekV4Config& c, AttnKind kind) {
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank;
  const int64_t GR = c.o_groups * c.o_lora_rank, I = c.moe_intermediate_size, E = c.n_routed_experts;
  int64_t n = r * D + H * d * r + d * D + GR * (H * d / std::max<int64_t>(c.o_groups, 1)) + D * GR;
  if (kind == AttnKind::kCSA) n += 2 * (2 * d) * D + 2 * (2 * c.index_head_dim) * D + c.index_n_heads * c.index_head_dim * r +
                                  c.index_n_heads * D;
  if (kind == AttnKind::kHCA) n += 2 * d * D;
  n += E * D;                           // router
  n += 2 * I * D + D * I;               // shared expert
  return n;
}
int64_t layer_f32_elems(const DeepseekV4Config& c, AttnKind kind, int64_t ratio, bool hash) {
  const int64_t D = c.hidden_size, d = c.head_dim, nD = c.hc_dim(), M = c.hc_mix_dim();
  int64_t n = 2 * D + 2 * (M * nD + M + 3) + c.q_lora_rank + d + c.num_heads;
  if (kind == AttnKind::kCSA) n += ratio * 2 * d + d + ratio * 2 * c.index_head_dim + c.index_head_dim;
  if (kind == AttnKind::kHCA) n += ratio * d + d;
  n += hash ? c.vocab_size * c.num_experts_per_tok : c.n_routed_experts;  // i32 table or f32 bias
  return n;
}
}  // namespace

size_t gpu_weight_bytes(const DeepseekV4Config& c, bool with_mtp, size_t linear_bytes) {
  const int64_t D = c.hidden_size, V = c.vocab_size, n = c.hc_mult, I = c.moe_intermediate_size;
  const WeightFormat ef = device_expert_format(c, linear_bytes >= 4 ? Numerics::kExact : Numerics::kBf16);
  const int64_t lb = int64_t(linear_bytes);
  const int64_t expert_bytes = device_expert_matrix_bytes(ef, 2 * I, D, lb) + device_expert_matrix_bytes(ef, D, I, lb);
  int64_t bf16 = 2 * V * D, f32 = D + n * c.hc_dim() + n + 1 + c.rope_head_dim, routed = 0;
  const bool fp8 = linear_bytes == 2 && device_dense_fp8(c, Numerics::kBf16);
  int64_t fp8_bytes = 0;  // dense FP8 linears kept FP8: 1 byte per weight + one e8m0 per 128x128 block
  for (int64_t l = 0; l < c.num_layers; ++l) {
    routed += c.n_routed_experts * expert_bytes;
    bf16 += layer_dense_elems_bf16(c, c.layer_types[l]);
    if (fp8)
      for (const DenseShape& s : dense_fp8_shapes(c, c.layer_types[l])) {
        bf16 -= s.batch * s.n * s.k;
        fp8_bytes += s.batch * s.n * s.k + (s.batch * s.n + s.scale_rows - 1) / s.scale_rows * ((s.k + 127) / 128);
      }
    f32 += layer_f32_elems(c, c.layer_types[l], c.compress_ratio[l], c.mlp_types[l] == MlpKind::kHashMoE);
  }
  if (with_mtp)
    for (int64_t k = 0; k < c.num_mtp_layers; ++k) {
      bf16 += 2 * D * D + layer_dense_elems_bf16(c, AttnKind::kSliding);
      routed += c.n_routed_experts * expert_bytes;
      f32 += 3 * D + n * c.hc_dim() + n + 1 + layer_f32_elems(c, AttnKind::kSliding, 0, false);
    }
  return size_t(bf16) * linear_bytes + size_t(f32) * 4 + size_t(routed) + size_t(fp8_bytes);
}

size_t gpu_activation_bytes(const DeepseekV4Config& c, int64_t max_tokens, int64_t max_seqs, int64_t max_context,
                            size_t act_bytes) {
  ArenaSizes s;
  s.act_bytes = act_bytes;
  s.T = max_tokens;
  s.win_rows = max_tokens + max_seqs * (c.sliding_window - 1);
  int64_t min_ratio = 0;
  for (int64_t m : c.compress_ratio)
    if (m > 0) min_ratio = min_ratio ? std::min(min_ratio, m) : m;
  s.stage_rows = max_tokens + max_seqs * 2 * std::max<int64_t>(min_ratio, 128);
  s.entries = min_ratio ? max_tokens / min_ratio + max_seqs : 0;
  s.max_cand = min_ratio ? max_context / min_ratio : 0;
  s.R = std::min<int64_t>(max_tokens, 1024);
  // Split-KV partials (f32 [T, H, splits, d+2]) exist only while T·ceil(H/heads-per-block) < 4·SMs
  // (choose_attention_split), so T·splits < 8·SMs whatever max_tokens is: bound them by 2048
  // token-splits (up to 256 SMs) instead of max_tokens x 64 (69 GB at V4-Flash width, 8192 tokens).
  s.attn_splits = 1;
  // The engine's device sampler (engine/device_sampler) keeps a workspace per sampled row; the
  // decode batch is at most max_seqs rows (66 MB at 64 x V4's 129,280 vocabulary).
  return layout_arena(c, s).total + size_t(2048) * size_t(c.num_heads) * size_t(c.head_dim + 2) * sizeof(float) +
         ops::cuda::sampling_workspace_bytes(max_seqs, c.vocab_size);
}

const CompressMeta* StepMeta::kind(int64_t ratio, bool overlap) const {
  for (const auto& k : kinds)
    if (k.ratio == ratio && k.overlap == overlap) return &k;
  return nullptr;
}

void validate_batch(const DeepseekV4Config& cfg, const kv::CacheGeometry& g, bool allocated, const ForwardBatch& b) {
  validate_forward_batch(b, g, allocated, cfg.vocab_size);
}

namespace {
struct Seq {
  int64_t tok0, n, pos0, slot;
  const std::vector<int32_t>* table;
};

void build_window(StepMeta& m, const std::vector<Seq>& seqs, int64_t W) {
  m.win_begin.resize(size_t(m.T));
  m.win_count.resize(size_t(m.T));
  int64_t off = 0;
  for (const Seq& s : seqs) {
    const int64_t prev = std::min(W - 1, s.pos0), first = s.pos0 - prev;
    for (int64_t p = first; p < s.pos0; ++p) m.win_src.push_back(s.slot * W + p % W);
    for (int64_t j = 0; j < s.n; ++j) m.win_src.push_back(-(s.tok0 + j) - 1);
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t p = s.pos0 + j, lo = std::max<int64_t>(0, p - W + 1);
      m.win_begin[s.tok0 + j] = int32_t(off + lo - first);
      m.win_count[s.tok0 + j] = int32_t(p - lo + 1);
      m.max_window = std::max<int64_t>(m.max_window, p - lo + 1);
    }
    off += prev + s.n;
    for (int64_t p = std::max(s.pos0, s.pos0 + s.n - W); p < s.pos0 + s.n; ++p) {
      m.win_store_src.push_back(s.tok0 + p - s.pos0);
      m.win_store_dst.push_back(s.slot * W + p % W);
    }
  }
}

int64_t entry_row(const Seq& s, int64_t i, int64_t epb) { return int64_t((*s.table)[size_t(i / epb)]) * epb + i % epb; }

CompressMeta build_kind(int64_t T, const std::vector<Seq>& seqs, int64_t m, bool overlap, int64_t block_tokens) {
  CompressMeta k;
  k.ratio = m;
  k.overlap = overlap;
  k.state_rows = overlap ? 2 * m : m;
  k.entries_per_block = block_tokens / m;
  const int64_t S = k.state_rows, epb = k.entries_per_block;
  k.cand_offset.resize(size_t(T));
  k.cand_count.resize(size_t(T));
  for (const Seq& s : seqs) {
    const int64_t i0 = s.pos0 / m, i1 = (s.pos0 + s.n) / m;
    if (i1 > i0) {
      const int64_t lo = std::max<int64_t>(0, overlap ? m * (i0 - 1) : m * i0);
      CompressMeta::Launch L{.stage_row0 = int64_t(k.stage_src.size()), .n_rows = s.pos0 + s.n - lo, .lo = lo,
                             .first_block = i0, .n_blocks = i1 - i0, .entry0 = int64_t(k.entry_pos.size())};
      for (int64_t p = lo; p < s.pos0; ++p) k.stage_src.push_back(s.slot * S + p % S);
      for (int64_t j = 0; j < s.n; ++j) k.stage_src.push_back(-(s.tok0 + j) - 1);
      for (int64_t b = i0; b < i1; ++b) {
        k.entry_pos.push_back(m * b);
        k.entry_dst.push_back(entry_row(s, b, epb));
      }
      k.launches.push_back(L);
    }
    for (int64_t p = std::max(s.pos0, s.pos0 + s.n - S); p < s.pos0 + s.n; ++p) {
      k.state_src.push_back(s.tok0 + p - s.pos0);
      k.state_dst.push_back(s.slot * S + p % S);
    }
    const int64_t off = int64_t(k.cand_rows.size());
    for (int64_t i = 0; i < i1; ++i) k.cand_rows.push_back(int32_t(entry_row(s, i, epb)));
    for (int64_t j = 0; j < s.n; ++j) {
      k.cand_offset[s.tok0 + j] = off;
      k.cand_count[s.tok0 + j] = int32_t((s.pos0 + j + 1) / m);
      k.max_count = std::max<int64_t>(k.max_count, (s.pos0 + j + 1) / m);
    }
  }
  return k;
}
}  // namespace

StepMeta build_step_meta(const DeepseekV4Config& cfg, const kv::CacheGeometry& g, const ForwardBatch& b) {
  StepMeta m;
  m.T = b.num_tokens();
  m.n_streams = cfg.hc_mult;
  m.token_ids = b.token_ids;
  m.pos.resize(size_t(m.T));
  std::vector<Seq> seqs;
  int64_t t = 0;
  for (const SeqInBatch& s : b.seqs) {
    seqs.push_back({t, s.num_new_tokens, s.num_computed_tokens, s.cache_slot, &s.block_table});
    for (int64_t j = 0; j < s.num_new_tokens; ++j) m.pos[size_t(t + j)] = s.num_computed_tokens + j;
    t += s.num_new_tokens;
  }
  m.embed_src.reserve(size_t(m.T * m.n_streams));
  for (int64_t i = 0; i < m.T; ++i)
    for (int64_t k = 0; k < m.n_streams; ++k) m.embed_src.push_back(b.token_ids[size_t(i)]);
  build_window(m, seqs, cfg.sliding_window);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const int64_t ratio = cfg.compress_ratio[l];
    const bool overlap = cfg.layer_types[l] == AttnKind::kCSA;
    if (ratio > 0 && !m.kind(ratio, overlap)) m.kinds.push_back(build_kind(m.T, seqs, ratio, overlap, g.block_tokens));
  }
  const int64_t K = std::max<int64_t>(cfg.index_topk, 1);
  m.sel_offset.resize(size_t(m.T));
  for (int64_t i = 0; i < m.T; ++i) m.sel_offset[size_t(i)] = i * K;
  m.logits_rows.assign(b.logits_indices.begin(), b.logits_indices.end());
  return m;
}

}  // namespace deepinfer::model::v4::gpu
