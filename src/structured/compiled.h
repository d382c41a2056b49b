// What a CompiledGrammar holds: the source grammar (for dumps), its pushdown automaton, the
// vocabulary, and the per-state token mask cache.
//
// Mask cache (in the spirit of xgrammar's adaptive token mask cache): for a DFA state p, walk
// the whole token trie from a stack holding only p, with an unknown context below (kBottom).
// A token that is consumed entirely inside that stack is accepted in every context; one that
// dies without ever finishing p's rule is rejected in every context; the rest ("uncertain":
// finishing the rule part-way through the token) must be re-walked with the real stack.
// Computed lazily on first use, then shared by all matchers.
#pragma once
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "deepinfer/structured.h"
#include "structured/automaton.h"
#include "structured/grammar.h"
#include "structured/vocab.h"

namespace deepinfer::structured {

// Tokens by byte-order rank (positions in TokenVocabulary::tok_ids_): [lo, hi).
struct RankRange {
  int32_t lo, hi;
  bool operator==(const RankRange&) const = default;
};

struct StateMaskCache {
  std::vector<uint32_t> accepted_bits;  // [ceil(vocab/32)] when many tokens are accepted, else empty
  std::vector<int32_t> accepted_ids;    // otherwise: the accepted token ids
  // Uncertain tokens as rank ranges: increasing, disjoint, never adjacent. They come in whole
  // trie subtrees, so a state whose every token is uncertain (a final state of a called rule
  // that any byte may leave) holds a handful of ranges rather than 128k ids.
  std::vector<RankRange> uncertain;
  int64_t num_uncertain() const {
    int64_t n = 0;
    for (const RankRange& r : uncertain) n += r.hi - r.lo;
    return n;
  }
};

// A state's uncertain tokens re-walked with one known frame below it (pair_cache.cpp): the
// state on top, the return state `ret` of the frame below (key sets unknown), and an unknown
// context under that. Of the state's uncertain tokens, `accepted_ids` are alive in every such
// stack, `uncertain` (ranks, increasing, disjoint) still depend on what is below `ret` (or on
// a key set); the others are rejected. Most uncertain tokens of a string body or a number
// (a quote or delimiter followed by what the caller allows) are decided by the caller's state
// alone, so the real-stack re-walk shrinks from thousands of tokens to a few.
struct PairMaskCache {
  std::vector<int32_t> accepted_ids;
  std::vector<RankRange> uncertain;
  // No pair cache: the walk gave up after kMaxPairSteps byte steps (text that goes on past the
  // caller, as at a counted block's end, where the real-stack re-walk's text chain is the
  // faster way), or the state's rule checks key sets (pair_cache.cpp): use the state's own
  // uncertain set instead.
  bool gave_up = false;
};

// A root child's subtree walked from a given state (mask_walk.cpp): what any state whose first
// byte leads there gets for that subtree. Accepted tokens as rank bits in the words
// [w0, w0 + words.size()) of the rank bitmap (only the subtree's bits set); uncertain ranks in
// trie preorder.
struct SubtreeResult {
  int32_t w0 = 0;
  std::vector<uint64_t> words;
  int64_t count = 0;
  std::vector<RankRange> uncertain;  // in rank order, possibly adjacent
};

// so_args "trigger_token_ids" / "bound_token_id" (DeepInfer's semantics): tokens are free until
// `tokens` has appeared as a contiguous run, then the grammar applies. Once `bound` (>= 0) is
// generated while the trigger is still pending, the rest of the trigger is forced token by
// token, then the grammar. Empty `tokens`: the grammar applies from the first token.
struct TriggerSpec {
  std::vector<int32_t> tokens;
  int32_t bound = -1;
  std::vector<int32_t> failure;  // KMP failure function of `tokens`
};
// Parsed from so_args; ids checked against the vocabulary (InvalidArgument).
TriggerSpec trigger_spec(std::string_view so_args_json, int32_t vocab_size);

struct CompiledGrammarImpl {
  Grammar grammar;
  TriggerSpec trigger;
  Pda pda;
  std::shared_ptr<const TokenVocabulary> vocab;
  double compile_ms = 0;

  // Lazily computed, thread-safe: per-grammar table in front of the vocabulary's shared cache.
  std::shared_ptr<const StateMaskCache> state_cache(int32_t state) const;
  // Canonical encoding of what the mask walk from `state` can see: states reachable within
  // the longest token (byte edges cut beyond it), their finality, calls and tail flags, and
  // whether the state's rule is called. Equal keys <=> equal context-independent masks.
  // Empty when the reachable part is too large to be worth sharing.
  std::string shared_key(int32_t state) const;
  // The walks behind state_cache (mask_walk.cpp), uncached: the fast one and its plain twin.
  // Equal results (accepted as a set, uncertain ranges); tests compare them.
  std::shared_ptr<const StateMaskCache> compute_state_cache(int32_t state) const;
  std::shared_ptr<const StateMaskCache> compute_state_cache_reference(int32_t state) const;
  // Lazily computed, thread-safe: the PairMaskCache of `state` over a frame returning to `ret`.
  std::shared_ptr<const PairMaskCache> pair_cache(int32_t state, int32_t ret) const;
  // Its walk, uncached, and the plain twin (every uncertain token stepped alone; tests).
  std::shared_ptr<const PairMaskCache> compute_pair_cache(int32_t state, int32_t ret, bool reference = false) const;
  // Pair caches are used for states with at least this many uncertain tokens (fewer: the
  // real-stack re-walk is cheap already).
  static constexpr int64_t kMinPairTokens = 64;
  static constexpr int64_t kMaxPairSteps = 8192;
  // Fills state_cache for the states reachable from the root's start, nearest first, until done,
  // the time or memory budget is spent or *cancel is set (structured.h MaskPrecompute).
  MaskPrecomputeResult precompute_masks(const MaskPrecompute& opts, const std::atomic<bool>* cancel) const;
  // structured.h CompiledGrammar::mask_cache_bytes / release_mask_caches (mask_cache.cpp):
  // the state, pair and subtree tables above, measured and dropped. Every reader takes a
  // shared_ptr copy under the table's lock, so an entry in use outlives its release.
  int64_t mask_cache_bytes() const;
  int64_t release_mask_caches() const;

 private:
  // Per-state facts the mask walks fill on first use (state_facts.cpp): racing walks compute
  // and store equal values, so relaxed atomics with a release flag are enough.
  struct StateFacts {
    std::atomic<uint64_t> loops[4]{};      // 256-bit set of bytes on which the state steps to itself
    std::atomic<int8_t> loops_known{0};     // loops filled
    std::atomic<int8_t> text_alive{-1};     // text_stays_alive: -1 not yet known, 0, 1
    std::atomic<int8_t> text_any{-1};       // text_stays_alive over every JSON text byte (text_any_alive)
    // Counted text (strings with maxLength, {m,n} repeats): the chain step of the state (the
    // target `chain_next` most ASCII bytes step to, those bytes, whether every valid
    // multi-byte character steps there too) and how many characters a text may have before
    // the chain can end (run: ASCII only / with multi-byte characters; capped at the longest
    // token). state_facts.cpp.
    std::atomic<int8_t> chain_known{0};
    std::atomic<uint64_t> chain_ascii[2]{};
    std::atomic<int32_t> chain_next{-1};
    std::atomic<int8_t> chain_utf8{0};
    std::atomic<int32_t> run_ascii{-1}, run_utf8{-1};
    std::atomic<int32_t> text_death{-1};  // text_death: -1 not yet known
  };
  struct ChainStep {
    uint64_t ascii[2];
    int32_t next;
    bool utf8;
  };
  ChainStep chain_step(int32_t state) const;
  // Characters of text (bytes from `state`'s chain set, and multi-byte characters when
  // `utf8`) that stay alive from `state` whatever they are: the states along the chain all
  // step those bytes to the next chain state. >= the longest token means unbounded.
  int32_t chain_run(int32_t state, bool utf8) const;
  // Characters of text left at `state` when it is a counter with nothing after them: every
  // JSON text character steps it along a chain of call-free states, ending in one that no text
  // byte leaves (a string's last position before maxLength, a counted block's end). Then an
  // all-text token is accepted exactly when it has at most that many characters
  // (TokenVocabulary::text_le_); a longer one is rejected, or uncertain (*long_uncertain) when
  // some state of the chain can finish a called rule. -1 when `state` is no such counter (or
  // the count is above TokenVocabulary::kMaxTextLe).
  // counted[2]: the ASCII bytes counted; *all_text: every text character is (a string's
  // length: counted is kJsonText and multi-byte characters count too), else only the
  // tokens made of counted bytes are decided by the count (a class; the walk steps the others).
  int32_t counted_text_left(int32_t state, bool* long_uncertain, uint64_t counted[2], bool* all_text) const;
  StateFacts* state_facts() const;  // [num_states], allocated on first use
  // True if every JSON string text (any ASCII text byte, any valid multi-byte character)
  // keeps `state` alive, through whatever states it steps to (at most 32 of them): a pattern
  // searched for but not found yet, whose states step text among themselves without dying.
  // Then a subtree of text below a node in `state` is accepted whole. Memoised per state.
  bool text_any_alive(int32_t state) const;
  // The length in bytes of the shortest JSON string text (ASCII text bytes and valid UTF-8
  // from a character boundary, possibly ending inside a character) that kills `state`'s own
  // frame or reaches a key-set check: every shorter text keeps the frame alive, so a text
  // subtree below a node in `state` that is less deep is accepted whole. A searched pattern
  // that text can break (oneOf / not over patterns: a second match dies) dies only after a
  // few characters, where text_any_alive says no. Capped at the longest token + 1; 0 when
  // unknown (the states text reaches from `state` are more than a bound). Memoised for every
  // state the search meets.
  int32_t text_death(int32_t state) const;
  std::array<uint64_t, 4> self_loops(int32_t state) const;
  std::shared_ptr<const SubtreeResult> find_subtree(uint64_t key) const;
  void store_subtree(uint64_t key, std::shared_ptr<const SubtreeResult> r) const;
  // A representative of the states behaving exactly like `state` (same finality, calls and
  // transitions up to the same representatives: the DFAs are not minimised, so e.g. every
  // declared-key prefix under additionalProperties diverges into its own copy of the "other
  // key" state). Found on demand, for the states the walks share subtrees from.
  int32_t canonical(int32_t state) const;
  bool equivalent(int32_t a, int32_t b) const;
  mutable std::mutex sub_mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const SubtreeResult>> subtrees_;  // (state, esc, node)
  mutable std::unordered_map<int32_t, int32_t> canon_;                 // state -> representative
  mutable std::unordered_map<uint64_t, std::vector<int32_t>> canon_buckets_;  // shape hash -> representatives
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const StateMaskCache>> caches_;  // [num_states]
  mutable std::mutex pair_mu_;
  mutable std::unordered_map<uint64_t, std::shared_ptr<const PairMaskCache>> pairs_;  // (state, ret)
  mutable std::once_flag facts_once_;
  mutable std::unique_ptr<StateFacts[]> facts_;
};

class NodePool;
struct Frame;
// True if some frame is alive without having passed a key-set check whose set was unknown
// (mask_walk.cpp): its tokens are then accepted whatever the sets are.
bool unguarded(const NodePool& pool, const std::vector<Frame>& frames);

// Walks the masks of the lexical rules every JSON grammar shares (string body, any value,
// numbers) into vocab's shared cache, so no request pays their first visit.
void precompute_common_masks(const std::shared_ptr<const TokenVocabulary>& vocab);

// so_args -> internal grammar (throws GrammarError / InvalidArgument).
// time_limit_ms bounds the lowering (JSON Schema); past it a GrammarError names the limit.
Grammar lower_so_args(std::string_view so_args_json, double time_limit_ms = 5000);

}  // namespace deepinfer::structured
