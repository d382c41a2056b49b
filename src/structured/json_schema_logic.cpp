// Schema logic for the JSON Schema lowering: proving two schemas disjoint (oneOf branches),
// `not` as a per-type difference, and dependentRequired / dependentSchemas as rewrites.
#include <algorithm>
#include <optional>
#include <set>

#include "core/check.h"
#include "structured/json_schema_impl.h"
#include "structured/regex.h"
#include "structured/regular.h"

namespace deepinfer::structured {
namespace {

const std::vector<std::string> kTypes = {"null", "boolean", "object", "array", "string", "number"};

// Keywords that only constrain instances of one type (others are annotations for other types).
const std::map<std::string, std::set<std::string>> kTypeKeywords = {
    {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
    {"string", {"minLength", "maxLength", "pattern", "format", "x-di-patterns"}},
    {"object", {"properties", "required", "additionalProperties", "patternProperties", "minProperties",
                "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "x-di-witness"}},
    {"array", {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "contains", "minContains",
               "maxContains", "uniqueItems"}}};

const std::set<std::string> kAnnotationKeys = {
    "$schema", "$id", "$anchor", "$dynamicAnchor", "$comment", "$vocabulary", "$defs", "definitions", "title",
    "description", "default", "examples", "example", "deprecated", "readOnly", "writeOnly", "contentEncoding",
    "contentMediaType", "contentSchema", "discriminator", "xml", "externalDocs", "nullable"};

// Instance types a schema admits by its `type` / `nullable` alone ("integer" kept apart).
std::set<std::string> declared_types(const json& s) {
  std::set<std::string> out;
  if (!s.is_object() || !s.contains("type")) {
    out = {kTypes.begin(), kTypes.end()};
    return out;
  }
  const json& t = s["type"];
  if (t.is_string()) out.insert(t.get<std::string>());
  else if (t.is_array())
    for (const auto& x : t)
      if (x.is_string()) out.insert(x.get<std::string>());
  if (s.contains("nullable") && s["nullable"] == true) out.insert("null");
  return out;
}

bool type_admits(const std::set<std::string>& ts, const std::string& t) {
  return ts.count(t) || (t == "integer" && ts.count("number"));
}

// The enum/const candidates of a schema, if it has any.
std::optional<std::vector<json>> value_list(const json& s) {
  if (!s.is_object() || (!s.contains("enum") && !s.contains("const"))) return std::nullopt;
  std::vector<json> out;
  if (s.contains("enum") && s["enum"].is_array())
    for (const auto& v : s["enum"]) out.push_back(v);
  if (s.contains("const")) {
    if (!s.contains("enum")) out = {s["const"]};
    else if (std::find(out.begin(), out.end(), s["const"]) != out.end()) out = {s["const"]};
    else out.clear();
  }
  return out;
}

}  // namespace

// True when `s` accepts every instance of type t (only annotations and other types' keywords).
bool SchemaLowerer::accepts_all_of_type(const json& s, const std::string& t) {
  if (s.is_boolean()) return s.get<bool>();
  if (!s.is_object()) return false;
  if (!type_admits(declared_types(s), t)) return false;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (k == "type" || kAnnotationKeys.count(k) || !constraining_keyword(k)) continue;
    bool other_type = false;
    for (const auto& [tt, keys] : kTypeKeywords)
      if (tt != t && !(t == "integer" && tt == "number") && keys.count(k)) other_type = true;
    if (!other_type) return false;
  }
  return true;
}

// The schema with allOf merged and a top-level $ref resolved (throws GrammarError when that
// is not possible).
json SchemaLowerer::flatten(const json& s, const std::string& ptr, int depth) {
  json d = deref_top(s, ptr, depth);
  if (d.is_object() && d.contains("allOf")) d = merge_allof(d, ptr, depth + 1);
  return d;
}

// Sound disjointness: true only when no instance is valid against both schemas.
bool SchemaLowerer::disjoint(const json& a_in, const json& b_in, const std::string& ptr, int depth) {
  if (depth > 8) return false;
  json a, c;
  try {
    a = flatten(a_in, ptr, depth);
    c = flatten(b_in, ptr, depth);
  } catch (const GrammarError&) {
    return false;
  }
  if (a.is_boolean() || c.is_boolean()) return a == false || c == false;
  // Disjoint from a union when disjoint from each branch (oneOf instances satisfy a branch too).
  for (const auto& [x, y] : {std::pair{&a, &c}, std::pair{&c, &a}}) {
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (!x->contains(kw) || !(*x)[kw].is_array()) continue;
      json rest = *x;
      rest.erase(kw);
      for (const auto& br : (*x)[kw])
        if (!disjoint(json{{"allOf", json::array({rest, br})}}, *y, ptr, depth + 1)) return false;
      return true;
    }
  }
  for (const auto& [x, y] : {std::pair{&a, &c}, std::pair{&c, &a}}) {
    auto vals = value_list(*x);
    if (!vals) continue;
    try {
      for (const auto& v : *vals) {
        json rest = *x;
        rest.erase("enum");
        rest.erase("const");
        if (validates(rest, ptr, v) && validates(*y, ptr, v)) return false;
      }
      return true;
    } catch (const GrammarError&) {
      return false;
    }
  }
  std::set<std::string> ta = declared_types(a), tc = declared_types(c);
  for (const std::string t : {"null", "boolean", "object", "array", "string", "integer", "number"}) {
    if (!type_admits(ta, t) || !type_admits(tc, t)) continue;
    if (t == "integer" && ta.count("number") && tc.count("number")) continue;  // covered by "number"
    if (!disjoint_typed(a, c, t, ptr, depth)) return false;
  }
  return true;
}

// Value schema every member named `p` must satisfy (a superset when patterns may apply).
static json member_schema(const json& s, const std::string& p) {
  if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(p)) return s["properties"][p];
  if (s.contains("patternProperties")) return true;
  return s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
}

static bool forbids_member(const json& s, const std::string& p) {
  json m = member_schema(s, p);
  return m == false;
}

bool SchemaLowerer::disjoint_typed(const json& a, const json& c, const std::string& t, const std::string& ptr,
                                   int depth) {
  if (t == "object") {
    std::set<std::string> ra, rc;
    for (const auto& [s, r] : {std::pair{&a, &ra}, std::pair{&c, &rc}})
      if (s->contains("required") && (*s)["required"].is_array())
        for (const auto& x : (*s)["required"])
          if (x.is_string()) r->insert(x.get<std::string>());
    for (const auto& p : ra) {
      if (forbids_member(c, p)) return true;
      if (rc.count(p) && disjoint(member_schema(a, p), member_schema(c, p), ptr, depth + 1)) return true;
    }
    for (const auto& p : rc)
      if (forbids_member(a, p)) return true;
    return false;
  }
  if (t == "array" || t == "null" || t == "boolean") return false;
  // Strings and numbers: both languages are regular; the product accepting both must be empty.
  try {
    SchemaLowerer sub(root_, opt_);
  nest_into(sub);
    const json ty = json{{"type", t}};
    ExprId x = sub.lower(json{{"allOf", json::array({a, ty})}}, ptr, depth + 1);
    ExprId y = sub.lower(json{{"allOf", json::array({c, ty})}}, ptr, depth + 1);
    auto dx = expr_to_dfa(sub.b, x), dy = expr_to_dfa(sub.b, y);
    if (!dx || !dy) return false;
    return dfa_is_empty(dfa_product({&*dx, &*dy}, [](uint32_t m) { return m == 3; }));
  } catch (const GrammarError&) {
    return false;
  }
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {
namespace {

// Canonical spellings the complement is taken within: lowered languages are exact on compact
// serializations only (no exponents in bounded numbers, no needless escapes in pattern
// strings), so "not N" must not admit other spellings of N's instances.
ExprId canonical_universe(GrammarBuilder& b, const std::string& t) {
  if (t == "null") return b.literal("null");
  if (t == "boolean") return b.alt({b.literal("true"), b.literal("false")});
  if (t == "number") {
    ExprId d = b.byte_range('0', '9');
    return b.seq({b.opt(b.byte('-')), b.alt({b.byte('0'), b.seq({b.byte_range('1', '9'), b.star(d)})}),
                  b.opt(b.seq({b.byte('.'), b.plus(d)}))});
  }
  RegexOptions o;
  o.json_string = true;
  o.dot_all = true;
  return b.seq({b.byte('"'), regex_to_expr(b, ".*", o), b.byte('"')});
}

}  // namespace

namespace {

bool simple_object_schema(const json& n) {
  if (!n.is_object()) return false;
  static const std::set<std::string> kOk = {"type", "properties", "required", "additionalProperties",
                                            "patternProperties", "propertyNames"};
  for (auto it = n.begin(); it != n.end(); ++it)
    if (!kOk.count(it.key()) && !kAnnotationKeys.count(it.key()) && constraining_keyword(it.key())) return false;
  return true;
}

}  // namespace

// Objects failing `n` as a union of patches (nullopt: not expressible). n is a simple object
// schema (properties/required), or anyOf of such (failing all = a product of their patches).
std::optional<std::vector<Patch>> SchemaLowerer::object_failures(const json& n_in, const std::string& nptr, int depth) {
  json n;
  try {
    n = flatten(n_in, nptr, depth);
  } catch (const GrammarError&) {
    return std::nullopt;
  }
  if (n.is_boolean()) return n.get<bool>() ? std::vector<Patch>{} : std::vector<Patch>{Patch{}};
  if (n.is_object() && n.contains("anyOf") && n["anyOf"].is_array()) {
    json rest = n;
    rest.erase("anyOf");
    if (!simple_object_schema(rest) || rest.contains("properties") || rest.contains("required")) return std::nullopt;
    std::vector<Patch> acc{Patch{}};
    for (const auto& x : n["anyOf"]) {
      auto f = object_failures(x, nptr, depth + 1);
      if (!f) return std::nullopt;
      std::vector<Patch> next;
      for (const auto& a : acc)
        for (const auto& c : *f) {
          Patch p = a;
          p.insert(p.end(), c.begin(), c.end());
          next.push_back(std::move(p));
        }
      if (next.size() > 64) return std::nullopt;
      acc = std::move(next);
    }
    return acc;
  }
  if (!simple_object_schema(n)) return std::nullopt;
  if (!type_admits(declared_types(n), "object")) return std::vector<Patch>{Patch{}};  // fails every object
  std::vector<Patch> out;
  if (n.contains("required") && n["required"].is_array())
    for (const auto& r : n["required"])
      if (r.is_string()) out.push_back({MemberOp{true, r.get<std::string>(), json()}});
  if (n.contains("properties") && n["properties"].is_object())
    for (auto it = n["properties"].begin(); it != n["properties"].end(); ++it)
      if (it.value() != true && it.value() != json::object()) out.push_back({MemberOp{false, it.key(), it.value(), json()}});
  // Members failing patternProperties, additionalProperties or propertyNames: some key of a
  // key language with a value failing the schema (a witness member).
  json not_declared = json::array();  // key schemas excluding declared names and patterns
  if (n.contains("properties") && n["properties"].is_object()) {
    json names = json::array();
    for (auto it = n["properties"].begin(); it != n["properties"].end(); ++it) names.push_back(it.key());
    not_declared.push_back(json{{"not", json{{"enum", names}}}});
  }
  if (n.contains("patternProperties") && n["patternProperties"].is_object())
    for (auto it = n["patternProperties"].begin(); it != n["patternProperties"].end(); ++it) {
      not_declared.push_back(json{{"not", json{{"pattern", it.key()}}}});
      if (it.value() != true && it.value() != json::object())
        out.push_back({MemberOp{false, "", it.value(), json{{"pattern", it.key()}}}});
    }
  if (n.contains("additionalProperties") && n["additionalProperties"] != true && n["additionalProperties"] != json::object())
    out.push_back({MemberOp{false, "", n["additionalProperties"], json{{"allOf", not_declared}}}});
  if (n.contains("propertyNames") && n["propertyNames"] != true && n["propertyNames"] != json::object())
    out.push_back({MemberOp{false, "", json(false), json{{"not", n["propertyNames"]}}}});
  return out;
}

// Objects of `rt` that fail `n` (appends the alternatives). The failures are patches on rt.
void SchemaLowerer::object_difference(const json& rt, const json& n, const std::string& ptr, const std::string& nptr,
                                      int depth, std::vector<ExprId>& alts) {
  auto fails = object_failures(n, nptr, depth + 1);
  if (!fails)
    schema_error(nptr, "keyword 'not' that may match some object instances of the schema is supported only for "
                       "properties/required (and anyOf of them)");
  json base;
  try {
    base = flatten(rt, ptr, depth + 1);
  } catch (const GrammarError& e) {
    schema_error(nptr, std::string("keyword 'not': ") + e.what());
  }
  if (base.is_boolean()) base = base.get<bool>() ? json{{"type", "object"}} : json{{"enum", json::array()}};
  for (const Patch& patch : *fails) {
    json x = base;
    for (const MemberOp& op : patch) {
      if (op.absent) {  // the name is absent: nothing else about other keys changes
        x["properties"][op.name] = false;
        continue;
      }
      if (!op.key_schema.is_null()) {  // some member with such a key fails the value schema
        if (x.contains("x-di-witness"))
          schema_error(nptr, "keyword 'not' needing two witness members at once is not supported");
        x["x-di-witness"] = json{{"keys", op.key_schema}, {"value", json{{"not", op.value_schema}}}};
        continue;
      }
      if (x.contains("properties") && x["properties"].contains(op.name)) {
        x["properties"][op.name] = json{{"allOf", json::array({x["properties"][op.name], json{{"not", op.value_schema}}})}};
      } else {
        if (x.contains("patternProperties"))
          schema_error(nptr, "keyword 'not' on a property that patternProperties may also cover is not supported");
        json add = x.contains("additionalProperties") ? x["additionalProperties"] : json(true);
        x["properties"][op.name] = json{{"allOf", json::array({add, json{{"not", op.value_schema}}})}};
      }
      if (!x.contains("required")) x["required"] = json::array();
      x["required"].push_back(op.name);
    }
    alts.push_back(lower(x, ptr, depth + 1));
  }
}

// Arrays of `rt` failing `n`, where n only bounds the length and constrains every item: too
// short, too long, or some item failing the item schema (contains "not S").
void SchemaLowerer::array_difference(const json& rt, const json& n_in, const std::string& ptr, const std::string& nptr,
                                     int depth, std::vector<ExprId>& alts) {
  json n, base;
  try {
    n = flatten(n_in, nptr, depth + 1);
    base = flatten(rt, ptr, depth + 1);
  } catch (const GrammarError& e) {
    schema_error(nptr, std::string("keyword 'not': ") + e.what());
  }
  if (base.is_boolean()) base = base.get<bool>() ? json{{"type", "array"}} : json{{"enum", json::array()}};
  if (n.is_boolean()) {
    if (n == false) alts.push_back(lower(base, ptr, depth + 1));
    return;
  }
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string& k = it.key();
    if (k != "type" && k != "minItems" && k != "maxItems" && !(k == "items" && it.value().is_object()) &&
        !(k == "items" && it.value().is_boolean()) && !kAnnotationKeys.count(k) && constraining_keyword(k))
      schema_error(nptr, "keyword 'not' that may match some array instances is supported only for items/minItems/maxItems");
  }
  if (!type_admits(declared_types(n), "array")) {
    alts.push_back(lower(base, ptr, depth + 1));
    return;
  }
  auto num = [](const json& x, const char* k) { return static_cast<int64_t>(std::min(x[k].get<double>(), 1e9)); };
  if (n.contains("minItems") && n["minItems"].is_number() && num(n, "minItems") > 0) {
    json x = base;
    int64_t m = num(n, "minItems") - 1;
    x["maxItems"] = x.contains("maxItems") && x["maxItems"].is_number() ? std::min(num(x, "maxItems"), m) : m;
    alts.push_back(lower(x, ptr, depth + 1));
  }
  if (n.contains("maxItems") && n["maxItems"].is_number()) {
    json x = base;
    int64_t m = num(n, "maxItems") + 1;
    x["minItems"] = x.contains("minItems") && x["minItems"].is_number() ? std::max(num(x, "minItems"), m) : m;
    alts.push_back(lower(x, ptr, depth + 1));
  }
  if (n.contains("items") && n["items"] != true && n["items"] != json::object()) {
    if (base.contains("contains")) schema_error(nptr, "keyword 'not' of items next to contains is not supported");
    json x = base;
    x["contains"] = json{{"not", n["items"]}};
    x.erase("minContains");
    x.erase("maxContains");
    alts.push_back(lower(x, ptr, depth + 1));
  }
}

// `not`: per instance type t of the remaining schema R, R_t minus N_t. Exact when N admits
// none of R_t (disjoint) or all of type t, or when both are regular (strings, numbers:
// product automaton within the canonical spellings). Anything else is a compile error.
ExprId SchemaLowerer::lower_not(const json& s, const std::string& ptr, int depth) {
  json rest = s;
  rest.erase("not");
  const std::string nptr = ptr + "/not";
  json n = deref_top(s["not"], nptr, depth);
  if (n.is_boolean()) return n.get<bool>() ? b.nothing() : lower(rest, ptr, depth + 1);
  if (!n.is_object()) schema_error(nptr, "must be a schema");
  bool only_not = n.contains("not");
  for (auto it = n.begin(); it != n.end(); ++it)
    if (it.key() != "not" && !kAnnotationKeys.count(it.key()) && constraining_keyword(it.key())) only_not = false;
  if (only_not) return lower(json{{"allOf", json::array({rest, n["not"]})}}, ptr, depth + 1);  // not not X = X
  std::vector<ExprId> alts;
  std::set<std::string> have = declared_types(rest);
  for (const std::string& t : kTypes) {
    std::string tt = t;
    if (t == "number" && !have.count("number")) {
      if (!have.count("integer")) continue;
      tt = "integer";
    } else if (!have.count(t)) {
      continue;
    }
    json rt = json{{"allOf", json::array({rest, json{{"type", tt}}})}};
    json nt = json{{"allOf", json::array({n, json{{"type", tt}}})}};
    if (accepts_all_of_type(n, tt)) continue;
    if (disjoint(rt, nt, nptr, depth + 1)) {
      alts.push_back(lower(rt, ptr, depth + 1));
      continue;
    }
    if (t == "object") {
      object_difference(rt, n, ptr, nptr, depth, alts);
      continue;
    }
    if (t == "array") {
      array_difference(rt, n, ptr, nptr, depth, alts);
      continue;
    }
    if (t != "string" && t != "number" && t != "null" && t != "boolean")
      schema_error(nptr, "keyword 'not' that may match some " + t + " instances of the schema is not supported");
    try {
      ExprId r = lower(rt, ptr, depth + 1);
      SchemaLowerer sub(root_, opt_);
  nest_into(sub);
      auto dr = expr_to_dfa(b, r);
      auto dn = expr_to_dfa(sub.b, sub.lower(nt, nptr, depth + 1));
      auto du = expr_to_dfa(b, canonical_universe(b, t));
      if (!dr || !dn || !du) schema_error(nptr, "keyword 'not' over a non-regular " + t + " schema is not supported");
      alts.push_back(dfa_to_expr(b, dfa_product({&*dr, &*du, &*dn}, [](uint32_t m) { return m == 3; })));
    } catch (const GrammarError& e) {
      schema_error(nptr, std::string("keyword 'not': ") + e.what());
    }
  }
  return b.alt(std::move(alts));
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

// oneOf whose branches may overlap and are not all regular: branch i and not any other
// branch, for every i. These are pairwise disjoint, so their union is exact; each `not` must
// be expressible (lower_not), otherwise the error names the branch.
ExprId SchemaLowerer::exclusive_branches(const std::vector<json>& merged, const std::vector<json>& raw,
                                         const std::string& ptr, int depth) {
  if (merged.size() > 6) schema_error(ptr, "oneOf with more than 6 overlapping non-regular branches is not supported");
  std::vector<ExprId> alts;
  for (size_t i = 0; i < merged.size(); ++i) {
    json x = merged[i];
    for (size_t j = 0; j < merged.size(); ++j)
      if (j != i) x = json{{"allOf", json::array({x})}, {"not", raw[j]}};
    try {
      alts.push_back(lower(x, ptr, depth + 1));
    } catch (const GrammarError& e) {
      schema_error(ptr, std::string("oneOf with branches that may overlap: ") + e.what());
    }
  }
  return b.alt(std::move(alts));
}

// `dependencies` (draft 7) splits into dependentRequired (arrays) and dependentSchemas. A
// dependent schema {p: S} is the disjoint union of "p absent" and "p present and S".
ExprId SchemaLowerer::lower_dependent(const json& s, const std::string& ptr, int depth) {
  json rest = s;
  if (rest.contains("dependencies")) {
    const json& d = rest["dependencies"];
    if (!d.is_object()) schema_error(ptr + "/dependencies", "must be an object");
    json req = rest.contains("dependentRequired") ? rest["dependentRequired"] : json::object();
    json sch = rest.contains("dependentSchemas") ? rest["dependentSchemas"] : json::object();
    for (auto it = d.begin(); it != d.end(); ++it) (it.value().is_array() ? req : sch)[it.key()] = it.value();
    rest.erase("dependencies");
    if (!req.empty()) rest["dependentRequired"] = req;
    if (!sch.empty()) rest["dependentSchemas"] = sch;
  }
  if (!rest.contains("dependentSchemas")) return lower(rest, ptr, depth + 1);
  json deps = rest["dependentSchemas"];
  if (!deps.is_object()) schema_error(ptr + "/dependentSchemas", "must be an object");
  if (deps.size() > 6) schema_error(ptr + "/dependentSchemas", "more than 6 dependent schemas are not supported");
  if (deps.empty()) {
    rest.erase("dependentSchemas");
    return lower(rest, ptr, depth + 1);
  }
  const std::string key = deps.begin().key();
  const std::string kptr = ptr + "/dependentSchemas/" + ptr_escape(key);
  json first = deps.begin().value();
  deps.erase(key);
  if (deps.empty()) rest.erase("dependentSchemas");
  else rest["dependentSchemas"] = deps;
  // Objects only: other instance types ignore the keyword.
  json others = rest;
  std::set<std::string> have = declared_types(rest);
  json kept = json::array();
  for (const auto& t : have)
    if (t != "object") kept.push_back(t);
  std::vector<ExprId> alts;
  if (!kept.empty()) {
    others["type"] = kept;
    alts.push_back(lower(others, ptr, depth + 1));
  }
  if (!have.count("object")) return b.alt(std::move(alts));
  json absent = rest;
  absent["type"] = "object";
  absent["properties"][key] = false;  // the key is absent; nothing else about other keys changes
  alts.push_back(lower(absent, ptr, depth + 1));
  json present = rest;
  present["type"] = "object";
  if (!present.contains("required")) present["required"] = json::array();
  present["required"].push_back(key);
  try {
    json merged = present;
    merge_into(merged, flatten(first, kptr, depth + 1), kptr);
    alts.push_back(lower(merged, ptr, depth + 1));
  } catch (const GrammarError& e) {
    schema_error(kptr, std::string("dependent schema: ") + e.what());
  }
  return b.alt(std::move(alts));
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

// contains / minContains / maxContains: every item either matches `contains` (S and C) or not
// (S and not C); the grammar counts matches up to what the bounds can tell apart, together
// with the item position up to where the item schema and count bounds stop changing.
// Returns -1 when the keyword imposes nothing (minContains 0 without maxContains).
ExprId SchemaLowerer::lower_contains(const json& s, const ArrayShape& a, const std::string& ptr, int depth) {
  const std::string cptr = ptr + "/contains";
  auto count = [&](const char* k, int64_t dflt) -> int64_t {
    if (!s.contains(k)) return dflt;
    if (!s[k].is_number() || s[k].get<double>() < 0) schema_error(ptr + "/" + k, "must be a non-negative number");
    return static_cast<int64_t>(std::min(s[k].get<double>(), 1e9));
  };
  const int64_t min_c = count("minContains", 1), max_c = count("maxContains", -1);
  if (min_c == 0 && max_c < 0) return -1;
  if (max_c >= 0 && min_c > max_c) return b.nothing();
  const int64_t k = static_cast<int64_t>(a.prefix.size());
  // From position `steady` on, the item schema and the item-count bounds no longer change.
  const int64_t steady = std::max<int64_t>({k, a.min_items, a.max_items >= 0 ? a.max_items : 0, 1});
  const int64_t cap = max_c >= 0 ? max_c + 1 : min_c;  // match counts told apart
  if (steady > 256 || cap > 256 || (steady + 1) * (cap + 1) > 8192)
    schema_error(cptr, "contains with item or match counts above 256 is not supported");
  const json& c = s["contains"];
  // Checked here, not by the merge: `contains` is lowered inside a synthesised allOf, whose
  // merge would otherwise meet a number with nlohmann's untyped iterator error (fuzz finding 5).
  if (!c.is_object() && !c.is_boolean()) schema_error(cptr, "a schema must be an object or a boolean");
  auto split = [&](const json& item, const std::string& iptr) -> std::pair<ExprId, ExprId> {
    try {
      ExprId yes = lower(json{{"allOf", json::array({item, c})}}, iptr, depth + 1);
      ExprId no = lower(json{{"allOf", json::array({item})}, {"not", c}}, iptr, depth + 1);
      return {yes, no};
    } catch (const GrammarError& e) {
      schema_error(cptr, std::string("contains: ") + e.what());
    }
  };
  std::vector<std::pair<ExprId, ExprId>> at;  // [k + 1]: prefix positions, then the items schema
  for (int64_t i = 0; i < k; ++i) at.push_back(split(*a.prefix[i], a.prefix_ptrs[i]));
  at.push_back(split(*a.items, a.items_ptr));
  ExprId comma = punct(',');
  std::map<std::pair<int64_t, int64_t>, ExprId> memo;
  // after(i, m): what may follow once i items with m matches were written.
  std::function<ExprId(int64_t, int64_t)> after = [&](int64_t i, int64_t m) -> ExprId {
    if (max_c >= 0 && m > max_c) return b.nothing();
    auto key = std::make_pair(i, m);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    const bool done = i >= a.min_items && m >= min_c;
    const auto& [yes, no] = at[std::min(i, k)];
    ExprId sep = i > 0 ? comma : b.empty();
    const int64_t m1 = std::min(m + 1, cap);
    ExprId body;
    if (a.max_items >= 0 && i >= a.max_items) {
      body = done ? b.empty() : b.nothing();
    } else if (i >= steady) {  // a loop of non-matches, then the end or one more match
      ExprId next = m1 == m ? b.nothing() : b.seq({comma, yes, after(i, m1)});
      if (m1 == m) body = b.star(b.seq({comma, b.alt({yes, no})}));
      else body = b.seq({b.star(b.seq({comma, no})), b.alt({done ? b.empty() : b.nothing(), next})});
    } else {
      body = b.alt({done ? b.empty() : b.nothing(), b.seq({sep, yes, after(i + 1, m1)}), b.seq({sep, no, after(i + 1, m)})});
    }
    RuleId r = b.declare_rule("contains");
    b.set_inline(r, false);
    b.define_rule(r, body);
    return memo[key] = b.ref(r);
  };
  return b.seq({b.byte('['), ws(), after(0, 0), ws(), b.byte(']')});
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

// if/then/else: the disjoint union of (if and then) and (not if, and else).
ExprId SchemaLowerer::lower_if(const json& s, const std::string& ptr, int depth) {
  json rest = s;
  json cond = rest["if"];
  json then_s = rest.contains("then") ? rest["then"] : json(true);
  json else_s = rest.contains("else") ? rest["else"] : json(true);
  for (const char* k : {"if", "then", "else"}) rest.erase(k);
  if (then_s == true && else_s == true) return lower(rest, ptr, depth + 1);
  ExprId yes = lower(json{{"allOf", json::array({rest, cond, then_s})}}, ptr + "/then", depth + 1);
  ExprId no;
  try {
    no = lower(json{{"allOf", json::array({rest, else_s})}, {"not", cond}}, ptr + "/else", depth + 1);
  } catch (const GrammarError& e) {
    schema_error(ptr + "/if", std::string("if/else needs the complement of 'if': ") + e.what());
  }
  return b.alt({yes, no});
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

// unevaluatedProperties / unevaluatedItems where the evaluated set does not depend on which
// subschemas succeed: with allOf and $ref merged into one schema and no conditional
// applicator left (anyOf, oneOf, if, dependentSchemas, nested unevaluated*, contains), the
// unevaluated members are exactly the additional ones, so the keyword is additionalProperties
// (items after prefixItems). `not` yields no annotations and may stay. A schema holding the
// keyword is "closed" this way before it merges with anything (its own scope: cousins,
// $ref siblings and parents do not count as evaluating for it).
json SchemaLowerer::close_unevaluated(const json& s, const std::string& ptr, int depth) {
  if (!s.is_object() || (!s.contains("unevaluatedProperties") && !s.contains("unevaluatedItems"))) return s;
  json rest = s;
  std::optional<json> up, ui;
  if (rest.contains("unevaluatedProperties")) up = rest["unevaluatedProperties"], rest.erase("unevaluatedProperties");
  if (rest.contains("unevaluatedItems")) ui = rest["unevaluatedItems"], rest.erase("unevaluatedItems");
  const std::string kw = up ? "unevaluatedProperties" : "unevaluatedItems";
  // Closing merges parts, which may close their own parts (or, through $ref, this schema).
  struct Guard {
    int& n;
    ~Guard() { --n; }
  } guard{++closing_};
  if (closing_ > 32 || depth > 64) schema_error(ptr + "/" + kw, "nested too deeply (recursive $ref?)");
  json f;
  try {
    f = flatten(rest, ptr, depth + 1);
  } catch (const GrammarError& e) {
    schema_error(ptr + "/" + kw, std::string("keyword '" + kw + "': ") + e.what());
  }
  if (f.is_boolean()) return f;
  json closing = json::object();  // the unevaluated* keywords, to re-attach per case below
  if (up) closing["unevaluatedProperties"] = *up;
  if (ui) closing["unevaluatedItems"] = *ui;
  auto closed = [&](json parts) {
    json x = json{{"allOf", std::move(parts)}};
    x.update(closing);
    return close_unevaluated(x, ptr, depth + 1);
  };
  if (f.contains("oneOf") && f["oneOf"].is_array() && !f.contains("anyOf") && !f.contains("if")) {
    // Exactly one branch holds and evaluates: oneOf(b) and anyOf(rest and b_k, closed). A
    // failing b_k fails its closed form too, so the anyOf picks the one branch that holds.
    json base = f;
    base.erase("oneOf");
    json any = json::array();
    for (const auto& br : f["oneOf"]) any.push_back(closed(json::array({base, br})));
    base["oneOf"] = f["oneOf"];
    base["anyOf"] = any;
    return base;
  }
  if (f.contains("anyOf") && f["anyOf"].is_array() && f["anyOf"].size() <= 4 && !f.contains("oneOf") &&
      !f.contains("if")) {
    // Every branch that holds evaluates: split by the exact set T of branches that hold
    // (disjoint cases), each closed with the rest and T's branches.
    json base = f;
    base.erase("anyOf");
    const json& br = f["anyOf"];
    const uint32_t n = static_cast<uint32_t>(br.size());
    json cases = json::array();
    for (uint32_t t = 1; t < (1u << n); ++t) {
      json parts = json::array({base});
      for (uint32_t i = 0; i < n; ++i) parts.push_back(t >> i & 1 ? br[i] : json{{"not", br[i]}});
      cases.push_back(closed(std::move(parts)));
    }
    return json{{"anyOf", cases}};
  }
  if (f.contains("if") && !f.contains("anyOf") && !f.contains("oneOf")) {
    // The if-branch evaluates when it holds; a failing `if` yields no annotations.
    json base = f;
    json i = f["if"], t = f.contains("then") ? f["then"] : json(true), e = f.contains("else") ? f["else"] : json(true);
    for (const char* k : {"if", "then", "else"}) base.erase(k);
    json out = base;
    out["if"] = i;
    out["then"] = closed(json::array({base, i, t}));
    out["else"] = closed(json::array({base, e}));
    return out;
  }
  for (const char* k : {"anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "dependencies", "$dynamicRef",
                        "$recursiveRef", "unevaluatedProperties", "unevaluatedItems", "contains"})
    if (f.contains(k))
      schema_error(ptr + "/" + kw, "keyword '" + kw + "' next to '" + k +
                                       "' (annotations that depend on which subschemas match) is not supported");
  if (up && !f.contains("additionalProperties")) f["additionalProperties"] = *up;
  if (ui) {
    const bool tuple = f.contains("items") && f["items"].is_array();
    if (tuple && !f.contains("additionalItems")) f["additionalItems"] = *ui;
    else if (!tuple && !f.contains("items")) f["items"] = *ui;
  }
  return f;
}

ExprId SchemaLowerer::lower_unevaluated(const json& s, const std::string& ptr, int depth) {
  return lower(close_unevaluated(s, ptr, depth), ptr, depth + 1);
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

// An object that must have some member (k, v) with k in w.keys and v valid against w.value,
// besides its own constraints: the union of "declared member i is that witness" for each
// declared name in w.keys, and "one extra member with a key outside the names is".
ExprId SchemaLowerer::witness_members(const json& w, const ObjectParts& o, const CountBounds& count,
                                      const std::string& ptr, int depth) {
  if (o.has_patterns) schema_error(ptr, "keyword 'not' on members of an object with patternProperties is not supported");
  if (o.names.size() + 1 > static_cast<size_t>(kAnyOrderMaxProperties))
    schema_error(ptr, "keyword 'not' on members of an object with more than " + std::to_string(kAnyOrderMaxProperties - 1) +
                          " named properties is not supported");
  const json& keys = w["keys"];
  const json& value = w["value"];
  json key_schema = json{{"allOf", json::array({keys, json{{"type", "string"}}})}};
  std::vector<ExprId> alts;
  for (size_t i = 0; i < o.names.size(); ++i) {
    if (!validates(key_schema, ptr, json(o.names[i]))) continue;
    std::vector<ExprId> props = o.props;
    std::vector<bool> required = o.required;
    ExprId v = lower(json{{"allOf", json::array({*o.schemas[i], value})}}, ptr, depth + 1);
    props[i] = b.seq({string_literal(o.names[i]), punct(':'), v});
    required[i] = true;
    alts.push_back(members(props, required, o.additional, count));
  }
  // A key outside the names: the key language is a product over the quoted key.
  auto kd = expr_to_dfa(b, lower(key_schema, ptr, depth + 1));
  if (!kd) schema_error(ptr, "keyword 'not' on member names with a non-regular key schema is not supported");
  std::vector<ExprId> lits;
  for (const auto& n : o.names) lits.push_back(string_literal(n));
  auto named = expr_to_dfa(b, b.alt(std::move(lits)));
  std::vector<const Dfa*> ops{&*kd, &*named};
  if (o.names_dfa) ops.push_back(o.names_dfa);
  const bool pn = o.names_dfa != nullptr;
  Dfa wkeys = dfa_product(ops, [pn](uint32_t m) { return (m & 1) && !(m & 2) && (!pn || (m & 4)); });
  ExprId v = lower(json{{"allOf", json::array({*o.add_schema, value})}}, ptr, depth + 1);
  if (!dfa_is_empty(wkeys) && b.expr(v).kind != ExprKind::kNothing) {
    RuleId r = b.declare_rule("witness");
    b.set_inline(r, false);
    b.define_rule(r, b.seq({dfa_to_expr(b, wkeys), punct(':'), v}));
    std::vector<ExprId> props = o.props;
    std::vector<bool> required = o.required;
    props.push_back(b.ref(r));
    required.push_back(true);
    alts.push_back(members(props, required, o.additional, count));
  }
  return b.alt(std::move(alts));
}

}  // namespace deepinfer::structured
