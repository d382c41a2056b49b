#include "structured/json_schema.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "core/check.h"
#include "structured/json_schema_impl.h"
#include "structured/regex.h"
#include "structured/regular.h"
#include "structured/stack.h"

namespace deepinfer::structured {

void schema_error(const std::string& ptr, const std::string& what) {
  DI_THROW(GrammarError, "json_schema at '", ptr.empty() ? "#" : "#" + ptr, "': ", what);
}

std::string ptr_escape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

namespace {

// Keywords that never constrain an instance (annotations, containers handled elsewhere).
const std::set<std::string> kAnnotations = {
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$comment", "$vocabulary", "$defs", "definitions",
    "title", "description", "default", "examples", "example", "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType", "contentSchema", "discriminator", "xml", "externalDocs"};
// Keywords we handle.
const std::set<std::string> kSupported = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf",
    "allOf", "$ref", "nullable", "minProperties", "maxProperties", "propertyNames", "dependentRequired", "contains", "if",
    "unevaluatedProperties", "unevaluatedItems",
    "minContains", "maxContains", "x-di-patterns", "x-di-witness"};
// Keywords that constrain instances but are not supported (compile error when they matter).
const std::set<std::string> kUnsupported = {
    "uniqueItems",
    "$dynamicRef", "$recursiveRef"};

const std::vector<std::string> kAllTypes = {"null", "boolean", "object", "array", "string", "number"};

bool keyword_is_noop(const std::string& k, const json& v, const json& s) {
  // uniqueItems: nothing to check for arrays of at most one item; arrays of scalars from a finite
  // set are lowered as tracked arrays (lower_array), so the keyword is handled there.
  if (k == "uniqueItems")
    return v == false || (s.contains("maxItems") && s["maxItems"].is_number() && s["maxItems"].get<double>() <= 1) ||
           unique_scalar_values(s).has_value();
  if (k == "minProperties") return v.is_number() && v.get<double>() <= 0;
  if (k == "minContains" || k == "maxContains") return !s.contains("contains");
  return false;
}

}  // namespace

bool constraining_keyword(const std::string& k) {
  return kSupported.count(k) || kUnsupported.count(k) || k == "not" || k == "dependentSchemas" ||
         k == "dependencies" || k == "then" || k == "else";
}

SchemaLowerer::SchemaLowerer(const json& root, const JsonGrammarOptions& opt) : root_(root), opt_(opt) {
  index_ids(root, "", true);
  if (root.is_object() && root.contains("$schema") && root["$schema"].is_string()) {
    const std::string m = root["$schema"].get<std::string>();
    for (auto [tag, d] : {std::pair{"draft-03", 3}, {"draft-04", 4}, {"draft-06", 6}, {"draft-07", 7},
                          {"2019-09", 2019}, {"2020-12", 2020}})
      if (m.find(tag) != std::string::npos) draft_ = d, draft_named_ = true;
    draft4_ = draft_ <= 4;
  }
}

void SchemaLowerer::index_ids(const json& s, const std::string& ptr, bool in_root_resource) {
  if (s.is_object()) {
    if (s.contains("$id") && s["$id"].is_string() && !ptr.empty()) {
      id_index_[s["$id"].get<std::string>()] = ptr;
      in_root_resource = false;
    }
    if (s.contains("$anchor") && s["$anchor"].is_string()) {
      // Anchors are scoped by resource; "#name" resolves to the root resource's anchor, and
      // a name defined only in nested resources must be unique.
      std::string key = "#" + s["$anchor"].get<std::string>();
      auto it = id_index_.find(key);
      if (it == id_index_.end() || in_root_resource) id_index_[key] = ptr;
      else if (!anchor_in_root_.count(key)) id_index_[key] = "!ambiguous";
      if (in_root_resource) anchor_in_root_.insert(key);
    }
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "enum" && it.key() != "const" && it.key() != "default" && it.key() != "examples")
        index_ids(it.value(), ptr + "/" + ptr_escape(it.key()), in_root_resource);
  } else if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i) index_ids(s[i], ptr + "/" + std::to_string(i), in_root_resource);
  }
}

namespace {
// The candidate values of enum and/or const (const inside enum, or nothing when it is not there).
std::vector<json> enum_const_values(const json& s, const std::string& ptr) {
  std::vector<json> values;
  if (s.contains("enum")) {
    if (!s["enum"].is_array()) schema_error(ptr + "/enum", "must be an array");
    for (const auto& v : s["enum"]) values.push_back(v);
  }
  if (!s.contains("const")) return values;
  const bool in = !s.contains("enum") || std::find(values.begin(), values.end(), s["const"]) != values.end();
  values.clear();
  if (in) values.push_back(s["const"]);
  return values;
}
}  // namespace

ExprId SchemaLowerer::ws() {
  if (!opt_.flexible_whitespace) return b.empty();
  return b.repeat(b.bytes({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}), 0, opt_.max_whitespace);
}

ExprId SchemaLowerer::punct(char c) { return b.seq({ws(), b.byte(static_cast<uint8_t>(c)), ws()}); }

ExprId SchemaLowerer::string_rule() {
  if (string_rule_ < 0) {
    string_rule_ = b.declare_rule("json_string");
    b.set_inline(string_rule_, false);  // shared states: its token masks are computed once
    b.define_rule(string_rule_, b.seq({b.byte('"'), b.star(json_string_char(b)), b.byte('"')}));
  }
  return b.ref(string_rule_);
}

ExprId SchemaLowerer::any_value() {
  if (value_rule_ >= 0) return b.ref(value_rule_);
  value_rule_ = b.declare_rule("json_value");
  RuleId arr = b.declare_rule("json_array");
  object_rule_ = b.declare_rule("json_object");
  ExprId member = b.seq({string_rule(), punct(':'), b.ref(value_rule_)});
  b.define_rule(object_rule_, b.seq({b.byte('{'), ws(), b.opt(b.seq({member, b.star(b.seq({punct(','), member}))})),
                                     ws(), b.byte('}')}));
  ExprId v = b.ref(value_rule_);
  b.define_rule(arr, b.seq({b.byte('['), ws(), b.opt(b.seq({v, b.star(b.seq({punct(','), v}))})), ws(), b.byte(']')}));
  b.define_rule(value_rule_, b.alt({b.ref(object_rule_), b.ref(arr), string_rule(), number_rule(false),
                                    b.literal("true"), b.literal("false"), b.literal("null")}));
  return b.ref(value_rule_);
}

ExprId SchemaLowerer::any_object() {
  any_value();
  return b.ref(object_rule_);
}

ExprId SchemaLowerer::lower(const json& s, const std::string& ptr, int depth) {
  if (depth > 200) schema_error(ptr, "schema nesting too deep (recursive allOf/$ref?)");
  if (std::chrono::steady_clock::now() > opt_.deadline)
    schema_error(ptr, "compilation exceeded its time limit while lowering the schema");
  if (s.is_boolean()) return s.get<bool>() ? any_value() : b.nothing();
  if (!s.is_object()) schema_error(ptr, "a schema must be an object or a boolean");
  if (s.contains("$schema")) {
    // A custom metaschema may switch vocabularies off; only the standard drafts are understood.
    std::string m = s["$schema"].is_string() ? s["$schema"].get<std::string>() : "";
    if (m.find("json-schema.org/") == std::string::npos)
      schema_error(ptr + "/$schema", "unknown metaschema '" + m + "'");
  }
  // Older drafts' meaning (the root's $schema): through draft 7 `$ref` makes its siblings
  // ignored; drafts before 7 have no if/then/else; 2019-09 and 2020-12 (also the default, as
  // python-jsonschema's validator_for) have no `dependencies` keyword.
  if (draft_ <= 7 && s.contains("$ref") && s.size() > 1) {
    if (!s["$ref"].is_string()) schema_error(ptr + "/$ref", "must be a string");
    return lower_ref(s["$ref"].get<std::string>(), ptr + "/$ref");
  }
  if ((draft_ < 7 && (s.contains("if") || s.contains("then") || s.contains("else"))) ||
      (draft_ >= 2019 && s.contains("dependencies"))) {
    json rest = s;
    for (const char* k : {"if", "then", "else"})
      if (draft_ < 7) rest.erase(k);
    if (draft_ >= 2019) rest.erase("dependencies");
    return lower(rest, ptr, depth + 1);
  }
  if (s.contains("enum") || s.contains("const")) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (k != "enum" && k != "const" && k != "type" && k != "nullable" && (kSupported.count(k) || kUnsupported.count(k) || k == "not"))
        return lower_filtered_enum(s, ptr, depth);
    }
  }
  if (s.contains("unevaluatedProperties") || s.contains("unevaluatedItems")) return lower_unevaluated(s, ptr, depth);
  if (s.contains("if")) return lower_if(s, ptr, depth);
  if (s.contains("not")) return lower_not(s, ptr, depth);
  if (s.contains("dependencies") || s.contains("dependentSchemas")) return lower_dependent(s, ptr, depth);
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (kUnsupported.count(k) && !keyword_is_noop(k, it.value(), s))
      schema_error(ptr + "/" + ptr_escape(k), "keyword '" + k + "' is not supported");
  }
  if (s.contains("allOf") || (s.contains("$ref") && s.size() > 1)) {
    bool only_ref = true;
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "$ref" && kAnnotations.count(it.key()) == 0 && kSupported.count(it.key())) only_ref = false;
    if (!(s.contains("$ref") && only_ref && !s.contains("allOf"))) {
      json merged = merge_allof(s, ptr, depth);
      return lower(merged, ptr, depth + 1);
    }
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) schema_error(ptr + "/$ref", "must be a string");
    return lower_ref(s["$ref"].get<std::string>(), ptr + "/$ref");
  }
  if (s.contains("anyOf") || s.contains("oneOf")) return lower_anyof(s, ptr, depth);
  return lower_object_schema(s, ptr, depth);
}

ExprId SchemaLowerer::lower_object_schema(const json& s, const std::string& ptr, int depth) {
  std::vector<std::string> types = kAllTypes;
  bool integer_only = false;
  if (s.contains("type")) {
    const json& t = s["type"];
    std::vector<std::string> listed;
    if (t.is_string()) listed.push_back(t.get<std::string>());
    else if (t.is_array()) for (const auto& x : t) {
      if (!x.is_string()) schema_error(ptr + "/type", "type entries must be strings");
      listed.push_back(x.get<std::string>());
    }
    else schema_error(ptr + "/type", "must be a string or an array of strings");
    types.clear();
    bool has_number = false, has_integer = false;
    for (const auto& x : listed) {
      if (x == "integer") has_integer = true;
      else if (x == "number") has_number = true;
      else if (std::find(kAllTypes.begin(), kAllTypes.end(), x) != kAllTypes.end()) types.push_back(x);
      else schema_error(ptr + "/type", "unknown type '" + x + "'");
    }
    if (has_number || has_integer) types.push_back("number");
    integer_only = has_integer && !has_number;
  }
  if (s.contains("nullable") && s["nullable"] == true && std::find(types.begin(), types.end(), "null") == types.end())
    types.push_back("null");
  if (s.contains("enum") || s.contains("const")) {
    const std::vector<json> values = enum_const_values(s, ptr);
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (k != "enum" && k != "const" && k != "type" && k != "nullable" && kSupported.count(k))
        schema_error(ptr + "/" + ptr_escape(k), "keyword '" + k + "' combined with enum/const is not supported");
    }
    std::vector<ExprId> alts;
    for (size_t i = 0; i < values.size(); ++i) {
      const json& v = values[i];
      std::string vt = v.is_null() ? "null" : v.is_boolean() ? "boolean" : v.is_object() ? "object"
                       : v.is_array() ? "array" : v.is_string() ? "string" : "number";
      if (std::find(types.begin(), types.end(), vt) == types.end()) continue;
      if (vt == "number" && integer_only && v.is_number_float() && v.get<double>() != static_cast<double>(static_cast<int64_t>(v.get<double>())))
        continue;
      alts.push_back(literal(v, ptr + "/enum/" + std::to_string(i)));
    }
    return b.alt(std::move(alts));
  }
  std::vector<ExprId> alts;
  for (const auto& t : types) {
    if (t == "number") alts.push_back(lower_number(s, ptr, integer_only));
    else alts.push_back(lower_type(t, s, ptr, depth));
  }
  return b.alt(std::move(alts));
}

ExprId SchemaLowerer::lower_type(const std::string& t, const json& s, const std::string& ptr, int depth) {
  if (t == "null") return b.literal("null");
  if (t == "boolean") return b.alt({b.literal("true"), b.literal("false")});
  if (t == "string") return lower_string(s, ptr);
  if (t == "object") return lower_object(s, ptr, depth);
  if (t == "array") return lower_array(s, ptr, depth);
  DI_CHECK(false, "unhandled type ", t);
  return b.nothing();
}

// enum/const next to other keywords: the finite candidate set, filtered by validating each
// value against the rest of the schema (compiled on its own and matched byte by byte).
ExprId SchemaLowerer::lower_filtered_enum(const json& s, const std::string& ptr, int depth) {
  const std::vector<json> values = enum_const_values(s, ptr);
  json rest = s;
  rest.erase("enum");
  rest.erase("const");
  std::vector<ExprId> alts;
  for (size_t i = 0; i < values.size(); ++i)
    if (validates(rest, ptr, values[i])) alts.push_back(literal(values[i], ptr + "/enum/" + std::to_string(i)));
  return b.alt(std::move(alts));
}

bool SchemaLowerer::validates(const json& schema, const std::string& ptr, const json& value) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.is_object() && schema.contains("not")) {
    json rest = schema;
    rest.erase("not");
    return !validates(schema["not"], ptr + "/not", value) && validates(rest, ptr, value);
  }
  return pda_matches(*validation_pda(schema, ptr), value.dump());
}

namespace {
// The automaton of the empty schema {} depends only on these (its lowering reads no $ref, $id
// or other part of the root): every `not`/enum filter ends in validating a value against {}
// (the rest of {"not": S} without the not), which built it afresh each time, ~30% of compiling
// MaskBench's Synthesized split.
using EmptyKey = std::tuple<bool, int32_t, bool, int, bool, bool>;
std::mutex g_empty_mu;
std::map<EmptyKey, std::shared_ptr<const Pda>> g_empty_pdas;
}  // namespace

// The compiled schema (its own grammar, byte-level PDA) a value is matched against. Built once
// per (schema, pointer) per lowerer: enum values filtered by the same sibling keywords share it.
// Exactly the automaton built before caching: the sub-lowerer depends only on the root, the
// options and this lowerer's nesting, all fixed for this lowerer; a build that throws caches
// nothing (the error propagates as before).
std::shared_ptr<const Pda> SchemaLowerer::validation_pda(const json& schema, const std::string& ptr) {
  const bool empty = schema.is_object() && schema.empty();
  EmptyKey ek{opt_.flexible_whitespace, opt_.max_whitespace, opt_.format_assertion, draft_, draft_named_, draft4_};
  std::string key;
  if (empty) {
    // What the uncached path checks before it can fail: the nesting bound and the deadline.
    if (nest_ + 1 > kMaxNesting) schema_error("", "schema checks nested too deeply (recursive oneOf/not/enum proofs)");
    if (std::chrono::steady_clock::now() > opt_.deadline)
      schema_error(ptr, "compilation exceeded its time limit while lowering the schema");
    std::lock_guard<std::mutex> lock(g_empty_mu);
    auto it = g_empty_pdas.find(ek);
    if (it != g_empty_pdas.end()) return it->second;
  } else {
    key = ptr + '\n' + schema.dump();
    auto it = validation_pdas_.find(key);
    if (it != validation_pdas_.end()) return it->second;
  }
  SchemaLowerer sub(root_, opt_);
  nest_into(sub);
  ExprId e = sub.lower(schema, ptr, 1);
  RuleId root = sub.b.declare_rule("root");
  sub.b.define_rule(root, e);
  Grammar g = std::move(sub.b).finish(root);
  auto pda = std::make_shared<const Pda>(build_pda(g, AutomatonLimits{}));
  if (empty) {
    std::lock_guard<std::mutex> lock(g_empty_mu);
    return g_empty_pdas.emplace(ek, std::move(pda)).first->second;
  }
  validation_pdas_.emplace(std::move(key), pda);
  return pda;
}

// anyOf / oneOf: one branch per alternative, each merged with the sibling keywords.
ExprId SchemaLowerer::lower_anyof(const json& s, const std::string& ptr, int depth) {
  // With both, anyOf splits first; its branches keep the oneOf among their sibling keywords.
  const std::string kw = s.contains("anyOf") ? "anyOf" : "oneOf";
  const json& branches = s[kw];
  if (!branches.is_array() || branches.empty()) schema_error(ptr + "/" + kw, "must be a non-empty array");
  json rest = s;
  rest.erase(kw);
  bool rest_constrains = false;
  for (auto it = rest.begin(); it != rest.end(); ++it)
    if (kSupported.count(it.key())) rest_constrains = true;
  std::vector<ExprId> alts;
  std::vector<json> merged, raw;  // branches with and without the sibling keywords
  std::string overlap_ptr;  // first oneOf branch not provably disjoint from an earlier one
  for (size_t i = 0; i < branches.size(); ++i) {
    const std::string bp = ptr + "/" + kw + "/" + std::to_string(i);
    json branch = branches[i];
    if (rest_constrains) branch = json{{"allOf", json::array({rest, branch})}};
    if (kw == "oneOf") {
      // Exclusive branches make oneOf an anyOf; prove it pairwise (sound, may say "unsure").
      for (const auto& prev : merged)
        if (overlap_ptr.empty() && !disjoint(prev, branch, bp, depth + 1)) overlap_ptr = bp;
      merged.push_back(branch);
      raw.push_back(branches[i]);
    }
    alts.push_back(lower(branch, bp, depth + 1));
  }
  if (overlap_ptr.empty()) return b.alt(std::move(alts));
  // Branches may overlap: exact when all are regular (product accepting exactly one branch).
  if (alts.size() > 16) schema_error(overlap_ptr, "oneOf with overlapping branches: more than 16 branches");
  std::vector<Dfa> dfas;
  for (ExprId a : alts) {
    auto d = expr_to_dfa(b, a);
    if (!d) return exclusive_branches(merged, raw, overlap_ptr, depth);
    dfas.push_back(std::move(*d));
  }
  std::vector<const Dfa*> ops;
  for (const auto& d : dfas) ops.push_back(&d);
  try {
    // Minimised: overlapping branches are often searched patterns (`{"pattern": "admin"}`),
    // whose product keeps many equivalent states apart (regular.h dfa_minimize).
    return dfa_to_expr(b, dfa_minimize(dfa_product(ops, [](uint32_t m) { return m != 0 && (m & (m - 1)) == 0; })));
  } catch (const GrammarError& e) {
    schema_error(overlap_ptr, std::string("oneOf with overlapping branches: ") + e.what());
  }
}

}  // namespace deepinfer::structured
