// Pair mask caches (compiled.h PairMaskCache): a state's uncertain tokens decided with the
// return state of the frame below it known. The real-stack re-walk of a mask (matcher.cpp
// walk_ranks) then only steps the tokens that leave the caller's rule as well.
#include <algorithm>

#include "structured/compiled.h"
#include "structured/stack.h"

namespace deepinfer::structured {

namespace {

void push_range(std::vector<RankRange>& out, int32_t lo, int32_t hi) {
  if (lo >= hi) return;
  if (!out.empty() && out.back().hi == lo) out.back().hi = hi;
  else out.push_back({lo, hi});
}

}  // namespace

std::shared_ptr<const PairMaskCache> CompiledGrammarImpl::compute_pair_cache(int32_t state, int32_t ret,
                                                                             bool reference) const {
  const TokenVocabulary& v = *vocab;
  auto out = std::make_shared<PairMaskCache>();
  // The top frame's key set is unknown here, and a frame that passed a key-set check with it
  // would lose that mark when it returns into `ret`'s frame (unguarded() only sees the frames
  // still on the stack): e.g. `}]` after a string value inside a tracked object in an array,
  // alive whatever keys were written. So a state whose rule checks key sets gets no pair cache.
  // (Frames the walk pushes start with the empty set, exactly as in the real stack, and
  // `ret`'s own frame never returns without the walk escaping.)
  const int32_t rule = pda.states[state].rule;
  for (const PdaState& st : pda.states)
    if (st.rule == rule && st.guard >= 0) {
      out->gave_up = true;
      return out;
    }
  const std::shared_ptr<const StateMaskCache> base = state_cache(state);
  NodePool pool;
  // The frame below: `ret` over an unknown context; both key sets unknown, so a key-set check
  // on the way leaves its tokens uncertain (Stepper::enter marks them kGuardedSet).
  const int32_t below = pool.intern({ret, kBottom, kUnknownSet}, false);
  Stepper stepper(pda, pool, true);
  std::vector<std::vector<Frame>> frames(1, std::vector<Frame>{{state, below, kUnknownSet}});  // [depth]
  std::vector<uint8_t> esc(1, 0);  // [depth] some prefix finished `ret`'s rule (left the known part)
  std::string_view prev;           // the last walked token; frames[0..valid] hold its prefix
  size_t valid = 0;
  int64_t steps = 0;  // byte steps so far (an upper bound: a token may die early)
  for (const RankRange& r : base->uncertain) {
    for (int32_t k = r.lo; k < r.hi;) {
      const int32_t id = v.tok_ids_[k];
      const std::string& s = v.bytes(id);
      size_t l = 0;
      if (!reference) {
        const size_t lmax = std::min({prev.size(), s.size(), valid});
        while (l < lmax && prev[l] == s[l]) ++l;
      }
      if (frames.size() < s.size() + 1) {
        frames.resize(s.size() + 1);
        esc.resize(s.size() + 1);
      }
      size_t d = l;
      if (!reference && (steps += s.size() - l) > kMaxPairSteps) {
        out->accepted_ids.clear();
        out->uncertain.clear();
        out->gave_up = true;
        return out;
      }
      for (; d < s.size(); ++d) {
        bool e = false;
        stepper.step(frames[d], static_cast<uint8_t>(s[d]), frames[d + 1], &e);
        esc[d + 1] = esc[d] | static_cast<uint8_t>(e);
        if (frames[d + 1].empty()) break;
      }
      prev = s;
      if (d == s.size()) {
        valid = s.size();
        if (unguarded(pool, frames[d])) out->accepted_ids.push_back(id);
        else push_range(out->uncertain, k, k + 1);
        ++k;
        continue;
      }
      valid = d;
      int32_t hi = k + 1;
      if (!reference) {
        // Died on byte d: so does every token below the trie node of s[0..d] (depth d + 1),
        // with the same escape flag; within this range they are skipped at once (those in
        // later ranges are stepped again from the shared prefix and die the same way).
        int32_t node = v.node_of_[id];
        for (int32_t depth = static_cast<int32_t>(s.size()); depth > static_cast<int32_t>(d) + 1; --depth)
          node = v.parent_[node];
        hi = std::min(r.hi, v.tok_begin_[v.end_[node]]);
      }
      if (esc[d + 1]) push_range(out->uncertain, k, hi);  // the context below `ret` decides
      k = hi;
    }
  }
  pool.clear_scratch();
  return out;
}

std::shared_ptr<const PairMaskCache> CompiledGrammarImpl::pair_cache(int32_t state, int32_t ret) const {
  const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32 | static_cast<uint32_t>(ret);
  {
    std::lock_guard<std::mutex> lock(pair_mu_);
    if (auto it = pairs_.find(key); it != pairs_.end()) return it->second;
  }
  // Outside the lock; a racing duplicate computes an equal entry.
  std::shared_ptr<const PairMaskCache> c = compute_pair_cache(state, ret);
  std::lock_guard<std::mutex> lock(pair_mu_);
  return pairs_.emplace(key, std::move(c)).first->second;
}

}  // namespace deepinfer::structured
