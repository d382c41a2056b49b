// Per-state token mask cache: see compiled.h for the accepted/rejected/uncertain split. The
// walks that fill an entry are in mask_walk.cpp.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <unordered_map>

#include "structured/compiled.h"
#include "structured/stack.h"

namespace deepinfer::structured {

namespace {

// Beyond this many reachable states: per-grammar cache only. Keys that large are schema
// specific (they rarely hit across grammars) and cost more to build than the fast walk
// (mask_walk.cpp) does; 4096 before the fast walk put ~500 keys of 0.3-0.9 ms each in the
// MaskBench-dev p99 tail. With keys cut at the per-byte token budget, 128 beats 256 (64 and
// 512 are worse): MaskBench-dev 300, per-mask min of 5-6 runs, p99 214-219 vs 218-232 us.
constexpr size_t kMaxSharedKeyStates = 128;
// String bodies (states looping on all JSON string text) are the exception: their walks are
// the most expensive (~10k trie nodes: every token holding a quote is followed past the string's
// end), and the "other key" state of every object with additionalProperties looks the same in
// every schema, so a larger key (tens of microseconds) is worth it there.
constexpr size_t kMaxTextKeyStates = 2048;

void put_i32(std::string& out, int32_t x) { out.append(reinterpret_cast<const char*>(&x), sizeof x); }

}  // namespace

std::string CompiledGrammarImpl::shared_key(int32_t state) const {
  const int32_t max_depth = vocab->max_depth_;
  const int32_t nc = pda.num_classes;
  // Label-correcting 0-1 search over the byte budget: `rem` is an upper bound on the bytes a
  // token can still hold when the walk is in a state (start: the longest token; a byte edge
  // on b: at most rem - 1 and at most vocab->after_byte_[b], the most bytes any token has
  // after a b; calls and returns: unchanged). Byte edges are encoded only where rem > 0, so
  // the key holds everything the walk can see (equal keys => equal context-independent
  // masks) but stops a few bytes past a quote or comma instead of a whole token length on.
  // canon: [num_states] state -> canonical index or -1; thread-local so that a key costs only
  // the states it touches (they are reset on the way out), not an allocation per call.
  // order / rem / queue are thread-local too: a key is built on most first visits (and hits the
  // shared cache ~90% of the time on Glaiveai2K), so its allocations were a quarter of its cost.
  thread_local std::vector<int32_t> canon;
  if (canon.size() < pda.num_states()) canon.assign(pda.num_states(), -1);
  thread_local std::vector<int32_t> order, rem;  // [canonical] state, byte budget
  thread_local std::deque<int32_t> queue;
  order.clear();
  rem.clear();
  queue.clear();
  struct Reset {
    std::vector<int32_t>& canon;
    std::vector<int32_t>& order;
    ~Reset() { for (int32_t s : order) canon[s] = -1; }
  } reset{canon, order};
  auto visit = [&](int32_t s, int32_t r, bool front) {
    int32_t& k = canon[s];
    if (k < 0) {
      k = static_cast<int32_t>(order.size());
      order.push_back(s);
      rem.push_back(r);
      front ? queue.push_front(k) : queue.push_back(k);
    } else if (r > rem[k]) {
      rem[k] = r;  // reached with more bytes left: revisit first
      queue.push_front(k);
    }
  };
  int32_t class_after[256];  // [class] most bytes after any byte of the class
  for (int32_t c = 0; c < nc; ++c) class_after[c] = -1;
  for (int b = 0; b < 256; ++b)
    class_after[pda.byte_class[b]] = std::max(class_after[pda.byte_class[b]], vocab->after_byte_[b]);
  const std::array<uint64_t, 4> loops = self_loops(state);
  const uint64_t* json = TokenVocabulary::kJsonText;
  const size_t limit = !(json[0] & ~loops[0]) && !(json[1] & ~loops[1]) ? kMaxTextKeyStates : kMaxSharedKeyStates;
  visit(state, max_depth, false);
  while (!queue.empty()) {
    int32_t k = queue.front();
    queue.pop_front();
    if (order.size() > limit) return {};
    const int32_t s = order[k];
    const int32_t r = rem[k];
    const PdaState& st = pda.states[s];
    for (int32_t c = st.calls_begin; c < st.calls_end; ++c) {
      visit(pda.rule_start[pda.calls[c].rule], r, true);
      visit(pda.calls[c].ret, r, true);
    }
    if (r <= 0) continue;
    const int32_t* row = &pda.trans[static_cast<size_t>(s) * nc];
    for (int32_t c = 0; c < nc; ++c)
      if (row[c] >= 0) visit(row[c], std::max(0, std::min(r - 1, class_after[c])), false);
  }
  // Byte classes are byte intervals in increasing order: class_lo[c] is the first byte of c.
  int32_t class_lo[257];
  for (int b = 255; b >= 0; --b) class_lo[pda.byte_class[b]] = b;
  class_lo[nc] = 256;
  // Encode in canonical order; byte edges as maximal byte ranges (class partitions differ
  // between grammars, the language does not), merging adjacent classes with one target.
  std::string key;
  key.reserve(order.size() * 16);
  key.push_back(pda.rule_called[pda.states[state].rule] ? 'c' : 'r');
  for (size_t k = 0; k < order.size(); ++k) {
    const int32_t s = order[k];
    const PdaState& st = pda.states[s];
    key.push_back(st.final ? 'F' : 'N');
    if (st.guard >= 0) {  // a key-set check: its full content (the same set gives the same answer)
      const PdaGuard& g = pda.guards[st.guard];
      key.push_back('G');
      key.push_back(static_cast<char>(g.kind));
      put_i32(key, g.key);
      put_i32(key, static_cast<int32_t>(g.keys.size()));
      for (uint64_t w : g.keys) key.append(reinterpret_cast<const char*>(&w), sizeof w);
    }
    for (int32_t c = st.calls_begin; c < st.calls_end; ++c) {
      key.push_back(pda.calls[c].tail ? 'T' : 'C');
      put_i32(key, canon[pda.rule_start[pda.calls[c].rule]]);
      put_i32(key, canon[pda.calls[c].ret]);
    }
    if (rem[k] <= 0) {
      key.push_back('|');
      continue;
    }
    const int32_t* row = &pda.trans[static_cast<size_t>(s) * nc];
    for (int32_t c = 0; c < nc;) {
      const int32_t t = row[c];
      int32_t e = c + 1;
      while (e < nc && row[e] == t) ++e;
      if (t >= 0) {
        key.push_back('E');
        key.push_back(static_cast<char>(class_lo[c]));
        key.push_back(static_cast<char>(class_lo[e] - 1));
        put_i32(key, canon[t]);
      }
      c = e;
    }
    key.push_back('.');
  }
  return key;
}

std::shared_ptr<const StateMaskCache> CompiledGrammarImpl::state_cache(int32_t state) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (caches_.empty()) caches_.resize(pda.num_states());
    if (caches_[state]) return caches_[state];
  }
  // Outside the lock; a racing duplicate is harmless.
  std::string key = shared_key(state);
  std::shared_ptr<const StateMaskCache> c = key.empty() ? nullptr : vocab->shared_masks_.find(key);
  if (!c) {
    c = compute_state_cache(state);
    if (!key.empty()) vocab->shared_masks_.insert(key, c);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (caches_.empty()) caches_.resize(pda.num_states());  // released meanwhile (release_mask_caches)
  if (!caches_[state]) caches_[state] = std::move(c);
  return caches_[state];
}

namespace {

// Return states whose pairs are filled per rule: a rule called from hundreds of places (the
// string body of every string property) gets the first ones the walk reaches.
constexpr size_t kMaxRetsPerRule = 64;

int64_t cache_bytes(const StateMaskCache& c) {
  return static_cast<int64_t>(sizeof c + c.accepted_bits.size() * sizeof(uint32_t) +
                              c.accepted_ids.size() * sizeof(int32_t) + c.uncertain.size() * sizeof(RankRange));
}
int64_t pair_bytes(const PairMaskCache& p) {
  return static_cast<int64_t>(sizeof p + p.accepted_ids.size() * sizeof(int32_t) + p.uncertain.size() * sizeof(RankRange));
}
int64_t subtree_bytes(const SubtreeResult& t) {
  return static_cast<int64_t>(sizeof t + t.words.size() * sizeof(uint64_t) + t.uncertain.size() * sizeof(RankRange));
}
// A map node and its bucket slot, roughly (libstdc++: next pointer, key, value, cached hash).
constexpr int64_t kMapNodeBytes = 48;

}  // namespace

MaskPrecomputeResult CompiledGrammarImpl::precompute_masks(const MaskPrecompute& opts,
                                                           const std::atomic<bool>* cancel) const {
  // Breadth first from the root's start state over byte edges, call edges (the callee's start
  // and the return state) alike: a request's first masks are at the states its first bytes
  // reach, so those are filled first and a budget cut keeps the ones needed soonest. Each
  // entry is exactly what the mask call would compute (state_cache), so no decision changes;
  // a mask that comes first simply computes its state itself (state_cache tolerates the race).
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  MaskPrecomputeResult r;
  auto wall_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
  auto thread_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  };
  const double cpu0 = opts.thread_cpu_budget ? thread_ms() : 0.0;
  auto elapsed_ms = [&] { return opts.thread_cpu_budget ? thread_ms() - cpu0 : wall_ms(); };
  if (opts.time_budget_ms <= 0 || pda.empty_language) {
    r.complete = opts.time_budget_ms > 0;
    return r;
  }
  const size_t n = pda.num_states();
  const int32_t nc = pda.num_classes;
  std::vector<uint8_t> seen(n, 0);  // [num_states]
  // Pair caches (compiled.h PairMaskCache), in the same breadth-first order: a state with many
  // uncertain tokens over the return state of each call edge into its rule (directly or
  // through tail calls), filled when the later of the two is reached, as masks inside that
  // callee (a string or number value) will ask for them.
  const size_t nr = pda.rule_start.size();
  std::vector<std::vector<int32_t>> tails(nr);    // [rule] rules its states tail-call
  for (size_t q = 0; q < n; ++q)
    for (int32_t c = pda.states[q].calls_begin; c < pda.states[q].calls_end; ++c) {
      auto& t = tails[pda.states[q].rule];
      if (pda.calls[c].tail && std::find(t.begin(), t.end(), pda.calls[c].rule) == t.end()) t.push_back(pda.calls[c].rule);
    }
  std::vector<std::vector<int32_t>> rets(nr);     // [rule] return states of the call edges seen into it
  std::vector<std::vector<int32_t>> pending(nr);  // [rule] its reached states with many uncertain tokens
  auto out_of_budget = [&] {
    return (cancel && cancel->load(std::memory_order_relaxed)) || elapsed_ms() >= opts.time_budget_ms ||
           r.bytes >= opts.max_cache_bytes;
  };
  auto fill_pair = [&](int32_t s, int32_t ret) {
    r.bytes += pair_bytes(*pair_cache(s, ret));
    ++r.pairs;
  };
  auto add_ret = [&](int32_t rule, int32_t ret) {
    std::vector<int32_t> work{rule};
    while (!work.empty() && !out_of_budget()) {
      const int32_t q = work.back();
      work.pop_back();
      auto& rs = rets[q];
      if (rs.size() >= kMaxRetsPerRule || std::find(rs.begin(), rs.end(), ret) != rs.end()) continue;
      rs.push_back(ret);
      for (int32_t s : pending[q])
        if (!out_of_budget()) fill_pair(s, ret);
      work.insert(work.end(), tails[q].begin(), tails[q].end());
    }
  };
  std::deque<int32_t> queue;
  auto visit = [&](int32_t s) {
    if (s >= 0 && !seen[s]) {
      seen[s] = 1;
      queue.push_back(s);
    }
  };
  visit(pda.rule_start[pda.root]);
  while (!queue.empty()) {
    if (out_of_budget()) {
      r.ms = wall_ms();
      return r;  // incomplete
    }
    const int32_t s = queue.front();
    queue.pop_front();
    const PdaState& st = pda.states[s];
    // A dead end is never a mask's state: the matcher pops it to the frame below (matcher.cpp).
    if (!st.dead_end) {
      const std::shared_ptr<const StateMaskCache> c = state_cache(s);
      r.bytes += cache_bytes(*c);
      ++r.states;
      if (c->num_uncertain() >= kMinPairTokens) {
        pending[st.rule].push_back(s);
        for (int32_t ret : rets[st.rule])
          if (!out_of_budget()) fill_pair(s, ret);
      }
    }
    for (int32_t c = st.calls_begin; c < st.calls_end; ++c) {
      visit(pda.rule_start[pda.calls[c].rule]);
      visit(pda.calls[c].ret);
      if (!pda.calls[c].tail) add_ret(pda.calls[c].rule, pda.calls[c].ret);
    }
    const int32_t* row = &pda.trans[static_cast<size_t>(s) * nc];
    for (int32_t c = 0; c < nc; ++c) visit(row[c]);
  }
  r.complete = true;
  r.ms = wall_ms();
  return r;
}

int64_t CompiledGrammarImpl::mask_cache_bytes() const {
  // An entry shared by several states (or with the vocabulary's cache) is counted at each: the
  // ledger wants an upper bound, and sharing inside one grammar is rare (state keys differ).
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes += static_cast<int64_t>(caches_.capacity() * sizeof caches_[0]);
    for (const auto& c : caches_)
      if (c) bytes += cache_bytes(*c);
  }
  {
    std::lock_guard<std::mutex> lock(pair_mu_);
    for (const auto& [k, p] : pairs_) bytes += kMapNodeBytes + pair_bytes(*p);
  }
  std::lock_guard<std::mutex> lock(sub_mu_);
  for (const auto& [k, t] : subtrees_) bytes += kMapNodeBytes + subtree_bytes(*t);
  return bytes;
}

int64_t CompiledGrammarImpl::release_mask_caches() const {
  const int64_t bytes = mask_cache_bytes();
  // Swapped out under each lock, destroyed outside it (a mask call holding a copy keeps that
  // entry alive until it is done; state_cache re-sizes the emptied table on its next call).
  std::vector<std::shared_ptr<const StateMaskCache>> caches;
  std::unordered_map<uint64_t, std::shared_ptr<const PairMaskCache>> pairs;
  std::unordered_map<uint64_t, std::shared_ptr<const SubtreeResult>> subtrees;
  {
    std::lock_guard<std::mutex> lock(mu_);
    caches.swap(caches_);
  }
  {
    std::lock_guard<std::mutex> lock(pair_mu_);
    pairs.swap(pairs_);
  }
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    subtrees.swap(subtrees_);
  }
  return bytes;
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

void precompute_common_masks(const std::shared_ptr<const TokenVocabulary>& vocab) {
  // Grammars whose called rules are the shared lexical ones: any JSON value (object, array,
  // string, number), strings and numbers as property values.
  for (const char* args : {R"({"json_object": true})", R"({"json_schema": {"type": "array", "items": {"type": "string"}}})",
                           R"({"json_schema": {"type": "array", "items": {"type": "integer"}}})"}) {
    CompiledGrammarImpl g;
    g.grammar = lower_so_args(args);
    g.pda = build_pda(g.grammar, AutomatonLimits{});
    g.vocab = vocab;
    for (size_t s = 0; s < g.pda.num_states(); ++s)
      if (g.pda.rule_called[g.pda.states[s].rule]) g.state_cache(static_cast<int32_t>(s));
  }
}

}  // namespace deepinfer::structured
