// Grammar -> pushdown automaton. Every rule that must stay a rule (the root, recursive rules,
// rules marked inline_ok = false) becomes one DFA over byte classes whose states may also
// "call" other rules; all other rules are inlined into their callers, so a non-recursive
// grammar is a single DFA. The matcher runs these DFAs with a stack of return states.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct AutomatonLimits {
  int64_t max_nfa_states = 2'000'000;  // after repeat expansion, all rules together
  int64_t max_dfa_states = 200'000;    // all rules together
  double time_limit_ms = 5'000;        // wall time for the whole compilation
  // Expressions of equal shape that continue into the same NFA state are built once
  // (automaton.cpp, entry_to): equal suffixes share one fragment. Same automaton up to
  // bisimulation, far fewer DFA states (key tries under additionalProperties, UTF-8 tails);
  // off only in tests, which compare the two.
  bool share_suffixes = true;
};

struct PdaCall {
  int32_t rule;      // compiled rule index
  int32_t ret;       // state to continue in after the callee finishes
  bool tail;         // `ret` is final with no way out: the caller's frame need not be kept
};

// Checked (and applied) by the matcher when a step enters a state that has one: the key set of
// the frame the state runs in (stack.h, Frame::set). kAlive: some key of `keys` not yet in the
// set; kAdd: `key` not in the set, then added; kAll: every key of `keys` in the set. Keys are
// bit indices; `keys` is a bit set in 64-bit words.
struct PdaGuard {
  enum Kind : uint8_t { kAlive, kAdd, kAll };
  Kind kind = kAlive;
  int32_t key = -1;
  std::vector<uint64_t> keys;
  bool operator==(const PdaGuard&) const = default;
};

struct PdaState {
  int32_t rule = 0;         // compiled rule owning this state
  int32_t guard = -1;       // into Pda::guards: checked on entering the state (-1: none)
  bool final = false;       // the rule may end here
  bool has_calls = false;   // calls_begin < calls_end
  bool dead_end = false;    // final with no byte edge and no call: only finishing is left
  int32_t calls_begin = 0;  // into Pda::calls
  int32_t calls_end = 0;
};

struct Pda {
  int32_t num_classes = 0;
  uint8_t byte_class[256] = {};     // byte -> class; classes are byte intervals
  std::vector<int32_t> trans;       // [num_states * num_classes] -> state, or -1
  std::vector<PdaState> states;     // [num_states]
  std::vector<PdaCall> calls;
  std::vector<PdaGuard> guards;     // distinct guards (PdaState::guard)
  std::vector<int32_t> rule_start;  // [num_compiled_rules] start state
  std::vector<bool> rule_called;    // [num_compiled_rules] some call edge enters the rule
  std::vector<std::string> rule_names;
  int32_t root = 0;                 // compiled rule index of the grammar's root
  bool empty_language = false;      // the root matches no string at all
  int32_t max_call_chain = 1;       // most rules one byte step can enter before consuming

  int32_t next(int32_t state, uint8_t b) const { return trans[state * num_classes + byte_class[b]]; }
  size_t num_states() const { return states.size(); }
};

// Throws GrammarError for left recursion, size or time limits. `deadline` bounds the work.
Pda build_pda(const Grammar& g, const AutomatonLimits& limits);

}  // namespace deepinfer::structured
