// Regular-language operations on grammar expressions, for JSON Schema keywords whose exact
// meaning is an intersection, a difference or an "exactly one of" (pattern with minLength,
// patternProperties key partitions, overlapping oneOf branches).
//
// An expression is regular when it reaches no recursive rule; its DFA is built by subset
// construction over byte classes, combined by a product construction, and handed back to the
// grammar as a ByteAutomaton (dead states trimmed). Everything is bounded: past `max_states`
// the operation throws GrammarError (never a looser language).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct Dfa {
  int32_t num_classes = 0;
  uint8_t byte_class[256] = {};
  int32_t start = 0;
  std::vector<int32_t> trans;  // [num_states * num_classes] -> state, -1 = dead
  std::vector<bool> final;     // [num_states]
  int32_t num_states() const { return static_cast<int32_t>(final.size()); }
  int32_t next(int32_t s, uint8_t b) const { return trans[static_cast<size_t>(s) * num_classes + byte_class[b]]; }
  bool matches(std::string_view text) const;
};

inline constexpr int32_t kMaxRegularStates = 20'000;

// nullopt when `e` reaches a recursive (or not yet defined) rule. Throws GrammarError past
// max_states.
std::optional<Dfa> expr_to_dfa(const GrammarBuilder& b, ExprId e, int32_t max_states = kMaxRegularStates);

// Product of several DFAs: a string is accepted when accept(mask) holds for the bitmask of
// the automata that accept it (bit i = dfas[i] accepts). Missing transitions lead to a dead
// component, so accept() must be false for mask 0 unless the caller wants complements (then
// pass a universe automaton among `dfas` and require its bit).
Dfa dfa_product(const std::vector<const Dfa*>& dfas, const std::function<bool(uint32_t)>& accept,
                int32_t max_states = kMaxRegularStates);

// The minimal DFA of the same language (Hopcroft's partition refinement): states that accept
// the same continuations are merged, dead states dropped. Subset and product constructions
// keep equivalent states apart (a pattern searched for, once found, leaves several "found"
// subsets; a length counter times them, one per position), and the mask walks recognise a
// string body or a counter only by its self-loops and chains, so an unminimised copy costs a
// full vocabulary walk on each first visit. Byte classes are kept; states are numbered
// breadth first from the start (the same input gives the same automaton).
Dfa dfa_minimize(const Dfa& d);

bool dfa_is_empty(const Dfa& d);
// As a grammar expression (dead and unreachable states removed).
ExprId dfa_to_expr(GrammarBuilder& b, const Dfa& d);

}  // namespace deepinfer::structured
