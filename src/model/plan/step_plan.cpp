#include "model/plan/step_plan.h"

#include <algorithm>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::model {

const CompressPlan* StepPlan::kind(int64_t ratio, bool overlap) const {
  for (const auto& k : kinds)
    if (k.ratio == ratio && k.overlap == overlap) return &k;
  return nullptr;
}

int64_t StepPlan::kind_index(int64_t ratio, bool overlap) const {
  for (size_t i = 0; i < kinds.size(); ++i)
    if (kinds[i].ratio == ratio && kinds[i].overlap == overlap) return int64_t(i);
  return -1;
}

std::vector<KindKey> compressor_kinds(const std::vector<kv::LayerCacheSpec>& specs) {
  std::vector<KindKey> out;
  auto add = [&](KindKey k) {
    for (const KindKey& o : out)
      if (o.ratio == k.ratio && o.overlap == k.overlap) {
        DI_CHECK(o.state_rows == k.state_rows, "compressors of ratio ", k.ratio, " keep ", o.state_rows, " and ",
                 k.state_rows, " ring rows");
        return;
      }
    out.push_back(k);
  };
  for (const auto& s : specs) {
    if (!s.owns_entries()) continue;
    add({s.ratio, s.overlap, s.state_rows});
    if (s.index_width > 0) add({s.ratio, true, s.index_state_rows});
  }
  return out;
}

namespace {
struct Seq {
  int64_t tok0, n, pos0, slot;
  const std::vector<int32_t>* table;
  int64_t decoder_from = 0;  // SeqInBatch::decoder_from
};

// Window ring geometry shared by every layer (checked: one W and one ring size).
void window_geometry(const std::vector<kv::LayerCacheSpec>& specs, int64_t* W, int64_t* ring) {
  DI_CHECK(!specs.empty(), "step plan of a model without layers");
  *W = specs[0].window;
  *ring = specs[0].ring_rows;
  for (const auto& s : specs)
    DI_CHECK(s.window == *W && s.ring_rows == *ring, "layers with different windows (", s.window, "/", s.ring_rows,
             " vs ", *W, "/", *ring, ") are not supported by the step planner");
}

// Bounded replay: the replay_tail layers' runs of a sequence, from the same staged rows (the
// sequence's staging starts at `off`, position `first`) but never before its decoder_from. The
// lists exist only once some token's window reaches before its sequence's tail.
void tail_windows(StepPlan& m, const Seq& s, int64_t off, int64_t first) {
  const int64_t W = m.window;
  for (int64_t j = 0; j < s.n; ++j) {
    const int64_t p = s.pos0 + j, lo = std::max<int64_t>(0, p - W + 1), tlo = std::max(lo, s.decoder_from);
    if (tlo == lo && m.tail_win_begin.empty()) continue;
    if (m.tail_win_begin.empty()) {  // first clamped token: the earlier ones keep the shared runs
      m.tail_win_begin = m.win_begin;
      m.tail_win_count = m.win_count;
    }
    DI_CHECK(tlo <= p, "bounded replay: position ", p, " before its tail at ", s.decoder_from, " runs a tail layer");
    m.tail_win_begin[size_t(s.tok0 + j)] = int32_t(off + tlo - first);
    m.tail_win_count[size_t(s.tok0 + j)] = int32_t(p - tlo + 1);
  }
}

void build_window(StepPlan& m, const std::vector<Seq>& seqs) {
  const int64_t W = m.window, S = m.ring_rows;
  m.win_begin.resize(size_t(m.T));
  m.win_count.resize(size_t(m.T));
  int64_t off = 0;
  for (const Seq& s : seqs) {
    const int64_t prev = std::min(W - 1, s.pos0), first = s.pos0 - prev;
    for (int64_t p = first; p < s.pos0; ++p) m.win_src.push_back(s.slot * S + p % S);
    for (int64_t j = 0; j < s.n; ++j) m.win_src.push_back(-(s.tok0 + j) - 1);
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t p = s.pos0 + j, lo = std::max<int64_t>(0, p - W + 1);
      m.win_begin[size_t(s.tok0 + j)] = int32_t(off + lo - first);
      m.win_count[size_t(s.tok0 + j)] = int32_t(p - lo + 1);
      m.max_window = std::max<int64_t>(m.max_window, p - lo + 1);
    }
    off += prev + s.n;
    tail_windows(m, s, off - prev - s.n, first);
    // Every new row enters the ring when it fits (the ring is larger than W by the rollback slack,
    // and rows older than the ring are overwritten in position order anyway).
    for (int64_t p = std::max(s.pos0, s.pos0 + s.n - S); p < s.pos0 + s.n; ++p) {
      m.win_store_src.push_back(s.tok0 + p - s.pos0);
      m.win_store_dst.push_back(s.slot * S + p % S);
    }
  }
}

int64_t entry_row(const Seq& s, int64_t i, int64_t epb) { return int64_t((*s.table)[size_t(i / epb)]) * epb + i % epb; }

CompressPlan build_kind(int64_t T, const std::vector<Seq>& seqs, const KindKey& key, int64_t block_tokens) {
  CompressPlan k;
  const int64_t m = key.ratio;
  const bool overlap = key.overlap;
  k.ratio = m;
  k.overlap = overlap;
  k.state_rows = key.state_rows;
  k.entries_per_block = block_tokens / m;
  const int64_t S = k.state_rows, epb = k.entries_per_block;
  k.cand_offset.resize(size_t(T));
  k.cand_count.resize(size_t(T));
  for (const Seq& s : seqs) {
    const int64_t i0 = s.pos0 / m, i1 = (s.pos0 + s.n) / m;
    if (i1 > i0) {
      const int64_t lo = std::max<int64_t>(0, overlap ? m * (i0 - 1) : m * i0);
      CompressPlan::Launch L{.stage_row0 = int64_t(k.stage_src.size()), .n_rows = s.pos0 + s.n - lo, .lo = lo,
                             .first_block = i0, .n_blocks = i1 - i0, .entry0 = int64_t(k.entry_pos.size())};
      if (S > 0) {
        for (int64_t p = lo; p < s.pos0; ++p) k.stage_src.push_back(s.slot * S + p % S);
        for (int64_t j = 0; j < s.n; ++j) k.stage_src.push_back(-(s.tok0 + j) - 1);
      }
      for (int64_t b = i0; b < i1; ++b) {
        k.entry_pos.push_back(m * b);
        k.entry_dst.push_back(entry_row(s, b, epb));
      }
      if (S > 0) k.launches.push_back(L);
    }
    if (S > 0)
      for (int64_t p = std::max(s.pos0, s.pos0 + s.n - S); p < s.pos0 + s.n; ++p) {
        k.state_src.push_back(s.tok0 + p - s.pos0);
        k.state_dst.push_back(s.slot * S + p % S);
      }
    const int64_t off = int64_t(k.cand_rows.size());
    for (int64_t i = 0; i < i1; ++i) k.cand_rows.push_back(int32_t(entry_row(s, i, epb)));
    for (int64_t j = 0; j < s.n; ++j) {
      k.cand_offset[size_t(s.tok0 + j)] = off;
      k.cand_count[size_t(s.tok0 + j)] = int32_t((s.pos0 + j + 1) / m);
      k.max_count = std::max<int64_t>(k.max_count, (s.pos0 + j + 1) / m);
    }
  }
  return k;
}

void common_lists(StepPlan& m, const StepPlanDims& dims, const ForwardBatch& b) {
  const int64_t K = std::max<int64_t>(dims.index_topk, 1);
  m.sel_offset.resize(size_t(m.T));
  for (int64_t i = 0; i < m.T; ++i) m.sel_offset[size_t(i)] = i * K;
  m.hidden_rows.assign(b.hidden_indices.begin(), b.hidden_indices.end());
}
}  // namespace

StepPlan build_step_plan(const std::vector<kv::LayerCacheSpec>& specs, const StepPlanDims& dims,
                         const kv::CacheGeometry& g, const ForwardBatch& b) {
  StepPlan m;
  m.T = b.num_tokens();
  m.n_streams = dims.n_streams;
  window_geometry(specs, &m.window, &m.ring_rows);
  m.token_ids = b.token_ids;
  m.pos.resize(size_t(m.T));
  std::vector<Seq> seqs;
  int64_t t = 0;
  for (const SeqInBatch& s : b.seqs) {
    seqs.push_back({t, s.num_new_tokens, s.num_computed_tokens, s.cache_slot, &s.block_table, s.decoder_from});
    for (int64_t j = 0; j < s.num_new_tokens; ++j) m.pos[size_t(t + j)] = s.num_computed_tokens + j;
    t += s.num_new_tokens;
  }
  m.embed_src.reserve(size_t(m.T * m.n_streams));
  for (int64_t i = 0; i < m.T; ++i)
    for (int64_t k = 0; k < m.n_streams; ++k) m.embed_src.push_back(b.token_ids[size_t(i)]);
  build_window(m, seqs);
  for (const KindKey& k : compressor_kinds(specs)) m.kinds.push_back(build_kind(m.T, seqs, k, g.block_tokens));
  common_lists(m, dims, b);
  m.logits_rows.assign(b.logits_indices.begin(), b.logits_indices.end());
  return m;
}

// ---- fixed shape ----

int64_t decode_bucket(int64_t num_seqs) {
  for (int64_t b : kDecodeBuckets)
    if (num_seqs <= b) return b;
  return 0;
}

int64_t fixed_token_bucket(int64_t tokens) {
  for (int64_t b : kFixedTokenBuckets)
    if (tokens <= b) return b;
  return 0;
}

std::vector<int64_t> fixed_candidate_caps(const std::vector<kv::LayerCacheSpec>& specs, int64_t max_context) {
  std::vector<int64_t> caps;
  const int64_t ctx = std::max<int64_t>(1, max_context);
  for (const KindKey& k : compressor_kinds(specs)) caps.push_back(std::max<int64_t>(1, (ctx + k.ratio - 1) / k.ratio));
  return caps;
}

bool fixed_eligible(const std::vector<kv::LayerCacheSpec>& specs, const ForwardBatch& b,
                    const std::vector<int64_t>& caps, const FixedLimits& limits) {
  const int64_t B = int64_t(b.seqs.size()), T = b.num_tokens();
  if (B == 0 || decode_bucket(B) == 0 || T > limits.max_tokens || fixed_token_bucket(T) == 0) return false;
  if (int64_t(b.logits_indices.size()) > T || int64_t(b.hidden_indices.size()) > T) return false;
  // Every new row of a sequence gets its own ring row (window and compressor partial rings).
  int64_t ring_cap = limits.max_tokens_per_seq;
  for (const auto& s : specs) {
    ring_cap = std::min(ring_cap, s.ring_rows);
    if (s.state_rows > 0) ring_cap = std::min(ring_cap, s.state_rows);
    if (s.index_state_rows > 0) ring_cap = std::min(ring_cap, s.index_state_rows);
  }
  for (const SeqInBatch& s : b.seqs)
    if (s.num_new_tokens < 1 || s.num_new_tokens > ring_cap) return false;
  const std::vector<KindKey> kinds = compressor_kinds(specs);
  DI_CHECK(kinds.size() == caps.size(), "fixed_eligible: ", caps.size(), " caps for ", kinds.size(), " kinds");
  for (size_t k = 0; k < kinds.size(); ++k)
    for (const SeqInBatch& s : b.seqs)
      if ((s.num_computed_tokens + s.num_new_tokens) / kinds[k].ratio > caps[k]) return false;
  return true;
}

namespace {
// Token t of a fixed plan: its sequence's slot and block table, its position, and the position
// of the sequence's first token in the step (rows at or after it are this step's rows).
struct FixedToken {
  const SeqInBatch* seq = nullptr;  // null: a pad token
  int64_t pos = 0, pos0 = 0;
  // Row source of position q < pos for this token: the slot's ring row for q < pos0, else the
  // step row of the token at q (-(row + 1), as win_src / stage_src encode it).
  int64_t src(int64_t q, int64_t t, int64_t ring_rows) const {
    return q < pos0 ? int64_t(seq->cache_slot) * ring_rows + q % ring_rows : -(t - (pos - q)) - 1;
  }
};

std::vector<FixedToken> fixed_tokens(const ForwardBatch& b, int64_t P) {
  std::vector<FixedToken> out(static_cast<size_t>(P));
  int64_t t = 0;
  for (const SeqInBatch& s : b.seqs)
    for (int64_t j = 0; j < s.num_new_tokens; ++j, ++t)
      out[size_t(t)] = {&s, s.num_computed_tokens + j, s.num_computed_tokens};
  return out;
}

void build_fixed_kind(CompressPlan& k, const std::vector<FixedToken>& toks, int64_t P, int64_t block_tokens,
                      int64_t cap, std::vector<int32_t>& pool) {
  const int64_t m = k.ratio, S = k.state_rows, R = k.rows_per_token, epb = block_tokens / m;
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
    const FixedToken& x = toks[size_t(t)];
    if (!x.seq) continue;
    const SeqInBatch& s = *x.seq;
    const int64_t p = x.pos, slot = s.cache_slot;
    auto entry_row = [&](int64_t i) { return int64_t(s.block_table[size_t(i / epb)]) * epb + i % epb; };
    if (S > 0) k.state_dst[size_t(t)] = slot * S + p % S;
    if ((p + 1) % m == 0) {
      const int64_t blk = (p + 1) / m - 1, base = k.overlap ? m * (blk - 1) : m * blk;
      k.block[size_t(t)] = blk;
      k.entry_pos[size_t(t)] = m * blk;
      k.entry_dst[size_t(t)] = entry_row(blk);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t q = base + r;
        if (q < 0) continue;
        k.stage_src[size_t(t * R + r)] = q < p ? x.src(q, t, S) : -(t + 1);
        k.stage_dst[size_t(t * R + r)] = t * R + r;
      }
    }
    const int64_t count = (p + 1) / m;
    DI_CHECK(count <= cap, "build_fixed_step_plan: ", count, " candidates > cap ", cap);
    k.cand_offset[size_t(t)] = int64_t(pool.size());
    k.cand_count[size_t(t)] = int32_t(count);
    for (int64_t i = 0; i < count; ++i) pool.push_back(int32_t(entry_row(i)));
  }
  if (S == 0) {  // V4.1's ratio-1 projection: no partial ring, nothing staged or kept (as the general plan)
    k.stage_src.clear();
    k.stage_dst.clear();
    k.state_src.clear();
    k.state_dst.clear();
  }
}

// Window lists of a fixed plan: token t stages its W rows at [t*W, (t+1)*W).
void build_fixed_window(StepPlan& m, const std::vector<FixedToken>& toks, int64_t P) {
  const int64_t W = m.window, S = m.ring_rows, n = m.n_streams;
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
    const FixedToken& x = toks[size_t(t)];
    if (!x.seq) continue;
    const int64_t p = x.pos, prev = std::min(W - 1, p), first = p - prev;
    m.pos[size_t(t)] = p;
    for (int64_t k = 0; k < n; ++k) m.embed_src[size_t(t * n + k)] = m.token_ids[size_t(t)];
    for (int64_t j = 0; j <= prev; ++j) {
      m.win_src[size_t(t * W + j)] = j < prev ? x.src(first + j, t, S) : -(t + 1);
      m.win_dst[size_t(t * W + j)] = t * W + j;
    }
    m.win_count[size_t(t)] = int32_t(prev + 1);
    m.win_store_dst[size_t(t)] = int64_t(x.seq->cache_slot) * S + p % S;
  }
}
}  // namespace

StepPlan build_fixed_step_plan(const std::vector<kv::LayerCacheSpec>& specs, const StepPlanDims& dims,
                               const kv::CacheGeometry& g, const ForwardBatch& b, int64_t P,
                               const std::vector<int64_t>& caps) {
  const int64_t T = b.num_tokens(), n = dims.n_streams;
  DI_CHECK(T <= P && int64_t(b.seqs.size()) <= T, "build_fixed_step_plan: ", T, " tokens of ", b.seqs.size(),
           " sequences for ", P, " padded tokens");
  StepPlan m;
  m.fixed = true;
  m.T = P;
  m.n_streams = n;
  window_geometry(specs, &m.window, &m.ring_rows);
  m.token_ids.assign(size_t(P), 0);
  std::copy(b.token_ids.begin(), b.token_ids.end(), m.token_ids.begin());
  m.pos.assign(size_t(P), 0);
  m.embed_src.assign(size_t(P * n), 0);
  const std::vector<FixedToken> toks = fixed_tokens(b, P);
  build_fixed_window(m, toks, P);
  const std::vector<KindKey> kinds = compressor_kinds(specs);
  DI_CHECK(kinds.size() == caps.size(), "build_fixed_step_plan: ", caps.size(), " caps for ", kinds.size(), " kinds");
  for (size_t ki = 0; ki < kinds.size(); ++ki) {
    CompressPlan k;
    k.ratio = kinds[ki].ratio;
    k.overlap = kinds[ki].overlap;
    k.state_rows = kinds[ki].state_rows;
    // Rows a completed block reads: 2m (overlapping) or m, the newest being the token itself.
    k.rows_per_token = k.overlap ? 2 * k.ratio : k.ratio;
    build_fixed_kind(k, toks, P, g.block_tokens, caps[ki], m.cand_pool);
    m.kinds.push_back(std::move(k));
  }
  common_lists(m, dims, b);
  if (!b.hidden_indices.empty()) {  // every padded row, hidden_indices first (like the logits rows)
    m.hidden_rows.assign(size_t(P), 0);
    for (size_t i = 0; i < b.hidden_indices.size(); ++i) m.hidden_rows[i] = b.hidden_indices[i];
  }
  m.logits_rows.assign(size_t(P), 0);
  for (size_t i = 0; i < b.logits_indices.size(); ++i) m.logits_rows[i] = b.logits_indices[i];
  m.comb_rows.resize(size_t(P * dims.topk_experts));
  for (size_t i = 0; i < m.comb_rows.size(); ++i) m.comb_rows[i] = int64_t(i);
  return m;
}

}  // namespace deepinfer::model
