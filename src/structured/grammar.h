// The one internal grammar form. Regex, JSON schema, EBNF and choice lists all lower to a
// Grammar: a list of named rules whose bodies are expression trees over BYTES (not code
// points: UTF-8 is spelled out as byte sequences, so a token that splits a character is
// handled like any other byte string).
//
// Expressions live in one arena (Grammar::exprs) and are referred to by ExprId; the builder
// simplifies while building (Nothing absorbs sequences, Empty disappears from them), so a
// lowering never has to special-case unsatisfiable parts such as a `false` schema.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace deepinfer::structured {

using ExprId = int32_t;
using RuleId = int32_t;

enum class ExprKind : uint8_t {
  kNothing,    // matches no string (a `false` schema, an empty enum)
  kEmpty,      // matches only ""
  kBytes,      // one byte from `ranges`
  kSeq,        // children in order
  kAlt,        // any child
  kRepeat,     // child repeated [min, max] times; max = kUnbounded for *, +
  kRef,        // the body of rule `rule` (recursion allowed, left recursion rejected)
  kAutomaton,  // an explicit byte automaton (`automaton` indexes Grammar::automata)
};

inline constexpr int32_t kUnbounded = -1;

struct ByteRange {
  uint8_t lo, hi;  // inclusive
};

struct Expr {
  ExprKind kind = ExprKind::kNothing;
  std::vector<ByteRange> ranges;  // kBytes: sorted, disjoint, non-adjacent
  std::vector<ExprId> children;   // kSeq, kAlt: >= 2; kRepeat: exactly 1
  int32_t min = 0, max = 0;       // kRepeat
  RuleId rule = -1;               // kRef
  int32_t automaton = -1;         // kAutomaton
  int32_t mark = -1;              // kBytes: index into Grammar::marks (-1: none)
};

// Object-key tracking (json_schema_obj.cpp, tracked objects): a byte that carries a mark makes
// the matcher consult and update the set of keys already written in the enclosing object, so
// declared keys are accepted in any order without enumerating orders in the grammar. The
// automaton gives the state entered by a marked byte a guard (automaton.h, PdaGuard); every
// mark of one object lies in one rule that is never inlined (one stack frame holds the set).
enum class MarkKind : uint8_t {
  kKeyPrefix,  // inside key `key`'s literal: alive while that key is not yet written
  kKeyAdd,     // key `key`'s closing quote: the key must be new, and is now written
  kMore,       // a member separator: some key of `keys` must still be unwritten
  kClose,      // the closing brace: every key of `keys` (the required ones) must be written
};
struct GrammarMark {
  MarkKind kind = MarkKind::kKeyPrefix;
  int32_t object = 0;         // which tracked object (marks of different objects never mix)
  int32_t key = -1;           // kKeyPrefix, kKeyAdd
  std::vector<int32_t> keys;  // kMore, kClose
};

// A small explicit automaton (NFA without epsilons) for languages that are awkward as trees:
// complements (keys other than the declared ones), divisibility (multipleOf).
struct ByteAutomaton {
  struct Edge {
    int32_t from;
    uint8_t lo, hi;
    int32_t to;
  };
  int32_t num_states = 0;
  int32_t start = 0;
  std::vector<Edge> edges;
  std::vector<bool> final;  // [num_states]
};

struct Rule {
  std::string name;
  ExprId body = -1;  // -1 while declared but not yet defined
  // false keeps the rule a separate automaton even when it is not recursive: shared lexical
  // rules (a JSON string) then have one set of states whose token masks are cached once.
  bool inline_ok = true;
};

// Special tokens as terminals (`<[id]>` in EBNF and Lark): inside the grammar engine, special
// token `id` is spelled by these bytes: 0xFF, then the id in four 6-bit digits (0x80-0xBF each,
// most significant first). 0xFF never occurs in UTF-8, so no text a grammar describes can
// spell a special token; a vocabulary that offers terminals (TokenizerInfo::terminal_ids) gives
// each of them these bytes and allows no other token holding 0xFF.
inline constexpr int32_t kMaxTerminalId = (1 << 24) - 1;
std::string special_token_bytes(int32_t id);

struct Grammar {
  std::vector<Expr> exprs;
  std::vector<Rule> rules;
  std::vector<ByteAutomaton> automata;
  std::vector<GrammarMark> marks;
  int32_t num_tracked_objects = 0;
  std::vector<int32_t> special_terminals;  // ids named as `<[id]>` (sorted): the vocabulary must offer them
  RuleId root = -1;

  std::string to_string() const;  // EBNF-like dump for debugging and error messages
  std::string expr_to_string(ExprId e) const;
};

// Builds a Grammar with on-the-fly simplification. All constructors return ExprIds into the
// grammar under construction; ids stay valid for the builder's lifetime.
class GrammarBuilder {
 public:
  GrammarBuilder();

  ExprId nothing() const { return kNothingId; }
  ExprId empty() const { return kEmptyId; }
  ExprId bytes(std::vector<ByteRange> ranges);  // normalises; empty set -> nothing()
  ExprId byte(uint8_t b) { return bytes({{b, b}}); }
  ExprId byte_range(uint8_t lo, uint8_t hi) { return bytes({{lo, hi}}); }
  ExprId literal(std::string_view s);
  ExprId seq(std::vector<ExprId> parts);
  ExprId alt(std::vector<ExprId> parts);
  ExprId repeat(ExprId e, int32_t min, int32_t max);
  ExprId star(ExprId e) { return repeat(e, 0, kUnbounded); }
  ExprId plus(ExprId e) { return repeat(e, 1, kUnbounded); }
  ExprId opt(ExprId e) { return repeat(e, 0, 1); }
  ExprId automaton(ByteAutomaton a);
  // One byte carrying mark `m` (never merged with other expressions).
  ExprId marked_byte(uint8_t b, GrammarMark m);
  int32_t new_tracked_object() { return g_.num_tracked_objects++; }
  bool has_marks() const { return !g_.marks.empty(); }
  // Code points [lo, hi] (surrogates excluded) as UTF-8 byte sequences.
  ExprId codepoint_range(uint32_t lo, uint32_t hi);
  ExprId codepoints(const std::vector<std::pair<uint32_t, uint32_t>>& ranges);
  // Special token `id` as a terminal (special_token_bytes), recorded in special_terminals.
  // InvalidArgument past kMaxTerminalId.
  ExprId special_token(int32_t id);
  // Copies a finished grammar in (its rules renamed where they clash, automata, marks and
  // tracked objects renumbered) and returns a reference to its root: how Lark's %json embeds
  // a JSON schema's grammar.
  ExprId embed(const Grammar& g);

  RuleId declare_rule(std::string name);  // unique name; body defined later
  void define_rule(RuleId r, ExprId body);
  void set_inline(RuleId r, bool ok) { g_.rules[r].inline_ok = ok; }
  ExprId ref(RuleId r);
  RuleId find_rule(std::string_view name) const;  // -1 if absent
  const Rule& rule(RuleId r) const { return g_.rules[r]; }
  const Expr& expr(ExprId e) const { return g_.exprs[e]; }
  const ByteAutomaton& automaton_at(int32_t i) const { return g_.automata[i]; }
  int32_t num_rules() const { return static_cast<int32_t>(g_.rules.size()); }
  size_t num_exprs() const { return g_.exprs.size(); }

  // Finishes: checks every rule is defined, sets the root.
  Grammar finish(RuleId root) &&;

 private:
  static constexpr ExprId kNothingId = 0;
  static constexpr ExprId kEmptyId = 1;
  ExprId add(Expr e);
  Grammar g_;
  std::unordered_map<std::string, RuleId> rule_index_;  // rule name -> id
  std::unordered_map<std::string, int32_t> next_suffix_;  // base name -> next _N to try
};

}  // namespace deepinfer::structured
