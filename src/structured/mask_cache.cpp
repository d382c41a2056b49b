// Per-state token mask cache: see compiled.h for the accepted/rejected/uncertain split.
#include <algorithm>

#include "structured/compiled.h"
#include "structured/stack.h"

namespace deepinfer::structured {

std::shared_ptr<const StateMaskCache> CompiledGrammarImpl::state_cache(int32_t state) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (caches_.empty()) caches_.resize(pda.num_states());
    if (caches_[state]) return caches_[state];
  }
  auto c = compute_state_cache(state);  // outside the lock; a racing duplicate is harmless
  std::lock_guard<std::mutex> lock(mu_);
  if (!caches_[state]) caches_[state] = std::move(c);
  return caches_[state];
}

std::shared_ptr<const StateMaskCache> CompiledGrammarImpl::compute_state_cache(int32_t state) const {
  const TokenVocabulary& v = *vocab;
  NodePool pool;
  Stepper stepper(pda, pool, true);
  const size_t max_depth = static_cast<size_t>(v.max_depth_);
  std::vector<std::vector<Frame>> frames(max_depth + 1);  // [depth] frames after that many bytes
  std::vector<uint8_t> esc(max_depth + 1, 0);             // [depth] some prefix finished the rule
  // A rule nobody calls (the root) always has the real bottom of the stack under it: finishing
  // it is the end of the grammar, never an escape into unknown context.
  const bool called = pda.rule_called[pda.states[state].rule];
  frames[0] = {{state, called ? kBottom : kRootParent}};
  std::vector<int32_t> accepted, uncertain;
  const size_t n = v.num_nodes();
  for (size_t i = 1; i < n;) {
    const int32_t d = v.depth_[i];
    const std::vector<Frame>& prev = frames[d - 1];
    std::vector<Frame>& cur = frames[d];
    bool e = false;
    const PdaState* st = prev.size() == 1 ? &pda.states[prev[0].state] : nullptr;
    if (st && !st->has_calls && !st->final) {  // plain DFA step, the common case
      cur.clear();
      int32_t t = pda.next(prev[0].state, v.byte_[i]);
      if (t >= 0) cur.push_back({t, prev[0].parent});
    } else {
      stepper.step(prev, v.byte_[i], cur, &e);
    }
    esc[d] = esc[d - 1] | static_cast<uint8_t>(e);
    if (cur.empty()) {
      if (esc[d])
        for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[v.end_[i]]; ++k) uncertain.push_back(v.tok_ids_[k]);
      i = v.end_[i];
      continue;
    }
    for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[i + 1]; ++k) accepted.push_back(v.tok_ids_[k]);
    ++i;
  }
  auto c = std::make_shared<StateMaskCache>();
  const int32_t vs = v.vocab_size();
  if (accepted.size() * 32 > static_cast<size_t>(vs)) {
    c->accepted_bits.assign((vs + 31) / 32, 0);
    for (int32_t t : accepted) c->accepted_bits[t >> 5] |= 1u << (t & 31);
  } else {
    c->accepted_ids = std::move(accepted);
  }
  // The walk visits the trie in preorder, so `uncertain` is already byte-sorted.
  c->uncertain_lcp.resize(uncertain.size(), 0);
  for (size_t j = 1; j < uncertain.size(); ++j) {
    const std::string& a = v.bytes(uncertain[j - 1]);
    const std::string& b = v.bytes(uncertain[j]);
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    c->uncertain_lcp[j] = static_cast<int32_t>(l);
  }
  c->uncertain = std::move(uncertain);
  return c;
}

}  // namespace deepinfer::structured
