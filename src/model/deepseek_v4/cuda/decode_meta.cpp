// Fixed-shape StepMeta for graph-replayed decode (cuda_plan.h): same addressing as
// build_step_meta for one-token sequences, with every list sized by the padded batch only.
#include <algorithm>

#include "core/check.h"
#include "model/deepseek_v4/cuda/cuda_plan.h"

namespace deepinfer::model::v4::gpu {

int64_t decode_bucket(int64_t num_seqs) {
  for (int64_t b : kDecodeBuckets)
    if (num_seqs <= b) return b;
  return 0;
}

std::vector<int64_t> decode_cand_caps(const DeepseekV4Config& cfg, int64_t max_context) {
  std::vector<std::pair<int64_t, bool>> seen;
  std::vector<int64_t> caps;
  const int64_t ctx = std::max<int64_t>(1, std::min(max_context, cfg.max_position_embeddings));
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const int64_t m = cfg.compress_ratio[l];
    const bool overlap = cfg.layer_types[l] == AttnKind::kCSA;
    if (m <= 0 || std::find(seen.begin(), seen.end(), std::pair{m, overlap}) != seen.end()) continue;
    seen.push_back({m, overlap});
    caps.push_back(std::max<int64_t>(1, (ctx + m - 1) / m));
  }
  return caps;
}

bool decode_eligible(const DeepseekV4Config& cfg, const ForwardBatch& b, const std::vector<int64_t>& caps) {
  const int64_t B = int64_t(b.seqs.size());
  if (B == 0 || decode_bucket(B) == 0 || b.num_tokens() != B) return false;
  if (int64_t(b.logits_indices.size()) > B) return false;
  for (const SeqInBatch& s : b.seqs)
    if (s.num_new_tokens != 1) return false;
  std::vector<std::pair<int64_t, bool>> seen;
  size_t k = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const int64_t m = cfg.compress_ratio[l];
    const bool overlap = cfg.layer_types[l] == AttnKind::kCSA;
    if (m <= 0 || std::find(seen.begin(), seen.end(), std::pair{m, overlap}) != seen.end()) continue;
    seen.push_back({m, overlap});
    for (const SeqInBatch& s : b.seqs)
      if ((s.num_computed_tokens + 1) / m > caps.at(k)) return false;
    ++k;
  }
  return true;
}

namespace {
void build_fixed_kind(CompressMeta& k, const ForwardBatch& b, int64_t P, int64_t block_tokens, int64_t cap,
                      std::vector<int32_t>& pool) {
  const int64_t m = k.ratio, S = k.state_rows, R = k.rows_per_token, epb = block_tokens / m;
  const int64_t B = int64_t(b.seqs.size());
  k.entries_per_block = epb;
  k.max_count = cap;
  k.stage_src.assign(size_t(P * R), 0);
  k.stage_dst.assign(size_t(P * R), -1);
  k.block.assign(size_t(P), -1);
  k.entry_pos.assign(size_t(P), 0);
  k.entry_dst.assign(size_t(P), -1);
  k.state_src.resize(size_t(P));
  k.state_dst.assign(size_t(P), -1);
  k.cand_offset.assign(size_t(P), 0);
  k.cand_count.assign(size_t(P), 0);
  for (int64_t t = 0; t < P; ++t) {
    k.state_src[size_t(t)] = t;
    for (int64_t r = 0; r < R; ++r) k.stage_src[size_t(t * R + r)] = -(t + 1);
    if (t >= B) continue;
    const SeqInBatch& s = b.seqs[size_t(t)];
    const int64_t p = s.num_computed_tokens, slot = s.cache_slot;
    auto entry_row = [&](int64_t i) { return int64_t(s.block_table[size_t(i / epb)]) * epb + i % epb; };
    k.state_dst[size_t(t)] = slot * S + p % S;
    if ((p + 1) % m == 0) {
      const int64_t blk = (p + 1) / m - 1, base = k.overlap ? m * (blk - 1) : m * blk;
      k.block[size_t(t)] = blk;
      k.entry_pos[size_t(t)] = m * blk;
      k.entry_dst[size_t(t)] = entry_row(blk);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t q = base + r;
        if (q < 0) continue;
        k.stage_src[size_t(t * R + r)] = q < p ? slot * S + q % S : -(t + 1);
        k.stage_dst[size_t(t * R + r)] = t * R + r;
      }
    }
    const int64_t count = (p + 1) / m;
    DI_CHECK(count <= cap, "build_decode_meta: ", count, " candidates > cap ", cap);
    k.cand_offset[size_t(t)] = int64_t(pool.size());
    k.cand_count[size_t(t)] = int32_t(count);
    for (int64_t i = 0; i < count; ++i) pool.push_back(int32_t(entry_row(i)));
  }
}
}  // namespace

StepMeta build_decode_meta(const DeepseekV4Config& cfg, const kv::CacheGeometry& g, const ForwardBatch& b,
                           int64_t P, const std::vector<int64_t>& caps) {
  const int64_t B = int64_t(b.seqs.size()), W = cfg.sliding_window, n = cfg.hc_mult;
  DI_CHECK(B <= P && b.num_tokens() == B, "build_decode_meta: ", B, " sequences for ", P, " padded tokens");
  StepMeta m;
  m.fixed = true;
  m.T = P;
  m.n_streams = n;
  m.token_ids.assign(size_t(P), 0);
  m.pos.assign(size_t(P), 0);
  m.embed_src.assign(size_t(P * n), 0);
  m.win_src.resize(size_t(P * W));
  m.win_dst.assign(size_t(P * W), -1);
  m.win_begin.resize(size_t(P));
  m.win_count.assign(size_t(P), 1);
  m.win_store_src.resize(size_t(P));
  m.win_store_dst.assign(size_t(P), -1);
  m.max_window = W;
  for (int64_t t = 0; t < P; ++t) {
    m.win_begin[size_t(t)] = int32_t(t * W);
    m.win_store_src[size_t(t)] = t;
    for (int64_t j = 0; j < W; ++j) m.win_src[size_t(t * W + j)] = -(t + 1);
    m.win_dst[size_t(t * W)] = t * W;  // pads: their own kv row only
    if (t >= B) continue;
    const SeqInBatch& s = b.seqs[size_t(t)];
    const int64_t p = s.num_computed_tokens, slot = s.cache_slot, prev = std::min(W - 1, p), first = p - prev;
    m.token_ids[size_t(t)] = b.token_ids[size_t(t)];
    m.pos[size_t(t)] = p;
    for (int64_t k = 0; k < n; ++k) m.embed_src[size_t(t * n + k)] = b.token_ids[size_t(t)];
    for (int64_t j = 0; j <= prev; ++j) {
      m.win_src[size_t(t * W + j)] = j < prev ? slot * W + (first + j) % W : -(t + 1);
      m.win_dst[size_t(t * W + j)] = t * W + j;
    }
    m.win_count[size_t(t)] = int32_t(prev + 1);
    m.win_store_dst[size_t(t)] = slot * W + p % W;
  }
  size_t ki = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const int64_t ratio = cfg.compress_ratio[l];
    const bool overlap = cfg.layer_types[l] == AttnKind::kCSA;
    if (ratio <= 0 || m.kind(ratio, overlap)) continue;
    CompressMeta k;
    k.ratio = ratio;
    k.overlap = overlap;
    k.state_rows = overlap ? 2 * ratio : ratio;
    k.rows_per_token = k.state_rows;
    build_fixed_kind(k, b, P, g.block_tokens, caps.at(ki++), m.cand_pool);
    m.kinds.push_back(std::move(k));
  }
  const int64_t K = std::max<int64_t>(cfg.index_topk, 1);
  m.sel_offset.resize(size_t(P));
  for (int64_t i = 0; i < P; ++i) m.sel_offset[size_t(i)] = i * K;
  m.logits_rows.assign(size_t(P), 0);
  for (size_t i = 0; i < b.logits_indices.size(); ++i) m.logits_rows[i] = b.logits_indices[i];
  m.comb_rows.resize(size_t(P * cfg.num_experts_per_tok));
  for (size_t i = 0; i < m.comb_rows.size(); ++i) m.comb_rows[i] = int64_t(i);
  return m;
}

}  // namespace deepinfer::model::v4::gpu
