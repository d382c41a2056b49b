#include "engine/prefix_cache.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::engine {

PrefixCache::PrefixCache(const PrefixCacheConfig& config, int64_t block_tokens)
    : config_(config), block_tokens_(block_tokens) {
  DI_CHECK(block_tokens > 0 && config.checkpoint_interval_blocks >= -1, "PrefixCache: block_tokens ", block_tokens,
           ", checkpoint_interval_blocks ", config.checkpoint_interval_blocks);
  // -1 = automatic: the Engine resolves it from the model (auto_checkpoint_interval); a cache built
  // without one checkpoints every block.
  if (config_.checkpoint_interval_blocks < 0) config_.checkpoint_interval_blocks = 1;
}

PrefixMatch PrefixCache::match(const KVCacheManager& kv, std::span<const int32_t> prompt,
                               std::span<const int32_t> output, bool count, const HostBlockTier* host,
                               int64_t max_tokens) {
  PrefixMatch m;
  if (!config_.enabled) return m;
  const int64_t np = int64_t(prompt.size()), total = np + int64_t(output.size()), bt = block_tokens_;
  // Blocks [0, i) may hit only while a token is left after them.
  const int64_t max_blocks = std::min((total - 1) / bt, max_tokens / bt);
  std::vector<int32_t> tokens(static_cast<size_t>(bt));
  std::vector<int32_t> chain, host_chain;
  uint64_t parent = kv.hash_seed();
  for (int64_t i = 0; i < max_blocks; ++i) {
    for (int64_t j = 0; j < bt; ++j) {
      const int64_t p = i * bt + j;
      tokens[size_t(j)] = p < np ? prompt[size_t(p)] : output[size_t(p - np)];
    }
    const uint64_t h = block_hash(parent, tokens);
    const int32_t b = host_chain.empty() ? kv.find_cached(h, parent, tokens) : -1;
    const int32_t s = b < 0 && host ? host->find(h, parent, tokens) : -1;
    if (b < 0 && s < 0) break;
    (b >= 0 ? chain : host_chain).push_back(b >= 0 ? b : s);
    m.cached_tokens = (i + 1) * bt;
    if (auto it = index_.find(h); it != index_.end()) {
      m.num_tokens = (i + 1) * bt;
      m.checkpoint = it->second->snapshot;
      m.blocks = chain;
      m.host_slots = host_chain;
      lru_.splice(lru_.end(), lru_, it->second);  // most recently used
    }
    parent = h;
  }
  if (count) count_lookup(total, m.num_tokens);
  return m;
}

void PrefixCache::count_lookup(int64_t num_tokens, int64_t hit_tokens) {
  stats_.num_lookups++;
  stats_.lookup_tokens += num_tokens;
  stats_.num_hits += hit_tokens > 0;
  stats_.hit_tokens += hit_tokens;
}

int64_t PrefixCache::cut_chunk(int64_t num_computed, int64_t n, int64_t num_tokens, int64_t branch_point) const {
  if (!config_.enabled || n <= 1) return n;
  const int64_t bt = block_tokens_, end = num_computed + n;
  int64_t cut = ((num_tokens - 1) / bt) * bt;  // the prompt's last boundary before its last token
  if (cut <= num_computed) cut = end;
  if (const int64_t k = config_.checkpoint_interval_blocks * bt; k > 0)
    cut = std::min(cut, (num_computed / k + 1) * k);
  if (branch_point > num_computed) cut = std::min(cut, branch_point);
  return cut < end ? cut - num_computed : n;
}

void PrefixCache::plan_checkpoints(int64_t seq_id, int64_t first_position, int64_t after, uint64_t parent,
                                   std::span<const int32_t> tokens, std::vector<CheckpointRequest>& out) const {
  if (!config_.enabled) return;
  const int64_t bt = block_tokens_;
  DI_CHECK(first_position % bt == 0 && first_position <= after, "plan_checkpoints: first position ", first_position,
           " after ", after);
  for (int64_t i = 0; (i + 1) * bt <= int64_t(tokens.size()); ++i) {
    parent = block_hash(parent, tokens.subspan(size_t(i * bt), size_t(bt)));
    const int64_t n = first_position + (i + 1) * bt;
    if (n > after && !has(parent)) out.push_back({seq_id, n, parent});
  }
}

void PrefixCache::erase(std::list<Entry>::iterator it) {
  stats_.checkpoint_bytes -= it->snapshot->bytes.size();
  stats_.num_checkpoints--;
  index_.erase(it->key);
  lru_.erase(it);
}

void PrefixCache::put(const SavedCheckpoint& c) {
  DI_CHECK(c.snapshot, "PrefixCache::put without a snapshot");
  if (!config_.enabled || has(c.key)) return;
  const size_t bytes = c.snapshot->bytes.size();
  if (bytes > config_.checkpoint_budget_bytes) {
    stats_.checkpoints_evicted++;
    return;
  }
  while (stats_.checkpoint_bytes + bytes > config_.checkpoint_budget_bytes) {
    erase(lru_.begin());
    stats_.checkpoints_evicted++;
  }
  index_[c.key] = lru_.insert(lru_.end(), Entry{c.key, c.snapshot});
  stats_.checkpoint_bytes += bytes;
  stats_.num_checkpoints++;
  stats_.checkpoints_saved++;
}

void PrefixCache::drop(uint64_t key) {
  if (auto it = index_.find(key); it != index_.end()) {
    erase(it->second);
    stats_.checkpoints_evicted++;
  }
}

}  // namespace deepinfer::engine
