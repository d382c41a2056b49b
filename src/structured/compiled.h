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
#include <vector>

#include "deepinfer/structured.h"
#include "structured/automaton.h"
#include "structured/grammar.h"
#include "structured/vocab.h"

namespace deepinfer::structured {

struct StateMaskCache {
  std::vector<uint32_t> accepted_bits;  // [ceil(vocab/32)] when many tokens are accepted, else empty
  std::vector<int32_t> accepted_ids;    // otherwise: the accepted token ids
  std::vector<int32_t> uncertain;       // token ids in byte-sorted order
  std::vector<int32_t> uncertain_lcp;   // [uncertain.size()] common prefix with the previous one
};

struct CompiledGrammarImpl {
  Grammar grammar;
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
  // Equal results (accepted as a set, uncertain in order); tests compare them.
  std::shared_ptr<const StateMaskCache> compute_state_cache(int32_t state) const;
  std::shared_ptr<const StateMaskCache> compute_state_cache_reference(int32_t state) const;

 private:
  // Per-state facts the mask walks fill on first use (mask_walk.cpp): racing walks compute
  // and store equal values, so relaxed atomics with a release flag are enough.
  struct StateFacts {
    std::atomic<uint64_t> loops[4]{};      // 256-bit set of bytes on which the state steps to itself
    std::atomic<int8_t> loops_known{0};     // loops filled
    std::atomic<int8_t> text_alive{-1};     // text_stays_alive: -1 not yet known, 0, 1
  };
  StateFacts* state_facts() const;  // [num_states], allocated on first use
  std::array<uint64_t, 4> self_loops(int32_t state) const;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const StateMaskCache>> caches_;  // [num_states]
  mutable std::once_flag facts_once_;
  mutable std::unique_ptr<StateFacts[]> facts_;
};

// Walks the masks of the lexical rules every JSON grammar shares (string body, any value,
// numbers) into vocab's shared cache, so no request pays their first visit.
void precompute_common_masks(const std::shared_ptr<const TokenVocabulary>& vocab);

// so_args -> internal grammar (throws GrammarError / InvalidArgument).
Grammar lower_so_args(std::string_view so_args_json);

}  // namespace deepinfer::structured
