// allOf (and $ref with sibling keywords) by merging the subschemas into one schema where the
// keywords combine exactly; anything else is a compile error.
#include <algorithm>
#include <set>

#include "core/check.h"
#include "structured/json_schema_impl.h"

namespace deepinfer::structured {
namespace {

const std::set<std::string> kMaxKeys = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"};
const std::set<std::string> kMinKeys = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"};
const std::set<std::string> kIgnored = {"$schema", "$id", "$anchor", "$comment", "$defs", "definitions", "title",
                                        "description", "default", "examples", "deprecated", "readOnly", "writeOnly"};

std::set<std::string> type_set(const json& t) {
  std::set<std::string> out;
  if (t.is_string()) out.insert(t.get<std::string>());
  else for (const auto& x : t) out.insert(x.get<std::string>());
  return out;
}

}  // namespace

// Replaces a top-level $ref by its target merged with the sibling keywords.
json SchemaLowerer::deref_top(const json& s, const std::string& ptr, int depth) {
  if (depth > 32) schema_error(ptr, "recursive $ref inside allOf is not supported");
  if (!s.is_object() || !s.contains("$ref") || !s["$ref"].is_string()) return s;
  std::string target;
  const json* t = resolve(s["$ref"].get<std::string>(), ptr + "/$ref", &target);
  json rest = s;
  rest.erase("$ref");
  json base = close_unevaluated(deref_top(*t, target, depth + 1), target, depth + 1);
  if (base.is_boolean()) {
    if (!base.get<bool>()) return false;
    return rest;
  }
  json out = base;
  merge_into(out, rest, ptr);
  return out;
}

void SchemaLowerer::merge_into(json& a, const json& b_raw, const std::string& ptr) {
  // A part with unevaluated* sees only its own annotations: close it before merging.
  const json b_closed = close_unevaluated(b_raw, ptr, 1);
  const json& b_in = b_closed;
  if (b_in.is_boolean()) {
    if (!b_in.get<bool>()) a = json{{"enum", json::array()}};
    return;
  }
  if (a.is_boolean()) {
    if (a.get<bool>()) a = b_in;
    return;
  }
  // Anything else than an object here is a malformed subschema (e.g. `allOf: [1]`): a named
  // error, never nlohmann's untyped one from iterating it as an object.
  if (!b_in.is_object() || !a.is_object()) schema_error(ptr, "a schema must be an object or a boolean");
  // if/then/else belong to one schema object: as the disjoint union (if and then) or (not if,
  // and else) they merge like any anyOf (then/else without if mean nothing).
  json cond_free;
  if (b_in.contains("if") || b_in.contains("then") || b_in.contains("else")) {
    cond_free = b_in;
    for (const char* k : {"if", "then", "else"}) cond_free.erase(k);
    if (b_in.contains("if") && (b_in.contains("then") || b_in.contains("else"))) {
      const json& i = b_in["if"];
      json t = b_in.contains("then") ? b_in["then"] : json(true), e = b_in.contains("else") ? b_in["else"] : json(true);
      json cond = {{"anyOf", json::array({json{{"allOf", json::array({i, t})}}, json{{"allOf", json::array({e})}, {"not", i}}})}};
      if (!cond_free.contains("allOf")) cond_free["allOf"] = json::array();
      cond_free["allOf"].push_back(cond);
    }
  }
  const json& b1 = cond_free.is_null() ? b_in : cond_free;
  auto has_obj_kw = [](const json& x) {
    return x.contains("additionalProperties") || x.contains("patternProperties");
  };
  json members_merged;  // b1 without properties/additionalProperties once those are merged below
  if ((has_obj_kw(a) && (b1.contains("properties") || has_obj_kw(b1))) ||
      (has_obj_kw(b1) && a.contains("properties"))) {
    if (a.contains("patternProperties") || b1.contains("patternProperties"))
      schema_error(ptr, "allOf combining patternProperties with other properties is not supported");
    // Without patterns, a key's value must satisfy each side's declared schema for it, or
    // that side's additionalProperties when it does not declare the key.
    auto add_of = [](const json& x) { return x.contains("additionalProperties") ? x["additionalProperties"] : json(true); };
    auto value_for = [&](const json& x, const std::string& k) -> json {
      if (x.contains("properties") && x["properties"].contains(k)) return x["properties"][k];
      return add_of(x);
    };
    auto both = [](const json& x, const json& y) -> json {
      if (x == y || y == true) return x;
      if (x == true) return y;
      return json{{"allOf", json::array({x, y})}};
    };
    json props = json::object();
    for (const json* side : {static_cast<const json*>(&a), &b1})
      if (side->contains("properties"))
        for (auto it = (*side)["properties"].begin(); it != (*side)["properties"].end(); ++it)
          if (!props.contains(it.key())) props[it.key()] = both(value_for(a, it.key()), value_for(b1, it.key()));
    json add = both(add_of(a), add_of(b1));
    a["properties"] = props;
    // Kept even when true: additionalProperties evaluates every key (unevaluatedProperties).
    if (add == true && !a.contains("additionalProperties") && !b1.contains("additionalProperties")) a.erase("additionalProperties");
    else a["additionalProperties"] = add;
    members_merged = b1;
    members_merged.erase("properties");
    members_merged.erase("additionalProperties");
  }
  const json& b_m = members_merged.is_null() ? b1 : members_merged;
  json items_merged;  // b_m without prefixItems/items once those are merged below
  if ((a.contains("items") && b_m.contains("prefixItems")) || (a.contains("prefixItems") && b_m.contains("items")) ||
      (a.contains("prefixItems") && b_m.contains("prefixItems"))) {
    for (const json* x : {static_cast<const json*>(&a), &b_m})
      if ((x->contains("items") && (*x)["items"].is_array()) || !x->value("prefixItems", json::array()).is_array())
        schema_error(ptr, "allOf combining prefixItems with array-form items is not supported");
    // Position i must satisfy each side's prefixItems[i], or that side's items past its prefix.
    auto at = [](const json& x, size_t i) -> json {
      if (x.contains("prefixItems") && i < x["prefixItems"].size()) return x["prefixItems"][i];
      return x.contains("items") ? x["items"] : json(true);
    };
    auto both = [](const json& x, const json& y) -> json {
      if (x == y || y == true) return x;
      if (x == true) return y;
      return json{{"allOf", json::array({x, y})}};
    };
    size_t n = std::max(a.value("prefixItems", json::array()).size(), b_m.value("prefixItems", json::array()).size());
    json pre = json::array();
    for (size_t i = 0; i < n; ++i) pre.push_back(both(at(a, i), at(b_m, i)));
    json rest_items = both(at(a, n), at(b_m, n));
    a["prefixItems"] = pre;
    if (rest_items == true && !a.contains("items") && !b_m.contains("items")) a.erase("items");
    else a["items"] = rest_items;  // kept even when true: items evaluates the rest (unevaluatedItems)
    items_merged = b_m;
    items_merged.erase("prefixItems");
    items_merged.erase("items");
  }
  const json& b2 = items_merged.is_null() ? b_m : items_merged;
  for (auto it = b2.begin(); it != b2.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (kIgnored.count(k)) continue;
    if (!a.contains(k)) {
      a[k] = v;
      continue;
    }
    json& av = a[k];
    if (av == v) continue;
    if (k == "type") {
      std::set<std::string> x = type_set(av), y = type_set(v), r;
      for (const auto& t : x) {
        if (y.count(t)) r.insert(t);
        else if (t == "integer" && y.count("number")) r.insert("integer");
        else if (t == "number" && y.count("integer")) r.insert("integer");
      }
      av = json::array();
      for (const auto& t : r) av.push_back(t);
      if (r.empty()) a["enum"] = json::array();
    } else if (k == "properties") {
      for (auto p = v.begin(); p != v.end(); ++p) {
        if (!av.contains(p.key())) av[p.key()] = p.value();
        else av[p.key()] = json{{"allOf", json::array({av[p.key()], p.value()})}};
      }
    } else if (k == "required") {
      for (const auto& r : v)
        if (std::find(av.begin(), av.end(), r) == av.end()) av.push_back(r);
    } else if (kMaxKeys.count(k) && av.is_number() && v.is_number()) {
      av = std::max(av.get<double>(), v.get<double>());
    } else if (kMinKeys.count(k) && av.is_number() && v.is_number()) {
      av = std::min(av.get<double>(), v.get<double>());
    } else if (k == "enum") {
      json r = json::array();
      for (const auto& x : av)
        if (std::find(v.begin(), v.end(), x) != v.end()) r.push_back(x);
      av = r;
    } else if (k == "const") {
      a["enum"] = json::array();  // two different consts
    } else if (k == "pattern" && av.is_string() && v.is_string()) {
      // Two patterns: both must match; the extra ones ride along in an internal keyword
      // that lower_string intersects with the rest.
      if (!a.contains("x-di-patterns")) a["x-di-patterns"] = json::array();
      a["x-di-patterns"].push_back(v);
    } else if (k == "x-di-patterns" && av.is_array() && v.is_array()) {
      for (const auto& x : v) av.push_back(x);
    } else if (k == "propertyNames") {  // every key valid against both = valid against allOf
      av = json{{"allOf", json::array({av, v})}};
    } else if (k == "items" || k == "additionalProperties") {
      av = json{{"allOf", json::array({av, v})}};
    } else if (k == "anyOf") {
      // (a1 | a2) & (b1 | b2): distribute into the product when small.
      if (av.size() * v.size() > 64) schema_error(ptr, "allOf of two large anyOf lists is not supported");
      json r = json::array();
      for (const auto& x : av)
        for (const auto& y : v) r.push_back(json{{"allOf", json::array({x, y})}});
      av = r;
    } else if (k == "allOf") {
      for (const auto& x : v) av.push_back(x);
    } else if (k == "not") {  // not X and not Y = not (X or Y)
      av = json{{"anyOf", json::array({av, v})}};
    } else {
      schema_error(ptr, "allOf with two different values of '" + k + "' is not supported");
    }
  }
}

json SchemaLowerer::merge_allof(const json& s, const std::string& ptr, int depth) {
  json rest = s;
  std::vector<std::pair<json, std::string>> parts;
  if (rest.contains("allOf")) {
    if (!rest["allOf"].is_array()) schema_error(ptr + "/allOf", "must be an array");
    for (size_t i = 0; i < rest["allOf"].size(); ++i)
      parts.push_back({rest["allOf"][i], ptr + "/allOf/" + std::to_string(i)});
    rest.erase("allOf");
  }
  json out = deref_top(rest, ptr, depth);
  for (auto& [p, pp] : parts) {
    json d = deref_top(p, pp, depth);
    if (d.is_object() && d.contains("allOf")) d = merge_allof(d, pp, depth + 1);
    merge_into(out, d, pp);
  }
  // Nested allOf introduced by merging property schemas is handled when they are lowered.
  if (out.is_object() && out.contains("allOf")) return merge_allof(out, ptr, depth + 1);
  return out;
}

Grammar json_schema_to_grammar(const json& schema, const JsonGrammarOptions& opt) {
  SchemaLowerer l(schema, opt);
  ExprId body = l.lower(schema, "");
  RuleId root = l.b.declare_rule("root");
  l.b.define_rule(root, l.b.seq({l.ws(), body, l.ws()}));
  return std::move(l.b).finish(root);
}

Grammar json_object_grammar(const JsonGrammarOptions& opt) {
  json dummy = json::object();
  SchemaLowerer l(dummy, opt);
  ExprId body = l.any_object();
  RuleId root = l.b.declare_rule("root");
  l.b.define_rule(root, l.b.seq({l.ws(), body, l.ws()}));
  return std::move(l.b).finish(root);
}

}  // namespace deepinfer::structured
