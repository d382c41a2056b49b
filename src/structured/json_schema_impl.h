// Internals of the JSON Schema lowering, split over json_schema.cpp (dispatch, objects, arrays,
// references) and json_schema_parts.cpp (numbers, strings, formats, literals, allOf merging).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "structured/json_schema.h"
#include "structured/regular.h"

namespace deepinfer::structured {

using json = nlohmann::ordered_json;
struct Pda;

[[noreturn]] void schema_error(const std::string& ptr, const std::string& what);
std::string ptr_escape(const std::string& key);  // JSON pointer token escaping
// A keyword that may constrain instances (unknown keywords are annotations).
bool constraining_keyword(const std::string& k);
// uniqueItems that a tracked array decides exactly: `s` an array schema (no prefixItems,
// contains, minItems > 1 or limiting maxItems) whose items are one of a few scalars written one
// way (an enum/const of strings, booleans or null; type boolean or null). The distinct values.
std::optional<std::vector<json>> unique_scalar_values(const json& s);

// Integers in [lo, hi] (either side open) as decimal text without leading zeros.
// neg_zero: also the spelling "-0" when 0 is in range (not when a fraction follows).
ExprId int_range_expr(GrammarBuilder& b, std::optional<int64_t> lo, std::optional<int64_t> hi, bool neg_zero);
// Intersection of regular expressions (DFA product); throws GrammarError when too large.
ExprId intersect(GrammarBuilder& b, const std::vector<ExprId>& parts);
// x{mn, mx} (mx < 0: unbounded) without unrolling large counts: bounds up to `direct` unroll,
// larger ones count blocks of `block` copies, a called rule, recursively, so any bound up to
// kMaxCountBound costs O(block log bound) states. Strings alone use kStringDirect/kStringBlock.
inline constexpr int64_t kMaxCountBound = 100'000'000;
// States allowed for a string's pattern/format/length intersection automaton.
inline constexpr int32_t kMaxStringStates = 100'000;
ExprId counted_repeat(GrammarBuilder& b, ExprId x, int64_t mn, int64_t mx, int64_t direct = 128, int64_t block = 64);
inline constexpr int64_t kStringDirect = 256, kStringBlock = 128;
// An integer divisible by k (k >= 1), any sign.
ExprId multiple_of_expr(GrammarBuilder& b, int64_t k);

struct PatternProp {
  std::string ptr;     // JSON pointer of the pattern's schema
  const json* schema;  // value schema for keys matching it
  Dfa dfa;             // over the quoted, escaped key
};

struct CountBounds {  // minProperties / maxProperties, dependentRequired
  int64_t min = 0, max = -1;  // max < 0: unbounded
  std::string ptr;            // for errors
  // dependentRequired: (trigger index, mask of indices) - the trigger present needs all of the mask.
  std::vector<std::pair<int, uint32_t>> deps;
  bool deps_ok(uint32_t used) const {
    for (auto [t, m] : deps)
      if ((used >> t & 1) && (used & m) != m) return false;
    return true;
  }
};

// One way an object can fail a simple object schema (`not` of properties/required): a
// required name absent, or a declared name present with a value failing its schema.
struct MemberOp {
  bool absent;
  std::string name;
  json value_schema;  // present: the schema the value must fail
  json key_schema;    // set (a string schema): some member whose key satisfies it has a value failing value_schema
};
using Patch = std::vector<MemberOp>;  // all of these at once

struct ObjectParts {  // a lowered object schema's members, for variants of it (json_schema_logic.cpp)
  std::vector<std::string> names;
  std::vector<const json*> schemas;
  std::vector<ExprId> props;
  std::vector<bool> required;
  ExprId additional;
  const json* add_schema;
  const Dfa* names_dfa;  // propertyNames, or null
  bool has_patterns;
};

struct ArrayShape {  // an array schema's item schemas and count bounds
  std::vector<const json*> prefix;
  std::vector<std::string> prefix_ptrs;
  const json* items;
  std::string items_ptr;
  int64_t min_items, max_items;  // max < 0: unbounded
};

class SchemaLowerer {
 public:
  SchemaLowerer(const json& root, const JsonGrammarOptions& opt);
  ExprId lower(const json& s, const std::string& ptr, int depth = 0);
  ExprId any_value();
  ExprId any_object();
  GrammarBuilder b;

 private:
  // json_schema.cpp
  ExprId lower_object_schema(const json& s, const std::string& ptr, int depth);
  ExprId lower_type(const std::string& t, const json& s, const std::string& ptr, int depth);
  ExprId lower_object(const json& s, const std::string& ptr, int depth);
  ExprId lower_array(const json& s, const std::string& ptr, int depth);
  ExprId lower_ref(const std::string& ref, const std::string& ptr);
  ExprId lower_anyof(const json& s, const std::string& ptr, int depth);
  ExprId lower_filtered_enum(const json& s, const std::string& ptr, int depth);
  // json_schema_logic.cpp
  ExprId lower_not(const json& s, const std::string& ptr, int depth);
  ExprId exclusive_branches(const std::vector<json>& merged, const std::vector<json>& raw, const std::string& ptr,
                            int depth);
  ExprId witness_members(const json& w, const ObjectParts& o, const CountBounds& count, const std::string& ptr,
                         int depth);
  ExprId lower_contains(const json& s, const ArrayShape& shape, const std::string& ptr, int depth);
  json close_unevaluated(const json& s, const std::string& ptr, int depth);
  ExprId lower_unevaluated(const json& s, const std::string& ptr, int depth);
  ExprId lower_if(const json& s, const std::string& ptr, int depth);
  ExprId lower_dependent(const json& s, const std::string& ptr, int depth);
  bool disjoint(const json& a, const json& b, const std::string& ptr, int depth);
  bool disjoint_typed(const json& a, const json& b, const std::string& t, const std::string& ptr, int depth);
  bool accepts_all_of_type(const json& s, const std::string& t);
  json flatten(const json& s, const std::string& ptr, int depth);
  std::optional<std::vector<Patch>> object_failures(const json& n, const std::string& nptr, int depth);
  void array_difference(const json& rt, const json& n, const std::string& ptr, const std::string& nptr, int depth,
                        std::vector<ExprId>& alts);
  void object_difference(const json& rt, const json& n, const std::string& ptr, const std::string& nptr, int depth,
                         std::vector<ExprId>& alts);
  bool validates(const json& schema, const std::string& ptr, const json& value);
  std::shared_ptr<const Pda> validation_pda(const json& schema, const std::string& ptr);
  const json* resolve(const std::string& ref, const std::string& ptr, std::string* target_ptr);
  void index_ids(const json& s, const std::string& ptr, bool in_root_resource);
  ExprId members(const std::vector<ExprId>& props, const std::vector<bool>& required, ExprId additional,
                 const CountBounds& count);
  ExprId counted_members(const std::vector<ExprId>& props, const std::vector<bool>& required, ExprId additional,
                         const CountBounds& count);
  ExprId pattern_members(const std::vector<std::string>& names, const std::vector<PatternProp>& pats,
                         const Dfa* names_dfa, ExprId add_value, const std::string& ptr, int depth);
  ExprId key_not_in(const std::vector<std::string>& keys);
  ExprId unique_array(const std::vector<json>& values, bool non_empty);
  ExprId tracked_object(const std::vector<std::string>& names, const std::vector<ExprId>& values,
                        const std::vector<bool>& required, ExprId additional);

  // json_schema_parts.cpp
  ExprId lower_number(const json& s, const std::string& ptr, bool integer);
  ExprId lower_string(const json& s, const std::string& ptr);
  ExprId format_expr(const std::string& fmt, const std::string& ptr);
  ExprId literal(const json& v, const std::string& ptr);
  ExprId string_literal(const std::string& s);
  json merge_allof(const json& s, const std::string& ptr, int depth);
  void merge_into(json& a, const json& b, const std::string& ptr);
  json deref_top(const json& s, const std::string& ptr, int depth);

 public:
  ExprId ws();                      // whitespace between JSON tokens ("" when compact)
  ExprId punct(char c);             // ws c ws around structural characters
  ExprId string_rule();             // any JSON string
  ExprId number_rule(bool integer);
  ExprId integer_spellings();       // every spelling of an integral value (a shared rule)
  ExprId integer_spellings_expr();  // the same as an expression

 private:
  // Sub-lowerers (compile a schema on its own to test values or languages) may nest, e.g. a
  // oneOf proof that validates an enum against a schema whose own oneOf needs a proof; the
  // depth is bounded so recursive schemas cannot recurse without end.
  static constexpr int kMaxNesting = 4;
  int nest_ = 0;
  int closing_ = 0;  // close_unevaluated calls in progress
  void nest_into(SchemaLowerer& sub) const {
    sub.nest_ = nest_ + 1;
    if (sub.nest_ > kMaxNesting) schema_error("", "schema checks nested too deeply (recursive oneOf/not/enum proofs)");
  }
  const json& root_;
  int draft_ = 2020;     // the root's $schema: 3, 4, 6, 7, 2019 or 2020 (the default)
  bool draft_named_ = false;  // $schema named one of those drafts
  bool draft4_ = false;  // root $schema is draft 3/4: integers have no fraction part
  JsonGrammarOptions opt_;
  RuleId value_rule_ = -1, string_rule_ = -1, object_rule_ = -1, integer_rule_ = -1;
  std::map<std::string, RuleId> ref_rules_;        // target pointer -> rule
  std::map<std::string, std::string> id_index_;    // $id / $anchor -> pointer
  std::set<std::string> anchor_in_root_;           // anchors defined in the root resource
  // validation_pda: "pointer\nschema" -> its automaton (schemas other than {}).
  std::map<std::string, std::shared_ptr<const Pda>> validation_pdas_;
};

}  // namespace deepinfer::structured
