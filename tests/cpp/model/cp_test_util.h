// Helpers of the context-parallel model tests (context_parallel_test.cc, cp_ep_test.cc): one
// prompt's prefill in chunks on slot 0, the state it leaves, greedy decode after it.
#pragma once
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/deepseek/model.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v41/model.h"
#include "model/sequence_runner.h"
#include "parallel/eplb.h"

namespace deepinfer::testing::cp_util {

// What a prefill (and, on the owner, the decode after it) leaves.
struct Result {
  std::vector<float> last_logits;    // [V] of the prompt's last position
  std::vector<uint8_t> slot_state;   // save_slot: window rings, compressor partials
  std::vector<uint8_t> blocks;       // the slot's paged blocks: compressed entries, index keys
  std::vector<int32_t> decoded;      // greedy tokens after the prompt
  std::vector<float> decode_logits;  // [decoded, V]
};

// V4.1 fixtures in fixed-order products (their QAT roundings must not flip on a GEMM's row
// count); `shard`: only that rank's routed experts (expert parallelism without weight moves).
inline std::unique_ptr<model::ds::DeepseekModel> load(const std::string& dir, bool v41,
                                                      std::optional<parallel::ExpertShard> shard = std::nullopt) {
  std::unique_ptr<model::ds::DeepseekModel> m;
  if (v41) {
    model::v41::ModelOptions o;
    o.max_rollback = 1, o.batch_invariant = true, o.expert_shard = shard;
    m = model::v41::DeepseekV41Model::load(dir, o);
  } else {
    m = model::v4::DeepseekV4Model::load(dir, {.max_rollback = 1, .expert_shard = shard});
  }
  m->allocate_cache_for(1, 512);
  return m;
}

inline int32_t argmax(const float* x, int64_t V) { return int32_t(std::max_element(x, x + V) - x); }

// One step of `ids` at positions [done, done + ids.size()) of slot 0; logits [V] of the last row.
// Empty `ids`: an empty step (it joins the expert-parallel exchanges of a rank's peers).
inline std::vector<float> step(model::ds::DeepseekModel& m, std::span<const int32_t> ids, int64_t done) {
  const kv::CacheGeometry& g = m.cache_geometry();
  model::ForwardBatch b;
  if (!ids.empty()) {
    b.token_ids.assign(ids.begin(), ids.end());
    b.seqs = {model::SeqInBatch{.cache_slot = 0, .block_table = model::slot_block_table(g, 0),
                                .num_computed_tokens = done, .num_new_tokens = int32_t(ids.size())}};
    b.logits_indices = {int32_t(ids.size() - 1)};
  }
  model::ForwardOutput o = m.run(b, {});
  if (ids.empty()) return {};
  const int64_t V = m.vocab_size();
  return std::vector<float>(o.logits.data<float>(), o.logits.data<float>() + V);
}

// Prefill in `chunks`, the state it leaves, then `decode` greedy steps; `idle` empty steps after
// the prefill instead (a rank whose peers decode: its expert-parallel exchanges).
inline Result run(model::ds::DeepseekModel& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
                  int64_t decode, int64_t idle = 0) {
  Result r;
  m.reset_slot(0);
  int64_t done = 0;
  for (int64_t c : chunks) {
    r.last_logits = step(m, std::span(ids).subspan(size_t(done), size_t(c)), done);
    done += c;
  }
  r.slot_state = m.save_slot(0, done).bytes;
  const size_t bb = m.backend().paged_block_bytes();
  std::vector<model::HostBlockCopy> copies;
  const std::vector<int32_t> table = model::slot_block_table(m.cache_geometry(), 0);
  r.blocks.assign(table.size() * bb, 0);
  for (size_t i = 0; i < table.size(); ++i) copies.push_back({.block = table[i], .host = r.blocks.data() + i * bb});
  m.backend().copy_blocks_to_host(copies);
  const int64_t V = m.vocab_size();
  std::vector<float> logits = r.last_logits;
  for (int64_t k = 0; k < decode; ++k) {
    const int32_t tok = argmax(logits.data(), V);
    r.decoded.push_back(tok);
    logits = step(m, std::span(&tok, 1), done++);
    r.decode_logits.insert(r.decode_logits.end(), logits.begin(), logits.end());
  }
  for (int64_t k = 0; k < idle; ++k) step(m, {}, done);
  return r;
}

// The model's largest compression ratio (the CP plan's chunk alignment).
inline int64_t max_ratio(const model::ds::DeepseekModel& m) {
  int64_t a = 1;
  for (const auto& p : m.arch().plan.layers) a = std::max(a, p.ratio);
  return a;
}

}  // namespace deepinfer::testing::cp_util
