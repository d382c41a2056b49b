// The vocabulary walks that fill a StateMaskCache entry (compiled.h): a fast walk used at run
// time and the plain reference walk it must equal (tests compare them).
//
// Both visit the token trie in preorder from a stack holding only `state` (context below
// unknown: kBottom, or the real bottom for a rule nobody calls), skipping a subtree as soon as
// its prefix dies. The fast walk keeps, per trie depth, the configuration as one DFA state
// while the stack has not moved (no call entered, no frame popped), which is the common case:
// a step is then one table lookup. Only at states with calls does it switch to the general
// multi-frame Stepper, and it switches back as soon as the configuration is again a single
// frame over the original bottom. A subtree whose bytes all loop on the current state, or
// whose ASCII bytes loop and whose other bytes are valid UTF-8 that the state's text closure
// survives (a string body), is accepted whole without visiting it.
#include <algorithm>
#include <atomic>

#include "structured/compiled.h"
#include "structured/stack.h"

namespace deepinfer::structured {
namespace {

// accepted_bits: [ceil(vocab/32)] accepted token bits; uncertain in trie preorder.
std::shared_ptr<const StateMaskCache> finish_cache(const TokenVocabulary& v, std::vector<uint32_t> accepted_bits,
                                                   size_t num_accepted, std::vector<int32_t> uncertain) {
  auto c = std::make_shared<StateMaskCache>();
  const int32_t vs = v.vocab_size();
  if (num_accepted * 32 > static_cast<size_t>(vs)) {
    c->accepted_bits = std::move(accepted_bits);
  } else {
    c->accepted_ids.reserve(num_accepted);
    for (size_t w = 0; w < accepted_bits.size(); ++w)
      for (uint32_t x = accepted_bits[w]; x; x &= x - 1)
        c->accepted_ids.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
  }
  // The walks visit the trie in preorder, so `uncertain` is already byte-sorted.
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

// True if text made of `state`'s self-loop ASCII bytes and valid multi-byte UTF-8 characters
// never dies from `state`: the states it reaches (a small set: the DFAs are not minimised, so
// a string body may come back from a character to a twin of `state`) are closed under those
// bytes and characters. Then a subtree below a node in `state` whose ASCII bytes loop and
// whose other bytes are valid UTF-8 is all alive. Characters follow the strict decoder in
// vocab.cpp.
bool text_stays_alive(const Pda& pda, int32_t state, const std::array<uint64_t, 4>& loops) {
  struct R { uint8_t lo, hi; };
  static const std::vector<std::vector<R>> kChars = {
      {{0xC2, 0xDF}, {0x80, 0xBF}},
      {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
      {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
      {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}};
  constexpr size_t kMaxClosure = 32;
  // Bytes of one class step alike: visit one byte per class within each range.
  int class_end[256];  // [byte] last byte of its class
  for (int b = 255; b >= 0; --b)
    class_end[b] = b < 255 && pda.byte_class[b + 1] == pda.byte_class[b] ? class_end[b + 1] : b;
  std::vector<int32_t> closure{state}, cur, next;
  auto add = [&](int32_t t) {
    if (std::find(closure.begin(), closure.end(), t) == closure.end()) closure.push_back(t);
  };
  for (size_t k = 0; k < closure.size(); ++k) {
    if (closure.size() > kMaxClosure) return false;
    const int32_t s = closure[k];
    for (int b = 0; b < 128; b = class_end[b] + 1) {
      if (!(loops[b >> 6] >> (b & 63) & 1)) continue;  // loops hold whole classes
      const int32_t t = pda.next(s, static_cast<uint8_t>(b));
      if (t < 0) return false;
      add(t);
    }
    for (const auto& ch : kChars) {
      cur.assign(1, s);
      for (const R& r : ch) {
        next.clear();
        for (int32_t u : cur)
          for (int b = r.lo; b <= r.hi; b = class_end[b] + 1) {
            const int32_t t = pda.next(u, static_cast<uint8_t>(b));
            if (t < 0) return false;
            if (std::find(next.begin(), next.end(), t) == next.end()) next.push_back(t);
          }
        std::swap(cur, next);
      }
      for (int32_t t : cur) add(t);
    }
  }
  return true;
}

}  // namespace

CompiledGrammarImpl::StateFacts* CompiledGrammarImpl::state_facts() const {
  std::call_once(facts_once_, [&] { facts_ = std::make_unique<StateFacts[]>(pda.num_states()); });
  return facts_.get();
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

std::shared_ptr<const StateMaskCache> CompiledGrammarImpl::compute_state_cache(int32_t state) const {
  const TokenVocabulary& v = *vocab;
  NodePool pool;
  Stepper stepper(pda, pool, true);
  const bool called = pda.rule_called[pda.states[state].rule];
  const int32_t bottom = called ? kBottom : kRootParent;
  const size_t max_depth = static_cast<size_t>(v.max_depth_);
  // Per depth d (bytes consumed so far): single[d] >= 0 when the configuration is the one frame
  // {single[d], bottom}; otherwise frames[d] holds it. esc[d]: some prefix finished the rule.
  std::vector<int32_t> single(max_depth + 1, -1);
  std::vector<std::vector<Frame>> frames(max_depth + 1);
  std::vector<uint8_t> esc(max_depth + 1, 0);
  single[0] = state;
  const int32_t nc = pda.num_classes;
  const int32_t* trans = pda.trans.data();
  const PdaState* states = pda.states.data();
  const uint8_t* bytes = v.byte_.data();
  const int32_t* depth = v.depth_.data();
  const int32_t* tok_begin = v.tok_begin_.data();
  const int32_t* tok_ids = v.tok_ids_.data();
  const int32_t* end = v.end_.data();
  const auto* below = v.below_bytes_.data();
  const uint8_t* utf8_below = v.utf8_below_.data();
  StateFacts* facts = state_facts();
  // Accepted tokens by rank (index into tok_ids, byte order): a subtree is a rank range, so a
  // whole accepted subtree costs words, not tokens. [ceil(num grammar tokens / 64)]
  const int32_t num_ranked = static_cast<int32_t>(v.tok_ids_.size());
  std::vector<uint64_t> accepted_rank((num_ranked + 63) / 64, 0);
  size_t num_accepted = 0;
  auto accept_range = [&](int32_t k0, int32_t k1) {  // ranks [k0, k1)
    if (k0 >= k1) return;
    num_accepted += static_cast<size_t>(k1 - k0);
    const int32_t w0 = k0 >> 6, w1 = (k1 - 1) >> 6;
    const uint64_t m0 = ~0ull << (k0 & 63), m1 = ~0ull >> (63 - ((k1 - 1) & 63));
    if (w0 == w1) {
      accepted_rank[w0] |= m0 & m1;
      return;
    }
    accepted_rank[w0] |= m0;
    std::fill(accepted_rank.begin() + w0 + 1, accepted_rank.begin() + w1, ~0ull);
    accepted_rank[w1] |= m1;
  };
  std::vector<int32_t> uncertain;
  const size_t n = v.num_nodes();
  for (size_t i = 1; i < n;) {
    const int32_t d = depth[i];
    const int32_t p = single[d - 1];
    bool e = false, alive;
    if (p >= 0 && !states[p].has_calls) {
      // Finishing a called rule before this byte escapes into the unknown context.
      e = called && states[p].final;
      const int32_t t = trans[static_cast<size_t>(p) * nc + pda.byte_class[bytes[i]]];
      single[d] = t;
      alive = t >= 0;
    } else {
      std::vector<Frame>& prev = frames[d - 1];
      if (p >= 0) prev.assign(1, Frame{p, bottom});
      std::vector<Frame>& cur = frames[d];
      stepper.step(prev, bytes[i], cur, &e);
      alive = !cur.empty();
      single[d] = cur.size() == 1 && cur[0].parent == bottom ? cur[0].state : -1;
    }
    esc[d] = esc[d - 1] | static_cast<uint8_t>(e);
    if (!alive) {
      if (esc[d]) uncertain.insert(uncertain.end(), tok_ids + tok_begin[i], tok_ids + tok_begin[end[i]]);
      i = end[i];
      continue;
    }
    // A state that loops on every byte below this node keeps its frame alive through the whole
    // subtree (string bodies, digit runs): all of it is accepted, whatever the rule's end does.
    const int32_t t = single[d];
    if (t >= 0 && end[i] > static_cast<int32_t>(i) + 1) {
      const auto& b = below[i];
      const std::array<uint64_t, 4> l = self_loops(t);
      bool whole = !((b[0] & ~l[0]) | (b[1] & ~l[1]) | (b[2] & ~l[2]) | (b[3] & ~l[3]));
      if (!whole && !((b[0] & ~l[0]) | (b[1] & ~l[1])) && (utf8_below[i] & 1)) {
        // ASCII below loops; the rest is whole characters of valid UTF-8 (e.g. CJK text).
        int8_t known = facts[t].text_alive.load(std::memory_order_relaxed);
        if (known < 0) {
          known = text_stays_alive(pda, t, l) ? 1 : 0;
          facts[t].text_alive.store(known, std::memory_order_relaxed);
        }
        whole = known == 1;
      }
      if (whole) {
        accept_range(tok_begin[i], tok_begin[end[i]]);
        i = end[i];
        continue;
      }
    }
    accept_range(tok_begin[i], tok_begin[i + 1]);
    ++i;
  }
  // Rank bits -> id bits, touching the smaller of the accepted and the other grammar tokens.
  std::vector<uint32_t> accepted;  // [ceil(vocab/32)]
  const bool most = num_accepted * 2 > static_cast<size_t>(num_ranked);
  accepted = most ? v.grammar_bits_ : std::vector<uint32_t>(v.grammar_bits_.size(), 0);
  for (size_t w = 0; w < accepted_rank.size(); ++w) {
    uint64_t x = most ? ~accepted_rank[w] : accepted_rank[w];
    if (w + 1 == accepted_rank.size() && (num_ranked & 63)) x &= ~0ull >> (64 - (num_ranked & 63));
    for (; x; x &= x - 1) {
      const int32_t t = tok_ids[w * 64 + __builtin_ctzll(x)];
      accepted[t >> 5] ^= 1u << (t & 31);  // set (from 0) or clear (from the grammar set)
    }
  }
  return finish_cache(v, std::move(accepted), num_accepted, std::move(uncertain));
}

std::shared_ptr<const StateMaskCache> CompiledGrammarImpl::compute_state_cache_reference(int32_t state) const {
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
  std::vector<uint32_t> accepted((v.vocab_size() + 31) / 32, 0);
  size_t num_accepted = 0;
  std::vector<int32_t> uncertain;
  const size_t n = v.num_nodes();
  for (size_t i = 1; i < n;) {
    const int32_t d = v.depth_[i];
    bool e = false;
    stepper.step(frames[d - 1], v.byte_[i], frames[d], &e);
    esc[d] = esc[d - 1] | static_cast<uint8_t>(e);
    if (frames[d].empty()) {
      if (esc[d])
        for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[v.end_[i]]; ++k) uncertain.push_back(v.tok_ids_[k]);
      i = v.end_[i];
      continue;
    }
    for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[i + 1]; ++k) {
      const int32_t t = v.tok_ids_[k];
      accepted[t >> 5] |= 1u << (t & 31);
      ++num_accepted;
    }
    ++i;
  }
  return finish_cache(v, std::move(accepted), num_accepted, std::move(uncertain));
}

}  // namespace deepinfer::structured
