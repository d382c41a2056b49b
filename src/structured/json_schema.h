// JSON Schema (draft 2020-12, plus draft-4/7 spellings: boolean exclusiveMinimum, array `items`
// with `additionalItems`, `definitions`, OpenAPI `nullable`) -> grammar.
//
// Exactness contract: for a schema that compiles, the grammar accepts a compact serialization
// (object keys in document order, strings escaped as nlohmann::json / Python json.dumps with
// ensure_ascii=False write them) exactly when the instance is valid. What cannot be expressed
// exactly is a GrammarError naming the keyword and its JSON pointer.
//
// Supported beyond the basics: patternProperties and propertyNames (key languages partitioned
// by product DFAs), pattern/format/minLength/maxLength together (DFA intersection),
// min/maxProperties (member counts, any-order objects only), oneOf with overlapping branches when
// every branch is regular (product accepting exactly one), `not` of boolean and type-only
// schemas, enum/const next to any other keywords (each value validated against the rest).
// Known limits (errors, not silent): other `not`, if/then/else, contains, uniqueItems: true,
// dependent*, unevaluated*, $dynamicRef, remote $ref, length bounds above 10000, non-integer
// numeric bounds, oneOf with overlapping non-regular branches. Declared properties are accepted
// in any order when there are at most kAnyOrderMaxProperties of them, otherwise in schema order.
#pragma once
#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct JsonGrammarOptions {
  bool flexible_whitespace = false;
  int32_t max_whitespace = 4;   // flexible: at most this many whitespace bytes at each place
  bool format_assertion = true; // `format` constrains strings (date, email, uuid, ...)
};

inline constexpr int kAnyOrderMaxProperties = 8;

Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonGrammarOptions& opt);
// Any JSON object ({"json_object": true}).
Grammar json_object_grammar(const JsonGrammarOptions& opt);

}  // namespace deepinfer::structured
