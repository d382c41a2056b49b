// KVCacheManager: content hashes chained over each full block and its prefix (seeded per
// model), reference counts, an LRU free list that keeps hashes findable until reuse, deferred
// release, and the invariants under random operation sequences.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "deepinfer/error.h"
#include "engine/engine.h"
#include "engine/kv_cache_manager.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
kv::CacheGeometry geometry(int64_t blocks, int64_t slots, int64_t block_tokens = 4) {
  kv::CacheGeometry g;
  g.block_tokens = block_tokens;
  g.num_blocks = blocks;
  g.num_slots = slots;
  return g;
}

std::vector<uint64_t> hashes_of(const KVCacheManager& m, int64_t seq) {
  std::vector<uint64_t> h;
  for (int32_t b : m.get(seq)->block_ids)
    if (auto x = m.content_hash(b)) h.push_back(*x);
  return h;
}

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}
}  // namespace

TEST(KVCacheManager, HashChainsOverPrefixAndSeed) {
  const uint64_t seed = block_hash_seed("model A / bf16 / full prefill");
  KVCacheManager m(geometry(16, 4), seed);
  const std::vector<int32_t> t = iota_tokens(12, 10);
  std::vector<int32_t> other = t;
  other[5] = 999;  // inside block 1
  for (int64_t s : {1, 2, 3}) ASSERT_TRUE(m.allocate(s, 12));
  m.hash_full_blocks(1, t, {}, 12);
  m.hash_full_blocks(2, std::span(t).first(6), std::span(t).subspan(6), 12);  // prompt + output split
  m.hash_full_blocks(3, other, {}, 10);                                        // block 2 not yet full
  const auto h1 = hashes_of(m, 1), h2 = hashes_of(m, 2), h3 = hashes_of(m, 3);
  ASSERT_EQ(h1.size(), 3u);
  EXPECT_EQ(h1, h2) << "the same tokens give the same chain wherever prompt ends";
  ASSERT_EQ(h3.size(), 2u);
  EXPECT_EQ(h3[0], h1[0]);
  EXPECT_NE(h3[1], h1[1]) << "a changed token changes its block";
  m.hash_full_blocks(3, other, {}, 12);
  EXPECT_NE(hashes_of(m, 3)[2], h1[2]) << "and every block after it (the prefix is chained)";
  EXPECT_EQ(h1[0], block_hash(seed, std::span(t).first(4)));
  EXPECT_EQ(h1[2], block_hash(h1[1], std::span(t).subspan(8, 4)));
  KVCacheManager other_model(geometry(16, 4), block_hash_seed("model B / bf16 / full prefill"));
  ASSERT_TRUE(other_model.allocate(1, 12));
  other_model.hash_full_blocks(1, t, {}, 12);
  EXPECT_NE(hashes_of(other_model, 1)[0], h1[0]) << "the seed separates models, numerics and prefill modes";
  EXPECT_NE(m.find_cached(h1[0]), -1);
  EXPECT_EQ(m.num_cached_blocks(), 9);
  m.check_invariants();
}

// Freed blocks stay findable by hash in the LRU free list; allocation takes never-used and
// least recently freed blocks first, a sequence's last block before its first.
TEST(KVCacheManager, FreedBlocksStayFindableUntilReused) {
  KVCacheManager m(geometry(8, 4));
  const std::vector<int32_t> t = iota_tokens(12);
  ASSERT_TRUE(m.allocate(1, 12));
  m.hash_full_blocks(1, t, {}, 12);
  const std::vector<int32_t> blocks = m.get(1)->block_ids;
  const std::vector<uint64_t> h = hashes_of(m, 1);
  m.free(1, /*last_step=*/-1);  // nothing in flight: free at once
  EXPECT_EQ(m.num_free_blocks(), 8);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m.find_cached(h[i]), blocks[i]);
    EXPECT_EQ(m.ref_count(blocks[i]), 0);
  }
  ASSERT_TRUE(m.allocate(2, 4 * 5));  // the 5 never-used blocks
  EXPECT_EQ(m.num_evictions(), 0);
  EXPECT_EQ(m.num_cached_blocks(), 3);
  ASSERT_TRUE(m.allocate(2, 4 * 6));  // one more: seq 1's last block goes first
  EXPECT_EQ(m.num_evictions(), 1);
  EXPECT_EQ(m.find_cached(h[2]), -1);
  EXPECT_EQ(m.find_cached(h[0]), blocks[0]);
  EXPECT_EQ(m.get(2)->block_ids.back(), blocks[2]);
  EXPECT_FALSE(m.allocate(3, 4 * 3)) << "2 free blocks cannot hold 3";
  m.check_invariants();
}

TEST(KVCacheManager, ReleaseWaitsForTheStepThatUsedIt) {
  KVCacheManager m(geometry(6, 2));
  ASSERT_TRUE(m.allocate(1, 16));
  m.complete_step(3);
  m.free(1, /*last_step=*/4);  // step 4 still in flight
  EXPECT_EQ(m.num_free_blocks(), 2);
  EXPECT_EQ(m.num_pending_blocks(), 4);
  EXPECT_EQ(m.num_free_slots(), 1);
  EXPECT_FALSE(m.allocate(2, 12)) << "pending blocks are not handed out";
  m.check_invariants();
  m.complete_step(4);
  EXPECT_EQ(m.num_free_blocks(), 6);
  EXPECT_EQ(m.num_free_slots(), 2);
  ASSERT_TRUE(m.allocate(2, 24));
  EXPECT_EQ(m.truncate(2, 9, /*last_step=*/6), 3);  // 3 blocks cover 9 tokens
  EXPECT_EQ(m.num_pending_blocks(), 3);
  m.complete_step(5);
  EXPECT_EQ(m.num_pending_blocks(), 3);
  m.complete_step(6);
  EXPECT_EQ(m.num_pending_blocks(), 0);
  EXPECT_EQ(m.num_free_blocks(), 3);
  m.check_invariants();
}

// Random grow / truncate / hash / free with releases keyed by in-flight steps: after every
// operation the refcounts equal the references, nothing is lost, and no block is ever in two
// tables or handed out while pending.
TEST(KVCacheManager, InvariantsUnderRandomOperations) {
  std::mt19937 rng(11);
  KVCacheManager m(geometry(40, 6));
  std::map<int64_t, std::vector<int32_t>> tokens;  // live sequences
  std::map<int64_t, int64_t> computed;
  int64_t step = 0, next_id = 0;
  for (int op = 0; op < 4000; ++op) {
    const int kind = int(rng() % 10);
    if (kind < 4) {  // grow a sequence (new or live) and compute part of it
      const int64_t id = (tokens.empty() || rng() % 3 == 0) ? next_id++ : std::next(tokens.begin(), long(rng() % tokens.size()))->first;
      std::vector<int32_t>& t = tokens[id];
      const size_t grow = 1 + rng() % 9;
      for (size_t i = 0; i < grow; ++i) t.push_back(int32_t(rng() % 50));
      if (!m.allocate(id, int64_t(t.size()))) {
        t.resize(t.size() - grow);
        if (t.empty() && !m.get(id)) tokens.erase(id), computed.erase(id);
        continue;
      }
      // Computed tokens only grow (a step computes them; only uncomputed drafts roll back).
      computed[id] = std::max<int64_t>(computed[id], int64_t(t.size()) - int64_t(rng() % 3));
      m.hash_full_blocks(id, t, {}, computed[id]);
    } else if (kind < 6 && !tokens.empty()) {  // roll back the uncomputed tail
      auto it = std::next(tokens.begin(), long(rng() % tokens.size()));
      it->second.resize(size_t(computed[it->first]));
      m.truncate(it->first, int64_t(it->second.size()), step);
    } else if (kind < 8 && !tokens.empty()) {  // finish or preempt, maybe while its step runs
      auto it = std::next(tokens.begin(), long(rng() % tokens.size()));
      m.free(it->first, step - int64_t(rng() % 2));
      computed.erase(it->first);
      tokens.erase(it);
    } else {
      m.complete_step(step++);
    }
    m.check_invariants();
    std::set<int32_t> seen;
    for (auto& [id, t] : tokens)
      for (int32_t b : m.get(id)->block_ids) ASSERT_TRUE(seen.insert(b).second) << "block " << b << " in two tables";
  }
  EXPECT_GT(m.num_evictions(), 0);
}

// Through the engine: every step keeps the invariants; blocks of finished prompts stay findable
// under the chain computed from the prompt alone, with the engine's model seed.
TEST(KVCacheManager, EngineRecordsPrefixHashes) {
  EngineConfig ec;
  ec.model_identity = "toy@test";
  ec.scheduler.max_num_batched_tokens = 23;
  ec.kv_cache_memory_bytes = 8 * 24 + 40 * 64;
  ec.scheduler.max_num_seqs = 8;
  Engine eng(ec, std::make_unique<ToyModel>(), nullptr);
  std::vector<int32_t> shared = {0};
  for (int i = 1; i < 40; ++i) shared.push_back(2 + 'a' + i % 26);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 20;
  p.ignore_eos = true;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = shared;
    prompt.push_back(2 + i);
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompt), p, 0);
  }
  while (eng.has_unfinished()) {
    eng.step();
    eng.cache().check_invariants();
  }
  const KVCacheManager& c = eng.cache();
  const int64_t bt = c.geometry().block_tokens;
  uint64_t h = c.hash_seed();
  for (int64_t b = 0; b < int64_t(shared.size()) / bt; ++b) {
    h = block_hash(h, std::span(shared).subspan(size_t(b * bt), size_t(bt)));
    EXPECT_NE(c.find_cached(h), -1) << "prefix block " << b;
  }
  EXPECT_GT(c.num_cached_blocks(), 0);
  ec.model_identity = "other checkpoint";
  Engine other(ec, std::make_unique<ToyModel>(), nullptr);
  EXPECT_NE(other.cache().hash_seed(), c.hash_seed());
}
