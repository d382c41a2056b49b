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
#include <climits>
#include <optional>
#include <unordered_map>

#include "structured/compiled.h"
#include "structured/stack.h"
#include "structured/text_chain.h"

namespace deepinfer::structured {
namespace {

// accepted_bits: [ceil(vocab/32)] accepted token bits; uncertain: rank ranges in trie
// preorder (increasing, possibly adjacent), merged here.
std::shared_ptr<const StateMaskCache> finish_cache(const TokenVocabulary& v, std::vector<uint32_t> accepted_bits,
                                                   size_t num_accepted, const std::vector<RankRange>& uncertain) {
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
  for (const RankRange& r : uncertain) {
    if (r.lo >= r.hi) continue;
    if (!c->uncertain.empty() && c->uncertain.back().hi >= r.lo) {
      c->uncertain.back().hi = std::max(c->uncertain.back().hi, r.hi);
    } else {
      c->uncertain.push_back(r);
    }
  }
  return c;
}

}  // namespace

// True if some frame is alive without having passed a key-set check in the walk's bottom frame
// (whose set is unknown): its tokens are then accepted whatever the set.
bool unguarded(const NodePool& pool, const std::vector<Frame>& frames) {
  for (const Frame& f : frames) {
    bool clean = f.set != kGuardedSet;
    for (int32_t p = f.parent; clean && p >= 0; p = pool.node(p).parent) clean = pool.node(p).set != kGuardedSet;
    if (clean) return true;
  }
  return false;
}

// Root-child subtrees smaller than this are walked again rather than shared.
constexpr int32_t kMinSharedSubtree = 16;
// Root-child subtrees at least this large are also looked up across grammars (by state key).
constexpr int32_t kMinSharedAcrossGrammars = 2048;

std::shared_ptr<const SubtreeResult> CompiledGrammarImpl::find_subtree(uint64_t key) const {
  std::lock_guard<std::mutex> lock(sub_mu_);
  auto it = subtrees_.find(key);
  return it == subtrees_.end() ? nullptr : it->second;
}

void CompiledGrammarImpl::store_subtree(uint64_t key, std::shared_ptr<const SubtreeResult> r) const {
  std::lock_guard<std::mutex> lock(sub_mu_);
  subtrees_.emplace(key, std::move(r));
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
  const int32_t* height = v.height_.data();
  const int32_t* text_run_end = v.text_run_end_.data();
  const int32_t* text_run_height = v.text_run_height_.data();
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
  std::vector<RankRange> uncertain;  // rank ranges, preorder
  // A counter with `cut` characters left (counted_text_left): every all-text token of at most
  // `cut` characters is accepted, every longer one rejected (or uncertain: cut_unc), so a text
  // node below an ASCII-text path from the root is skipped with its run of text siblings. Only
  // the tokens holding a quote, an escape or other non-text bytes are walked (the first visit
  // of each position of a maxLength string walked every node up to its remaining length).
  // A counter over a class (cut_all false) decides only the tokens made of its bytes: a node
  // on a path of them whose subtree has no other byte is skipped, its tokens of at most `cut`
  // bytes accepted from text_le_.
  bool cut_unc = false;
  uint64_t cut_set[2] = {0, 0};
  bool cut_text = false;
  const int32_t cut = !pda.states[state].has_calls ? counted_text_left(state, &cut_unc, cut_set, &cut_text) : -1;
  const uint64_t* cut_le = cut >= 0 ? v.text_le_[cut].data() : nullptr;
  const bool cut_all = cut >= 0 && cut_text;
  if (cut_all)
    for (size_t w = 0; w < v.text_le_[cut].size(); ++w) accepted_rank[w] |= cut_le[w];
  auto in_cut = [&](uint8_t b) { return b < 0x80 && (cut_set[b >> 6] >> (b & 63) & 1); };
  std::vector<uint8_t> cut_path(cut >= 0 && !cut_all ? max_depth + 1 : 0, 0);  // [d] path so far all counted bytes
  if (!cut_path.empty()) cut_path[0] = 1;
  auto accept_le = [&](int32_t k0, int32_t k1) {  // ranks [k0, k1) of text_le_[cut]
    if (k0 >= k1) return;
    const int32_t w0 = k0 >> 6, w1 = (k1 - 1) >> 6;
    for (int32_t w = w0; w <= w1; ++w) {
      uint64_t m = ~0ull;
      if (w == w0) m &= ~0ull << (k0 & 63);
      if (w == w1) m &= ~0ull >> (63 - ((k1 - 1) & 63));
      accepted_rank[w] |= cut_le[w] & m;
    }
  };
  // The ranks in [k0, k1) outside text_le_[cut], as uncertain ranges (all-text tokens longer
  // than the count, which die after the rule could have finished).
  auto uncertain_long = [&](int32_t k0, int32_t k1) {
    for (int32_t k = k0; k < k1;) {
      if (cut_le[k >> 6] >> (k & 63) & 1) {
        ++k;
        continue;
      }
      int32_t e = k + 1;
      while (e < k1 && !(cut_le[e >> 6] >> (e & 63) & 1)) {
        if ((e & 63) == 0 && e + 64 <= k1 && cut_le[e >> 6] == 0) {
          e += 64;
          continue;
        }
        ++e;
      }
      uncertain.push_back({k, e});
      k = e;
    }
  };
  // The per-state facts of the states this walk meets (few: a string body, its chain), kept
  // here so a visited node costs no shared-array loads (direct-mapped by state).
  struct Local {
    int32_t state = -1;
    std::array<uint64_t, 4> loops{};
    int8_t text_alive = -1;
    bool chain_known = false;
    ChainStep chain{};
    int32_t run[2] = {-1, -1};
    bool key_known = false;
    int32_t key_id = -1;  // id of shared_key (-1: none)
    int32_t death = -1;   // text_death (-1: not asked yet)
  };
  Local local[16];
  auto local_facts = [&](int32_t s) -> Local& {
    Local& f = local[s & 15];
    if (f.state != s) {
      f = Local{};
      f.state = s;
      f.loops = self_loops(s);
    }
    return f;
  };
  // True if every JSON string text of at most `h` bytes keeps state s alive (bytes only up
  // to its text_death: a searched pattern that a second match breaks).
  auto death_beyond = [&](Local& f, int32_t h) {
    if (f.death < 0) f.death = text_death(f.state);
    return f.death > h;
  };
  auto text_state = [&](int32_t s, int32_t h) {
    Local& f = local_facts(s);
    const uint64_t* json = TokenVocabulary::kJsonText;
    if (!(json[0] & ~f.loops[0]) && !(json[1] & ~f.loops[1])) {
      if (f.text_alive < 0) {
        int8_t known = facts[s].text_alive.load(std::memory_order_relaxed);
        if (known < 0) {
          known = text_stays_alive(pda, s, f.loops) ? 1 : 0;
          facts[s].text_alive.store(known, std::memory_order_relaxed);
        }
        f.text_alive = known;
      }
      if (f.text_alive == 1) return true;
    }
    // text_death first: where it finds a death, text_any_alive's closure (up to 512 states,
    // every text character from each) would find it again, state after state.
    if (death_beyond(f, h)) return true;
    if (f.death == 0 && text_any_alive(s)) return true;
    // A text chain steps every JSON text byte alike: three lookups reject other states (key
    // literals, numbers) before the chain facts are worked out.
    const int32_t ta = pda.next(s, 'a');
    if (ta < 0 || pda.next(s, '~') != ta || pda.next(s, ' ') != ta) return false;
    if (!f.chain_known) {
      f.chain = chain_step(s);
      f.chain_known = true;
    }
    const ChainStep& c = f.chain;
    if (c.next < 0 || !c.utf8 || (json[0] & ~c.ascii[0]) || (json[1] & ~c.ascii[1])) return false;
    if (f.run[1] < 0) f.run[1] = chain_run(s, true);
    return f.run[1] >= h;
  };
  // Root-child subtrees are shared between states: many states step their first byte into the
  // same state (every prefix of a declared key under additionalProperties diverges into one
  // "other key" state), and what happens below depends only on that state and the escape flag.
  // A subtree walked here is recorded (rec_*) and later states replay it.
  int64_t rec_node = -1, rec_end = 0;
  uint64_t rec_key = 0;
  std::string rec_shared;
  size_t rec_unc = 0, rec_acc = 0;
  auto flush_record = [&] {
    const int32_t k0 = tok_begin[rec_node], k1 = tok_begin[end[rec_node]];
    auto r = std::make_shared<SubtreeResult>();
    r->count = static_cast<int64_t>(num_accepted - rec_acc);
    r->uncertain.assign(uncertain.begin() + static_cast<std::ptrdiff_t>(rec_unc), uncertain.end());
    if (k1 > k0) {
      r->w0 = k0 >> 6;
      const int32_t w1 = (k1 - 1) >> 6;
      r->words.assign(accepted_rank.begin() + r->w0, accepted_rank.begin() + w1 + 1);
      r->words.front() &= ~0ull << (k0 & 63);
      r->words.back() &= ~0ull >> (63 - ((k1 - 1) & 63));
    }
    if (!rec_shared.empty()) v.shared_subtrees_.insert(rec_shared, r);
    store_subtree(rec_key, std::move(r));
    rec_node = -1;
  };
  // Text chain from the root configuration (text_chain.h), for the general mode: a counted
  // string's state that calls its blocks walks every token with the stepper otherwise.
  // txt[d]: the path to the current node at depth d is ASCII text, so the configuration there
  // is the chain's c[d] (whatever the walk holds it as).
  TextChain::Memo chain_memo;
  std::optional<TextChain> chain;
  std::vector<uint8_t> txt(max_depth + 1, 0);
  txt[0] = 1;
  const size_t n = v.num_nodes();
  for (size_t i = 1; i < n;) {
    if (rec_node >= 0 && static_cast<int64_t>(i) >= rec_end) flush_record();
    const int32_t d = depth[i];
    const int32_t p = single[d - 1];
    txt[d] = txt[d - 1] && ascii_text(bytes[i]);
    if (cut_all && txt[d - 1] && text_run_end[i] > static_cast<int32_t>(i)) {
      // All text: decided by the text_le_ bits above.
      if (cut_unc) uncertain_long(tok_begin[i], tok_begin[text_run_end[i]]);
      i = text_run_end[i];
      continue;
    }
    if (!cut_path.empty()) {
      cut_path[d] = cut_path[d - 1] && in_cut(bytes[i]);
      const auto& b = below[i];
      if (cut_path[d] && !(b[0] & ~cut_set[0]) && !(b[1] & ~cut_set[1]) && !(b[2] | b[3])) {
        // Counted bytes only, from the root: decided by text_le_.
        accept_le(tok_begin[i], tok_begin[end[i]]);
        if (cut_unc) uncertain_long(tok_begin[i], tok_begin[end[i]]);
        i = end[i];
        continue;
      }
    }
    if ((p < 0 || states[p].has_calls) && txt[d - 1] && text_run_end[i] > end[i]) {
      if (!chain)
        chain.emplace(pda, pool, chain_memo, Frame{state, bottom, kUnknownSet}, v.max_depth_,
                      [&pool](const std::vector<Frame>& c) { return unguarded(pool, c); });
      if (chain->holds(d - 1 + text_run_height[i])) {
        accept_range(tok_begin[i], tok_begin[text_run_end[i]]);
        i = text_run_end[i];
        continue;
      }
    }
    // A run of sibling subtrees that are all JSON string text, under a string body (loops on
    // that text) or a counter whose chain outlasts the run's depth: accepted at once.
    if (p >= 0 && text_run_end[i] > end[i] && !states[p].has_calls && text_state(p, text_run_height[i])) {
      accept_range(tok_begin[i], tok_begin[text_run_end[i]]);
      i = text_run_end[i];
      continue;
    }
    bool e = false, alive;
    if (p >= 0 && !states[p].has_calls) {
      // Finishing a called rule before this byte escapes into the unknown context.
      e = called && states[p].final;
      const int32_t t = trans[static_cast<size_t>(p) * nc + pda.byte_class[bytes[i]]];
      single[d] = t;
      alive = t >= 0;
      if (alive && states[t].guard >= 0) {  // a key-set check: the general walk tracks it
        frames[d].assign(1, Frame{t, bottom, kGuardedSet});
        single[d] = -1;
      }
    } else {
      std::vector<Frame>& prev = frames[d - 1];
      if (p >= 0) prev.assign(1, Frame{p, bottom, kUnknownSet});
      std::vector<Frame>& cur = frames[d];
      stepper.step(prev, bytes[i], cur, &e);
      alive = !cur.empty();
      single[d] = cur.size() == 1 && cur[0].parent == bottom && cur[0].set == kUnknownSet ? cur[0].state : -1;
    }
    esc[d] = esc[d - 1] | static_cast<uint8_t>(e);
    if (!alive) {
      if (esc[d]) uncertain.push_back({tok_begin[i], tok_begin[end[i]]});
      i = end[i];
      continue;
    }
    // A state that loops on every byte below this node keeps its frame alive through the whole
    // subtree (string bodies, digit runs): all of it is accepted, whatever the rule's end does.
    const int32_t t = single[d];
    if (t >= 0 && end[i] > static_cast<int32_t>(i) + 1) {
      const auto& b = below[i];
      Local& f = local_facts(t);
      const std::array<uint64_t, 4>& l = f.loops;
      bool whole = !((b[0] & ~l[0]) | (b[1] & ~l[1]) | (b[2] & ~l[2]) | (b[3] & ~l[3]));
      if (!whole && !((b[0] & ~l[0]) | (b[1] & ~l[1])) && (utf8_below[i] & 1)) {
        // ASCII below loops; the rest is whole characters of valid UTF-8 (e.g. CJK text).
        if (f.text_alive < 0) {
          int8_t known = facts[t].text_alive.load(std::memory_order_relaxed);
          if (known < 0) {
            known = text_stays_alive(pda, t, l) ? 1 : 0;
            facts[t].text_alive.store(known, std::memory_order_relaxed);
          }
          f.text_alive = known;
        }
        whole = f.text_alive == 1;
      }
      if (!whole) {
        // Counted text (a string with maxLength): the bytes below step along a chain of states
        // that is longer than the subtree is deep.
        if (!f.chain_known) {
          f.chain = chain_step(t);
          f.chain_known = true;
        }
        const ChainStep& c = f.chain;
        if (c.next >= 0 && !((b[0] & ~c.ascii[0]) | (b[1] & ~c.ascii[1]))) {
          const int multi = (b[2] | b[3]) != 0 ? 1 : 0;
          if (!multi || (utf8_below[i] & 1)) {
            if (f.run[multi] < 0) f.run[multi] = chain_run(t, multi != 0);
            whole = f.run[multi] >= height[i];
          }
        }
      }
      if (!whole && !((b[0] & ~TokenVocabulary::kJsonText[0]) | (b[1] & ~TokenVocabulary::kJsonText[1])) &&
          (!(b[2] | b[3]) || (utf8_below[i] & 1)))
        // Text below, and every text (that short) keeps t alive.
        whole = death_beyond(f, height[i]) || (f.death == 0 && text_any_alive(t));
      if (whole) {
        accept_range(tok_begin[i], tok_begin[end[i]]);
        i = end[i];
        continue;
      }
      if (d == 1 && end[i] - static_cast<int32_t>(i) >= kMinSharedSubtree) {
        const uint64_t key = static_cast<uint64_t>(canonical(t)) << 33 | static_cast<uint64_t>(esc[1]) << 32 | i;
        std::shared_ptr<const SubtreeResult> r = find_subtree(key);
        std::string shared;  // the key across grammars, when the state has one
        // Across grammars only from string bodies and for large subtrees (a key costs up to
        // tens of microseconds): these recur in every schema, e.g. the "other key" state of an
        // object with additionalProperties and the `"` subtree after a key (`":`, `","`, ...).
        Local& f = local_facts(t);
        const uint64_t* json = TokenVocabulary::kJsonText;
        if (!r && ((!(json[0] & ~f.loops[0]) && !(json[1] & ~f.loops[1])) ||
                   end[i] - static_cast<int32_t>(i) >= kMinSharedAcrossGrammars)) {
          if (!f.key_known) {
            const std::string k = shared_key(t);
            f.key_id = k.empty() ? -1 : v.key_id(k);
            f.key_known = true;
          }
          if (f.key_id >= 0) {
            const uint64_t sk = static_cast<uint64_t>(f.key_id) << 33 | static_cast<uint64_t>(esc[1]) << 32 | i;
            shared.assign(reinterpret_cast<const char*>(&sk), sizeof sk);
            r = v.shared_subtrees_.find(shared);
            if (r) store_subtree(key, r);
          }
        }
        if (r) {
          for (size_t w = 0; w < r->words.size(); ++w) accepted_rank[r->w0 + w] |= r->words[w];
          num_accepted += static_cast<size_t>(r->count);
          uncertain.insert(uncertain.end(), r->uncertain.begin(), r->uncertain.end());
          i = end[i];
          continue;
        }
        rec_node = static_cast<int64_t>(i);
        rec_end = end[i];
        rec_key = key;
        rec_shared = std::move(shared);
        rec_unc = uncertain.size();
        rec_acc = num_accepted;
      }
    }
    if (single[d] < 0 && tok_begin[i] < tok_begin[i + 1] && !unguarded(pool, frames[d])) {
      // Alive only past a key-set check: the real set decides.
      uncertain.push_back({tok_begin[i], tok_begin[i + 1]});
    } else {
      accept_range(tok_begin[i], tok_begin[i + 1]);
    }
    ++i;
  }
  if (rec_node >= 0) flush_record();
  if (cut >= 0) {  // the text_le_ bits were not counted (and may overlap walked tokens)
    num_accepted = 0;
    for (uint64_t w : accepted_rank) num_accepted += static_cast<size_t>(__builtin_popcountll(w));
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
  return finish_cache(v, std::move(accepted), num_accepted, uncertain);
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
  frames[0] = {{state, called ? kBottom : kRootParent, kUnknownSet}};
  std::vector<uint32_t> accepted((v.vocab_size() + 31) / 32, 0);
  size_t num_accepted = 0;
  std::vector<RankRange> uncertain;
  const size_t n = v.num_nodes();
  for (size_t i = 1; i < n;) {
    const int32_t d = v.depth_[i];
    bool e = false;
    stepper.step(frames[d - 1], v.byte_[i], frames[d], &e);
    esc[d] = esc[d - 1] | static_cast<uint8_t>(e);
    if (frames[d].empty()) {
      if (esc[d])
        for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[v.end_[i]]; ++k) uncertain.push_back({k, k + 1});
      i = v.end_[i];
      continue;
    }
    const bool sure = unguarded(pool, frames[d]);
    for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[i + 1]; ++k) {
      const int32_t t = v.tok_ids_[k];
      if (!sure) {
        uncertain.push_back({k, k + 1});
        continue;
      }
      accepted[t >> 5] |= 1u << (t & 31);
      ++num_accepted;
    }
    ++i;
  }
  return finish_cache(v, std::move(accepted), num_accepted, uncertain);
}

}  // namespace deepinfer::structured
