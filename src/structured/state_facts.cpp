// What the mask walks (mask_walk.cpp) ask about a single state's text, each answer memoised per
// state in StateFacts (compiled.h): its self-loops, whether text made of them or of any JSON text
// byte can die from it (text_stays_alive, text_any_alive), the length of the shortest text that
// kills it (text_death), its chain of single-target steps (chain_step, chain_run), a counter over a
// byte class (counted_text_left), and state equivalence for sharing subtrees (equivalent, canonical).
#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <unordered_map>

#include "structured/compiled.h"
#include "structured/text_chain.h"

namespace deepinfer::structured {
namespace {

// [byte] last byte of its class: bytes of one class step alike, so one byte per class is
// enough within a range.
void class_ends(const Pda& pda, int class_end[256]) {
  for (int b = 255; b >= 0; --b)
    class_end[b] = b < 255 && pda.byte_class[b + 1] == pda.byte_class[b] ? class_end[b + 1] : b;
}

}  // namespace

// True if text made of `state`'s self-loop ASCII bytes and valid multi-byte UTF-8 characters
// never dies from `state`: the states it reaches (a small set: the DFAs are not minimised, so
// a string body may come back from a character to a twin of `state`) are closed under those
// bytes and characters. Then a subtree below a node in `state` whose ASCII bytes loop and
// whose other bytes are valid UTF-8 is all alive. Characters follow the strict decoder in
// vocab.cpp.
// Valid multi-byte UTF-8 characters: text_chain_utf8_chars() (text_chain.h), one table for both walks.
// max_closure bounds the states visited (past it: false). On true, *members (if given) gets
// the closure, each member of which then stays alive under the same text too. On false
// because some text dies, *dead_path (if given) gets the states on the path from `state` to
// the one it dies at: each of them reaches that death by text, so none stays alive.
bool text_stays_alive(const Pda& pda, int32_t state, const std::array<uint64_t, 4>& loops, size_t max_closure,
                      std::vector<int32_t>* members, std::vector<int32_t>* dead_path) {
  using R = TextSpan;
  const auto& kChars = text_chain_utf8_chars();
  int class_end[256];
  class_ends(pda, class_end);
  std::vector<int32_t> closure{state}, parent{-1}, cur, next;
  auto add = [&](int32_t t, int32_t from) {
    if (std::find(closure.begin(), closure.end(), t) == closure.end()) closure.push_back(t), parent.push_back(from);
  };
  auto dies_at = [&](size_t k) {
    if (dead_path)
      for (int32_t j = static_cast<int32_t>(k); j >= 0; j = parent[j]) dead_path->push_back(closure[j]);
    return false;
  };
  for (size_t k = 0; k < closure.size(); ++k) {
    if (closure.size() > max_closure) return false;
    const int32_t s = closure[k];
    if (pda.states[s].guard >= 0) return false;  // key-set checks are for the general walk
    // Every byte of the set (a class may hold bytes in and out of it, e.g. `"` beside `!`).
    for (int b = 0; b < 128; ++b) {
      if (!(loops[b >> 6] >> (b & 63) & 1)) continue;
      const int32_t t = pda.next(s, static_cast<uint8_t>(b));
      if (t < 0) return dies_at(k);
      add(t, static_cast<int32_t>(k));
    }
    for (const auto& ch : kChars) {
      cur.assign(1, s);
      for (const R& r : ch) {
        next.clear();
        for (int32_t u : cur)
          for (int b = r.lo; b <= r.hi; b = class_end[b] + 1) {
            const int32_t t = pda.next(u, static_cast<uint8_t>(b));
            if (t < 0) return dies_at(k);
            if (std::find(next.begin(), next.end(), t) == next.end()) next.push_back(t);
          }
        std::swap(cur, next);
      }
      for (int32_t t : cur) add(t, static_cast<int32_t>(k));
    }
  }
  if (members) *members = std::move(closure);
  return true;
}

CompiledGrammarImpl::StateFacts* CompiledGrammarImpl::state_facts() const {
  std::call_once(facts_once_, [&] { facts_ = std::make_unique<StateFacts[]>(pda.num_states()); });
  return facts_.get();
}

// Exact equivalence by a joint walk over state pairs. Bounded: past kMaxPairs the states are
// treated as different, which only costs sharing (twin "other key" states differ in a handful
// of escape and UTF-8 states; counters such as maxLength chains never match and must fail fast).
bool CompiledGrammarImpl::equivalent(int32_t a, int32_t b) const {
  constexpr size_t kMaxPairs = 48;
  const int32_t nc = pda.num_classes;
  std::vector<std::pair<int32_t, int32_t>> seen{{a, b}};
  for (size_t k = 0; k < seen.size(); ++k) {
    const auto [x, y] = seen[k];
    if (x == y) continue;
    const PdaState& sx = pda.states[x];
    const PdaState& sy = pda.states[y];
    if (sx.final != sy.final || sx.guard != sy.guard || pda.rule_called[sx.rule] != pda.rule_called[sy.rule] ||
        sx.calls_end - sx.calls_begin != sy.calls_end - sy.calls_begin)
      return false;
    auto pair = [&](int32_t u, int32_t w) {
      if (std::find(seen.begin(), seen.end(), std::make_pair(u, w)) == seen.end()) seen.push_back({u, w});
    };
    for (int32_t c = 0; c < sx.calls_end - sx.calls_begin; ++c) {
      const PdaCall& cx = pda.calls[sx.calls_begin + c];
      const PdaCall& cy = pda.calls[sy.calls_begin + c];
      if (cx.rule != cy.rule || cx.tail != cy.tail) return false;
      pair(cx.ret, cy.ret);
    }
    const int32_t* rx = &pda.trans[static_cast<size_t>(x) * nc];
    const int32_t* ry = &pda.trans[static_cast<size_t>(y) * nc];
    for (int32_t c = 0; c < nc; ++c) {
      if ((rx[c] < 0) != (ry[c] < 0)) return false;
      if (rx[c] >= 0 && (c == 0 || rx[c] != rx[c - 1] || ry[c] != ry[c - 1])) pair(rx[c], ry[c]);
    }
    if (seen.size() > kMaxPairs) return false;
  }
  return true;
}

int32_t CompiledGrammarImpl::canonical(int32_t state) const {
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    auto it = canon_.find(state);
    if (it != canon_.end()) return it->second;
  }
  // Shape hash: finality, calls, and per class whether the transition is missing, a self-loop
  // or something else (equal for equivalent states).
  const int32_t nc = pda.num_classes;
  const PdaState& st = pda.states[state];
  uint64_t h = (st.final ? 3 : 5) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(st.calls_end - st.calls_begin) ^
               static_cast<uint64_t>(st.guard + 1) << 40;
  for (int32_t c = 0; c < nc; ++c) {
    const int32_t t = pda.trans[static_cast<size_t>(state) * nc + c];
    h = (h ^ static_cast<uint64_t>(t < 0 ? 0 : t == state ? 1 : 2)) * 0x100000001b3ull;
  }
  std::vector<int32_t> reps;
  {
    std::lock_guard<std::mutex> lock(sub_mu_);
    reps = canon_buckets_[h];
  }
  int32_t rep = state;
  for (int32_t r : reps)
    if (equivalent(state, r)) {
      rep = r;
      break;
    }
  std::lock_guard<std::mutex> lock(sub_mu_);
  if (rep == state && canon_buckets_[h].size() < 4) canon_buckets_[h].push_back(state);
  return canon_.emplace(state, rep).first->second;
}

bool CompiledGrammarImpl::text_any_alive(int32_t state) const {
  StateFacts* facts = state_facts();
  int8_t known = facts[state].text_any.load(std::memory_order_relaxed);
  if (known >= 0) return known == 1;
  const uint64_t* json = TokenVocabulary::kJsonText;
  const ChainStep c = chain_step(state);
  if (c.next >= 0 && c.utf8 && !(json[0] & ~c.ascii[0]) && !(json[1] & ~c.ascii[1])) {
    // A counter (every text character one step along): alive under any token's text exactly
    // when its chain outlasts the longest token. Its closure would be the whole count.
    known = chain_run(state, true) >= vocab->max_depth_ ? 1 : 0;
  } else {
    // A searched pattern's states step text among themselves: the closure may hold a few
    // hundred (a run of 162 characters searched for); each member of a closure that stays
    // alive stays alive too, so one closure decides all of them.
    constexpr size_t kMaxTextClosure = 512;
    std::vector<int32_t> members, dead;
    known = text_stays_alive(pda, state, {json[0], json[1], 0, 0}, kMaxTextClosure, &members, &dead) ? 1 : 0;
    for (int32_t m : members) facts[m].text_any.store(1, std::memory_order_relaxed);
    for (int32_t m : dead) facts[m].text_any.store(0, std::memory_order_relaxed);  // a counter: one walk, not one per position
  }
  facts[state].text_any.store(known, std::memory_order_relaxed);
  return known == 1;
}

int32_t CompiledGrammarImpl::text_death(int32_t state) const {
  StateFacts* facts = state_facts();
  const int32_t known = facts[state].text_death.load(std::memory_order_relaxed);
  if (known >= 0) return known;
  // The pairs (state, UTF-8 decoder state) text reaches from (state, 0), and their text edges
  // (reversed below). A pair whose state's text_death is known is not expanded: its value
  // bounds the paths through it. Then the shortest distance to a death, by buckets.
  constexpr size_t kMaxPairs = 1024;
  const int32_t cap = vocab->max_depth_ + 1;
  const int32_t kInf = INT32_MAX;
  std::vector<uint64_t> pairs;  // state << 3 | decoder state
  std::vector<int32_t> dist;
  std::vector<std::pair<int32_t, int32_t>> edges;  // (to, from) pair indices
  std::unordered_map<uint64_t, int32_t> index;
  auto pair_id = [&](int32_t s, int u) {
    const auto [it, fresh] = index.emplace(static_cast<uint64_t>(s) << 3 | static_cast<uint64_t>(u),
                                           static_cast<int32_t>(pairs.size()));
    if (fresh) pairs.push_back(it->first), dist.push_back(kInf);
    return it->second;
  };
  pair_id(state, 0);
  for (size_t k = 0; k < pairs.size(); ++k) {
    if (pairs.size() > kMaxPairs) {
      // Too many to search: no claim, for every boundary state met (each would search again).
      for (uint64_t q : pairs)
        if ((q & 7) == 0) {
          int32_t unknown = -1;
          facts[q >> 3].text_death.compare_exchange_strong(unknown, 0, std::memory_order_relaxed);
        }
      return facts[state].text_death.load(std::memory_order_relaxed);
    }
    const int32_t s = static_cast<int32_t>(pairs[k] >> 3);
    const int u = static_cast<int>(pairs[k] & 7);
    if (k > 0 && u == 0) {
      const int32_t m = facts[s].text_death.load(std::memory_order_relaxed);
      if (m >= 0) {
        dist[k] = m;
        continue;
      }
    }
    int32_t last_t = -1, last_u = -1;
    for (int b = u == 0 ? 0x20 : 0x80; b < (u == 0 ? 0xF5 : 0xC0); ++b) {
      if (b < 0x80 && !ascii_text(static_cast<uint8_t>(b))) continue;
      const int nu = utf8_step(u, static_cast<uint8_t>(b));
      if (nu < 0) continue;
      const int32_t t = pda.next(s, static_cast<uint8_t>(b));
      if (t < 0 || pda.states[t].guard >= 0) {  // dies (or needs the key set): one byte
        dist[k] = 1;
        break;
      }
      if (t == last_t && nu == last_u) continue;
      last_t = t, last_u = nu;
      edges.push_back({pair_id(t, nu), static_cast<int32_t>(k)});
    }
  }
  const size_t np = pairs.size();
  std::vector<int32_t> rbegin(np + 1, 0), rfrom(edges.size());
  for (const auto& e : edges) ++rbegin[e.first + 1];
  for (size_t k = 0; k < np; ++k) rbegin[k + 1] += rbegin[k];
  {
    std::vector<int32_t> at(rbegin.begin(), rbegin.end() - 1);
    for (const auto& e : edges) rfrom[at[e.first]++] = e.second;
  }
  std::vector<std::vector<int32_t>> bucket(static_cast<size_t>(cap) + 1);
  for (size_t k = 0; k < np; ++k)
    if (dist[k] <= cap) bucket[dist[k]].push_back(static_cast<int32_t>(k));
  for (int32_t d = 0; d < cap; ++d)
    for (size_t j = 0; j < bucket[d].size(); ++j) {
      const int32_t k = bucket[d][j];
      if (dist[k] != d) continue;
      for (int32_t r = rbegin[k]; r < rbegin[k + 1]; ++r)
        if (dist[rfrom[r]] > d + 1) dist[rfrom[r]] = d + 1, bucket[d + 1].push_back(rfrom[r]);
    }
  for (size_t k = 0; k < np; ++k)
    if ((pairs[k] & 7) == 0) {
      int32_t unknown = -1;
      facts[pairs[k] >> 3].text_death.compare_exchange_strong(unknown, std::min(dist[k], cap),
                                                              std::memory_order_relaxed);
    }
  return facts[state].text_death.load(std::memory_order_relaxed);
}

// Computed per state on first use: a walk touches few states, a grammar may have many.
std::array<uint64_t, 4> CompiledGrammarImpl::self_loops(int32_t state) const {
  StateFacts& f = state_facts()[state];
  std::array<uint64_t, 4> l{0, 0, 0, 0};
  if (f.loops_known.load(std::memory_order_acquire)) {
    for (int w = 0; w < 4; ++w) l[w] = f.loops[w].load(std::memory_order_relaxed);
    return l;
  }
  for (int b = 0; b < 256; ++b)
    if (pda.next(state, static_cast<uint8_t>(b)) == state) l[b >> 6] |= 1ull << (b & 63);
  for (int w = 0; w < 4; ++w) f.loops[w].store(l[w], std::memory_order_relaxed);
  f.loops_known.store(1, std::memory_order_release);
  return l;
}

// The chain step of a state: the target most ASCII bytes lead to, those bytes, and whether
// every valid multi-byte character leads there too. Memoised per state.
CompiledGrammarImpl::ChainStep CompiledGrammarImpl::chain_step(int32_t state) const {
  StateFacts& f = state_facts()[state];
  if (f.chain_known.load(std::memory_order_acquire))
    return {{f.chain_ascii[0].load(std::memory_order_relaxed), f.chain_ascii[1].load(std::memory_order_relaxed)},
            f.chain_next.load(std::memory_order_relaxed), f.chain_utf8.load(std::memory_order_relaxed) != 0};
  const int32_t nc = pda.num_classes;
  const int32_t* row = &pda.trans[static_cast<size_t>(state) * nc];
  // The most common target over the ASCII bytes (classes are byte intervals: one lookup each).
  int32_t tgt[8], cnt[8], k = 0;
  for (int b = 0; b < 128;) {
    const int c = pda.byte_class[b];
    int e = b + 1;
    while (e < 128 && pda.byte_class[e] == c) ++e;
    const int32_t t = row[c];
    if (t >= 0) {
      int j = 0;
      while (j < k && tgt[j] != t) ++j;
      if (j == k && k < 8) tgt[k] = t, cnt[k++] = 0;
      if (j < k) cnt[j] += e - b;
    }
    b = e;
  }
  int32_t best = -1, best_n = 0;
  for (int j = 0; j < k; ++j)
    if (cnt[j] > best_n) best = tgt[j], best_n = cnt[j];
  if (best >= 0 && pda.states[best].guard >= 0) best = -1;  // no chain through key-set checks
  int class_end[256];
  if (best >= 0) class_ends(pda, class_end);
  ChainStep r{{0, 0}, best, false};
  if (best >= 0) {
    for (int b = 0; b < 128; ++b)
      if (pda.next(state, static_cast<uint8_t>(b)) == best) r.ascii[b >> 6] |= 1ull << (b & 63);
    // Every valid multi-byte character must end exactly in `best` (its prefixes alive).
    r.utf8 = true;
    std::vector<int32_t> cur, nxt;
    for (const auto& ch : text_chain_utf8_chars()) {
      cur.assign(1, state);
      for (const TextSpan& sp : ch) {
        nxt.clear();
        for (int32_t u : cur)
          for (int b = sp.lo; b <= sp.hi; b = class_end[b] + 1) {
            const int32_t t = pda.next(u, static_cast<uint8_t>(b));
            if (t < 0) { r.utf8 = false; break; }
            if (std::find(nxt.begin(), nxt.end(), t) == nxt.end()) nxt.push_back(t);
          }
        if (!r.utf8 || nxt.size() > 8) { r.utf8 = false; break; }
        std::swap(cur, nxt);
      }
      if (!r.utf8) break;
      for (int32_t t : cur)
        if (t != best) r.utf8 = false;
      if (!r.utf8) break;
    }
  }
  f.chain_ascii[0].store(r.ascii[0], std::memory_order_relaxed);
  f.chain_ascii[1].store(r.ascii[1], std::memory_order_relaxed);
  f.chain_next.store(r.next, std::memory_order_relaxed);
  f.chain_utf8.store(r.utf8 ? 1 : 0, std::memory_order_relaxed);
  f.chain_known.store(1, std::memory_order_release);
  return r;
}

int32_t CompiledGrammarImpl::chain_run(int32_t state, bool utf8) const {
  StateFacts& f = state_facts()[state];
  std::atomic<int32_t>& memo = utf8 ? f.run_utf8 : f.run_ascii;
  int32_t run = memo.load(std::memory_order_relaxed);
  if (run >= 0) return run;
  // Follow the chain while each state steps (at least) this state's bytes to its successor;
  // a state stepping to itself repeats forever.
  const int32_t cap = vocab->max_depth_;
  const ChainStep first = chain_step(state);
  run = 0;
  for (int32_t s = state; run < cap;) {
    const ChainStep c = s == state ? first : chain_step(s);
    if (c.next < 0 || (first.ascii[0] & ~c.ascii[0]) || (first.ascii[1] & ~c.ascii[1]) || (utf8 && !c.utf8)) break;
    if (c.next == s) {
      run = cap;
      break;
    }
    ++run;
    s = c.next;
  }
  memo.store(run, std::memory_order_relaxed);
  return run;
}

int32_t CompiledGrammarImpl::counted_text_left(int32_t state, bool* long_uncertain, uint64_t counted[2],
                                               bool* all_text_out) const {
  const int32_t max_le = static_cast<int32_t>(vocab->text_le_.size()) - 1;
  const ChainStep first = chain_step(state);
  const uint64_t* json = TokenVocabulary::kJsonText;
  if (first.next < 0) return -1;
  // What is counted: every text character (a string with length bounds), or the ASCII text
  // bytes of a class (a pattern's class with length bounds, e.g. [ -}]{30}; tokens with other
  // bytes are walked).
  const bool all_text = first.utf8 && !(json[0] & ~first.ascii[0]) && !(json[1] & ~first.ascii[1]);
  *all_text_out = all_text;  // not the same as counted == kJsonText: all ASCII text, no multi-byte
  counted[0] = all_text ? json[0] : first.ascii[0] & json[0];
  counted[1] = all_text ? json[1] : first.ascii[1] & json[1];
  if (!(counted[0] | counted[1])) return -1;
  const int32_t run = chain_run(state, all_text);
  if (run < 1 || run > max_le || run >= vocab->max_depth_) return -1;
  const bool called = pda.rule_called[pda.states[state].rule];
  // The chain's states s_0 .. s_run: no calls (a callee could keep longer text alive). One
  // that can finish a called rule makes the longer tokens, which die after it, uncertain
  // rather than rejected (the block of a counted string ends so). chain_run checked that each
  // of s_0 .. s_{run-1} steps every counted character to the next.
  *long_uncertain = false;
  int32_t s = state;
  for (int32_t k = 0;; ++k) {
    const PdaState& st = pda.states[s];
    if (st.has_calls) return -1;
    if (called && st.final) *long_uncertain = true;
    if (k == run) break;
    s = chain_step(s).next;
  }
  // s_run: no counted byte (and for all text, no multi-byte lead) leaves it.
  for (int b = 0x20; b < 0x80; ++b)
    if ((counted[b >> 6] >> (b & 63) & 1) && pda.next(s, static_cast<uint8_t>(b)) >= 0) return -1;
  if (all_text)
    for (int b = 0xC2; b <= 0xF4; ++b)
      if (pda.next(s, static_cast<uint8_t>(b)) >= 0) return -1;
  return run;
}

}  // namespace deepinfer::structured
