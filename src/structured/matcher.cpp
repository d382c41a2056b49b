// GrammarMatcher: per-request configuration history over the shared CompiledGrammar.
#include <algorithm>
#include <cstring>
#include <map>

#include "core/check.h"
#include "structured/compiled.h"
#include "structured/stack.h"
#include "structured/text_chain.h"

namespace deepinfer::structured {

struct MatcherState {
  std::shared_ptr<const CompiledGrammar> grammar;
  const CompiledGrammarImpl* g = nullptr;
  NodePool pool;
  std::vector<std::vector<Frame>> history;  // [num_accepted + 1] configuration after each step
  std::vector<uint8_t> terminated;          // [num_accepted + 1]
  // Trigger (compiled.h, TriggerSpec), per step like `history`: trigger tokens matched so far,
  // and tokens since the bound token (-1: not generated).
  std::vector<int32_t> progress, after_bound;
  enum class Phase { kFree, kForced, kGrammar };
  Phase phase() const {
    const TriggerSpec& t = g->trigger;
    if (progress.back() >= static_cast<int32_t>(t.tokens.size())) return Phase::kGrammar;
    return after_bound.back() >= 0 ? Phase::kForced : Phase::kFree;
  }
  // Appends the step after `token` outside the grammar (free or forced phase).
  void push_trigger_step(int32_t token, bool stop);
  // Masks of recently seen configurations (a configuration repeats often, e.g. inside a string).
  std::map<std::vector<Frame>, std::vector<uint32_t>> mask_memo;
  static constexpr size_t kMaxMemo = 64;
  // Text chain steps (walk_ranks): configuration -> the one every text character steps it to
  // (empty: none). Interned in the persistent pool, so they stay valid across masks and the
  // next position's chain reuses this one's.
  std::map<std::vector<Frame>, std::vector<Frame>> chain_memo;

  const std::vector<Frame>& cur() const { return history.back(); }
  void fill_mask(std::vector<uint32_t>& bits);
  void walk_uncertain(const StateMaskCache& c, Frame f, std::vector<uint32_t>& bits);
  void walk_ranks(const RankRange* r, size_t n, Frame f, std::vector<uint32_t>& bits);
  bool advance(std::string_view bytes, std::vector<Frame>& out);
};

void MatcherState::walk_uncertain(const StateMaskCache& c, Frame f, std::vector<uint32_t>& bits) {
  walk_ranks(c.uncertain.data(), c.uncertain.size(), f, bits);
}


namespace {
// Uncertain walks over fewer tokens than this step them all rather than build a text chain.
// (A chain for short walks of long tokens, >= 64 bytes, was tried in session 16: it saved
// ~100 us at some block-end positions but cost ~7 us on many 17 us masks and ~250 us where
// the chain's steps were not plain, so masks p50 rose 1.3x on the long-string schemas.)
constexpr int64_t kMinChainWalk = 2048;
}  // namespace

// Walks the tokens of rank ranges r[0..n) (increasing) from the real frame f, setting the bits
// of those that stay alive. Consecutive tokens share the frames of their common prefix; a token
// that dies after d bytes skips, in O(1), every later token with the same d-byte prefix (the
// rest of its trie ancestor's subtree at depth d). Below an ASCII-text prefix of d bytes, a run
// of text trie siblings (vocab.h) of height h is accepted whole when the text chain from f
// holds for d + h characters (a string body, counted or not, even across called blocks).
void MatcherState::walk_ranks(const RankRange* r, size_t n, Frame f, std::vector<uint32_t>& bits) {
  const TokenVocabulary& v = *g->vocab;
  const int32_t* tok_ids = v.tok_ids_.data();
  Stepper stepper(g->pda, pool, true);
  TextChain chain(g->pda, pool, chain_memo, f, v.max_depth_);
  // The chain may still hold (false once it failed for one character). Only worth building
  // for walks over many tokens (a block's end in a counted string: nearly all of them).
  int64_t walked = 0;
  for (size_t j = 0; j < n; ++j) walked += r[j].hi - r[j].lo;
  bool text_ok = walked >= kMinChainWalk;
  // When any text of le characters is alive from f, every all-text token of at most le
  // characters is (whatever the state's cache said of it): OR them in at once, and skip a run
  // of such tokens below without setting its bits again.
  const int32_t le = static_cast<int32_t>(v.text_le_.size()) - 1;
  bool le_set = false;
  if (text_ok && le >= 1 && chain.holds(le)) {
    for (size_t w = 0; w < bits.size(); ++w) bits[w] |= v.text_le_ids_[w];
    le_set = true;
  }
  std::vector<int32_t> anc;  // [depth] trie ancestors of the current token
  std::vector<int32_t> chars;  // [depth] characters of the current token's text prefix (-1: none)
  std::vector<std::vector<Frame>> frames(1, std::vector<Frame>{f});  // [depth]
  std::string_view prev;  // the last walked token; frames[0..valid] hold its prefix
  size_t valid = 0;
  int32_t k = 0;
  for (size_t j = 0; j < n; ++j) {
    for (k = std::max(k, r[j].lo); k < r[j].hi;) {
      const int32_t id = tok_ids[k];
      const std::string& s = v.bytes(id);
      size_t l = 0;
      const size_t lmax = std::min({prev.size(), s.size(), valid});
      while (l < lmax && prev[l] == s[l]) ++l;
      if (frames.size() < s.size() + 1) frames.resize(s.size() + 1);
      // Depths d in [l, top] may start an accepted text run: s[0..d) is JSON text ending on a
      // character boundary, chars[d] characters (ASCII text bytes or valid multi-byte UTF-8;
      // -1 inside a character). p: bytes of s's longest valid text prefix.
      size_t top = 0, p = 0;
      bool try_text = false;
      if (text_ok) {
        chars.assign(s.size() + 1, -1);
        chars[0] = 0;
        int u = 0, c = 0;  // UTF-8 decoder state, characters so far
        while (p < s.size()) {
          const uint8_t b = static_cast<uint8_t>(s[p]);
          if (u == 0 && b < 0x80 && !ascii_text(b)) break;
          u = utf8_step(u, b);
          if (u < 0) break;
          ++p;
          if (u == 0) chars[p] = ++c;
        }
        if (l <= p && l < s.size()) {
          try_text = true;
          top = std::min(p, s.size() - 1);
          anc.resize(s.size() + 1);
          int32_t node = v.node_of_[id];
          for (size_t dd = s.size(); dd > l; --dd) {
            anc[dd] = node;
            node = v.parent_[node];
          }
        }
      }
      size_t d = l;
      int32_t skip_to = -1;
      bool run_in_le = false;  // the run's tokens all have at most le characters
      for (; d < s.size(); ++d) {
        if (try_text && d <= top && chars[d] >= 0) {
          const int32_t node = anc[d + 1];
          // A text node's edge and subtree are text from a character boundary (vocab.h), at
          // most height bytes, so at most that many characters past the prefix's.
          if (v.text_run_end_[node] > node) {
            if (chain.holds(chars[d] + v.text_run_height_[node])) {
              run_in_le = le_set && chars[d] + v.text_run_height_[node] <= le;
              // The whole run, past the end of this uncertain range too: the tokens between
              // ranges are ones the state's cache accepted (rejected ones cannot be alive here),
              // and setting their bits again costs less than finding every range's next token.
              skip_to = v.tok_begin_[v.text_run_end_[node]];
              break;
            }
            if (!chain.holds(1)) text_ok = false;  // no text at all from f: stop trying
          }
        }
        // Along a text prefix, at each character boundary the configuration is the chain's (no
        // stepping); inside a multi-byte character it is stepped from the boundary's.
        if (try_text && d < p && chars[d + 1] >= 0 && chain.holds(chars[d + 1])) {
          frames[d + 1] = chain.config(chars[d + 1]);
          continue;
        }
        stepper.step(frames[d], static_cast<uint8_t>(s[d]), frames[d + 1], nullptr);
        if (frames[d + 1].empty()) break;
      }
      prev = s;
      if (skip_to >= 0) {  // tokens [k, skip_to) are all alive
        if (!run_in_le)
          for (int32_t q = k; q < skip_to; ++q) {
            const int32_t t = tok_ids[q];
            bits[t >> 5] |= 1u << (t & 31);
          }
        valid = d;
        k = skip_to;
        continue;
      }
      if (d == s.size()) {
        bits[id >> 5] |= 1u << (id & 31);
        valid = s.size();
        ++k;
        continue;
      }
      // Died on byte d: skip the subtree of the trie node for s[0..d] (depth d + 1).
      valid = d;
      int32_t node = v.node_of_[id];
      for (int32_t depth = static_cast<int32_t>(s.size()); depth > static_cast<int32_t>(d) + 1; --depth)
        node = v.parent_[node];
      k = v.tok_begin_[v.end_[node]];
    }
  }
}

void MatcherState::fill_mask(std::vector<uint32_t>& bits) {
  const TokenVocabulary& v = *g->vocab;
  std::fill(bits.begin(), bits.end(), 0u);
  if (terminated.back()) return;
  auto it = mask_memo.find(cur());
  if (it != mask_memo.end()) {
    bits = it->second;
    return;
  }
  // Within a few tokens of the stack limit (NodePool::kMaxDepth) the cached masks, computed
  // without the stack below, could allow a token that needs more frames: walk every token with
  // the real stack there (rare: only thousands of levels deep).
  const int32_t slack = v.max_depth_ * (g->pda.max_call_chain + 1) + 1;
  for (const Frame& f : cur()) {
    if (pool.depth(f.parent) + slack >= NodePool::kMaxDepth) {
      const RankRange all{0, static_cast<int32_t>(v.tok_ids_.size())};
      walk_ranks(&all, 1, f, bits);
      continue;
    }
    auto c = g->state_cache(f.state);
    if (!c->accepted_bits.empty()) {
      for (size_t w = 0; w < bits.size(); ++w) bits[w] |= c->accepted_bits[w];
    } else {
      for (int32_t t : c->accepted_ids) bits[t >> 5] |= 1u << (t & 31);
    }
    if (c->uncertain.empty()) continue;
    const int64_t nu = c->num_uncertain();
    std::shared_ptr<const PairMaskCache> pc;
    if (f.parent >= 0 && nu >= CompiledGrammarImpl::kMinPairTokens)
      pc = g->pair_cache(f.state, pool.node(f.parent).state);
    if (pc && !pc->gave_up) {
      // Decided by the caller's return state (shared by every matcher of this grammar, often
      // filled by the precompute): only the tokens that also leave the caller's rule, or pass
      // a key-set check, are walked with the real stack.
      for (int32_t t : pc->accepted_ids) bits[t >> 5] |= 1u << (t & 31);
      if (!pc->uncertain.empty()) walk_ranks(pc->uncertain.data(), pc->uncertain.size(), f, bits);
    } else {
      walk_uncertain(*c, f, bits);
    }
  }
  Stepper stepper(g->pda, pool, true);
  if (stepper.can_finish(cur()))
    for (int32_t t : v.stop_ids()) bits[t >> 5] |= 1u << (t & 31);
  pool.clear_scratch();
  if (mask_memo.size() >= kMaxMemo) mask_memo.erase(mask_memo.begin());
  mask_memo.emplace(cur(), bits);
}

bool MatcherState::advance(std::string_view bytes, std::vector<Frame>& out) {
  Stepper stepper(g->pda, pool, false);
  std::vector<Frame> a = cur(), b;
  for (char ch : bytes) {
    stepper.step(a, static_cast<uint8_t>(ch), b, nullptr);
    if (b.empty()) return false;
    std::swap(a, b);
  }
  // A frame in a dead end (its rule can only finish) behaves exactly like the frame below it:
  // pop it now, so the next mask is the caller's state (a cached, mostly decided mask) rather
  // than a state whose every token is uncertain and re-walked with the stack each time.
  bool popped = false;
  for (Frame& f : a)
    while (f.parent >= 0 && g->pda.states[f.state].dead_end) {
      f = pool.node(f.parent);
      popped = true;
    }
  if (popped) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  out = std::move(a);
  return true;
}

void MatcherState::push_trigger_step(int32_t token, bool stop) {
  const TriggerSpec& t = g->trigger;
  int32_t p = progress.back(), ab = after_bound.back();
  if (ab >= 0) {
    ++p;  // forced: the caller checked token == t.tokens[p]
    ++ab;
  } else {
    while (p > 0 && token != t.tokens[p]) p = t.failure[p - 1];
    if (token == t.tokens[p]) ++p;
    if (t.bound >= 0 && token == t.bound && p < static_cast<int32_t>(t.tokens.size())) ab = 0;
  }
  history.push_back(cur());
  terminated.push_back(stop ? 1 : 0);
  progress.push_back(p);
  after_bound.push_back(ab);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : s_(std::make_unique<MatcherState>()) {
  DI_CHECK(grammar != nullptr, "null grammar");
  s_->grammar = std::move(grammar);
  s_->g = &s_->grammar->impl();
  reset();
}
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
GrammarMatcher::~GrammarMatcher() = default;

GrammarMatcher GrammarMatcher::clone() const {
  GrammarMatcher m(s_->grammar);
  *m.s_ = *s_;
  return m;
}

void GrammarMatcher::reset() {
  s_->history.clear();
  s_->terminated.clear();
  s_->mask_memo.clear();
  s_->progress.clear();
  s_->after_bound.clear();
  std::vector<Frame> init;
  if (!s_->g->pda.empty_language) init.push_back({s_->g->pda.rule_start[s_->g->pda.root], kRootParent});
  s_->history.push_back(std::move(init));
  s_->terminated.push_back(0);
  s_->progress.assign(1, 0);
  s_->after_bound.assign(1, -1);
}

bool GrammarMatcher::accept_token(int32_t id) {
  const TokenVocabulary& v = *s_->g->vocab;
  if (id < 0 || id >= v.vocab_size() || s_->terminated.back()) return false;
  switch (s_->phase()) {
    case MatcherState::Phase::kFree:  // anything, a stop token ending the text
      s_->push_trigger_step(id, v.is_stop(id));
      return true;
    case MatcherState::Phase::kForced:
      if (id != s_->g->trigger.tokens[s_->progress.back()]) return false;
      s_->push_trigger_step(id, false);
      return true;
    case MatcherState::Phase::kGrammar: break;
  }
  if (v.is_stop(id)) {
    if (!can_terminate()) return false;
    s_->history.push_back(s_->cur());
    s_->terminated.push_back(1);
    s_->progress.push_back(s_->progress.back());
    s_->after_bound.push_back(s_->after_bound.back());
    return true;
  }
  if (!v.is_grammar_token(id)) return false;
  return accept_bytes(v.bytes(id));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  // Bytes are grammar input: before the trigger they are not tokens to match it with.
  if (s_->terminated.back() || s_->phase() != MatcherState::Phase::kGrammar) return false;
  std::vector<Frame> out;
  if (!s_->advance(bytes, out)) return false;
  s_->history.push_back(std::move(out));
  s_->terminated.push_back(0);
  s_->progress.push_back(s_->progress.back());
  s_->after_bound.push_back(s_->after_bound.back());
  return true;
}

void GrammarMatcher::fill_next_token_bitmask(std::span<int32_t> words) {
  const int32_t vs = s_->g->vocab->vocab_size();
  const size_t n = static_cast<size_t>(vs + 31) / 32;
  if (words.size() < n) DI_THROW(InvalidArgument, "bitmask has ", words.size(), " words, need ", n);
  std::vector<uint32_t> bits(n);
  switch (s_->terminated.back() ? MatcherState::Phase::kGrammar : s_->phase()) {
    case MatcherState::Phase::kFree:  // every token
      std::fill(bits.begin(), bits.end(), ~0u);
      if (vs & 31) bits.back() = (1u << (vs & 31)) - 1;
      break;
    case MatcherState::Phase::kForced: {
      const int32_t t = s_->g->trigger.tokens[s_->progress.back()];
      bits[t >> 5] = 1u << (t & 31);
      break;
    }
    case MatcherState::Phase::kGrammar: s_->fill_mask(bits);
  }
  std::memcpy(words.data(), bits.data(), n * sizeof(uint32_t));
  std::fill(words.begin() + n, words.end(), 0);
}

void GrammarMatcher::rollback(int32_t n) {
  if (n < 0 || n > num_accepted()) DI_THROW(InvalidArgument, "rollback(", n, ") with ", num_accepted(), " accepted");
  s_->history.resize(s_->history.size() - n);
  s_->terminated.resize(s_->terminated.size() - n);
  s_->progress.resize(s_->progress.size() - n);
  s_->after_bound.resize(s_->after_bound.size() - n);
}

int32_t GrammarMatcher::num_accepted() const { return static_cast<int32_t>(s_->history.size()) - 1; }
bool GrammarMatcher::is_terminated() const { return s_->terminated.back() != 0; }

bool GrammarMatcher::can_terminate() const {
  if (s_->terminated.back()) return false;
  if (s_->phase() == MatcherState::Phase::kFree) return true;
  if (s_->phase() == MatcherState::Phase::kForced) return false;
  Stepper stepper(s_->g->pda, s_->pool, true);
  bool r = stepper.can_finish(s_->cur());
  s_->pool.clear_scratch();
  return r;
}

std::string GrammarMatcher::forced_bytes() const {
  std::string out;
  if (s_->terminated.back() || s_->phase() != MatcherState::Phase::kGrammar) return out;
  Stepper stepper(s_->g->pda, s_->pool, true);
  std::vector<Frame> a = s_->cur(), b;
  while (out.size() < 4096 && !stepper.can_finish(a)) {
    uint64_t bits[4];
    stepper.next_bytes(a, bits);
    int count = 0, byte = -1;
    for (int i = 0; i < 256; ++i)
      if (bits[i >> 6] >> (i & 63) & 1) { ++count; byte = i; }
    if (count != 1) break;
    out.push_back(static_cast<char>(byte));
    stepper.step(a, static_cast<uint8_t>(byte), b, nullptr);
    std::swap(a, b);
  }
  s_->pool.clear_scratch();
  return out;
}

std::vector<int32_t> GrammarMatcher::forced_tokens(int32_t max_tokens) const {
  GrammarMatcher m = clone();
  const int32_t vs = s_->g->vocab->vocab_size();
  std::vector<int32_t> words((vs + 31) / 32), out;
  while (static_cast<int32_t>(out.size()) < max_tokens) {
    m.fill_next_token_bitmask(words);
    int32_t count = 0, tok = -1;
    for (size_t w = 0; w < words.size() && count < 2; ++w)
      if (words[w]) {
        count += __builtin_popcount(static_cast<uint32_t>(words[w]));
        tok = static_cast<int32_t>(w * 32 + __builtin_ctz(static_cast<uint32_t>(words[w])));
      }
    if (count != 1 || s_->g->vocab->is_stop(tok)) break;
    out.push_back(tok);
    m.accept_token(tok);
  }
  return out;
}

int32_t GrammarMatcher::fill_draft_bitmasks(std::span<const int32_t> draft, std::span<int32_t> words,
                                            size_t row_words) {
  const size_t need = static_cast<size_t>(s_->g->vocab->vocab_size() + 31) / 32;
  if (row_words < need) DI_THROW(InvalidArgument, "draft bitmask rows have ", row_words, " words, need ", need);
  if (words.size() < (draft.size() + 1) * row_words)
    DI_THROW(InvalidArgument, "draft bitmasks need ", (draft.size() + 1) * row_words, " words, got ", words.size());
  int32_t rows = 0, accepted = 0;
  for (size_t k = 0;; ++k) {
    fill_next_token_bitmask(words.subspan(k * row_words, row_words));
    ++rows;
    if (k == draft.size() || !accept_token(draft[k])) break;
    ++accepted;
  }
  rollback(accepted);
  return rows;
}

}  // namespace deepinfer::structured
