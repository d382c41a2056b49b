// JSON Schema (draft 2020-12, plus draft-4/7 spellings: boolean exclusiveMinimum, array `items`
// with `additionalItems`, `definitions`, OpenAPI `nullable`) -> grammar.
//
// Exactness contract: for a schema that compiles, the grammar accepts a compact serialization
// (object keys in document order, strings escaped as nlohmann::json / Python json.dumps with
// ensure_ascii=False write them) exactly when the instance is valid. What cannot be expressed
// exactly is a GrammarError naming the keyword and its JSON pointer.
//
// Supported beyond the basics: patternProperties and propertyNames (key languages partitioned
// by product DFAs), pattern/format/minLength/maxLength together (DFA intersection), long
// length/item bounds alone (nested block rules, up to kMaxCountBound), decimal numeric bounds
// and multipleOf (exact digit languages; bounded numbers are written without an exponent),
// min/maxProperties and dependentRequired (member sets, any-order objects only),
// dependentSchemas / draft-7 dependencies, if/then/else, contains/minContains/maxContains,
// `not` as a per-type difference (strings/numbers by DFA difference within canonical
// spellings, objects by properties/required failure patches, arrays by length/items
// failures), oneOf proven exclusive (schema-level disjointness) or rewritten as "branch and
// not the others" (or a product DFA when every branch is regular), unevaluatedProperties /
// unevaluatedItems where the evaluated set is static or splits over anyOf/oneOf/if,
// enum/const next to any other keywords (each value validated against the rest).
// Known limits (errors naming keyword and pointer, never a looser grammar): uniqueItems: true,
// $dynamicRef, remote $ref, `not` of other object/array keywords, unevaluated* next to
// dependentSchemas or contains, minProperties / maxProperties with more than
// kAnyOrderMaxProperties named properties, oneOf with overlapping branches whose complement is
// not expressible. Declared properties are accepted in any order: up to kAnyOrderMaxProperties
// by enumerating the sets written so far in the grammar; beyond, the matcher tracks the set of
// keys written (a "tracked object", json_schema_obj.cpp), so size costs no exponential states.
// Drafts: the root's $schema selects draft 4/6/7/2019-09/2020-12 meaning ($ref siblings ignored
// through draft 7, no if/then/else before draft 7, draft-4 integers without fraction, no
// `dependencies` from 2019-09 on); without $schema, 2020-12.
#pragma once
#include <chrono>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct JsonGrammarOptions {
  bool flexible_whitespace = false;
  int32_t max_whitespace = 4;   // flexible: at most this many whitespace bytes at each place
  bool format_assertion = true; // `format` constrains strings (date, email, uuid, ...)
  // Past this the lowering fails with a GrammarError naming the time limit.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

inline constexpr int kAnyOrderMaxProperties = 8;

Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonGrammarOptions& opt);
// Any JSON object ({"json_object": true}).
Grammar json_object_grammar(const JsonGrammarOptions& opt);

}  // namespace deepinfer::structured
