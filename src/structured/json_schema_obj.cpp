// Objects, arrays and $ref for the JSON Schema lowering.
#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>

#include "core/check.h"
#include "structured/json_schema_impl.h"
#include "structured/regex.h"
#include "structured/regular.h"

namespace deepinfer::structured {
namespace {

// Splits the escaped content of a JSON string into characters (a UTF-8 char or an escape).
std::vector<std::string> json_units(const std::string& escaped) {
  std::vector<std::string> out;
  for (size_t i = 0; i < escaped.size();) {
    size_t n = 1;
    unsigned char c = static_cast<unsigned char>(escaped[i]);
    if (c == '\\') n = escaped[i + 1] == 'u' ? 6 : 2;
    else if (c >= 0xF0) n = 4;
    else if (c >= 0xE0) n = 3;
    else if (c >= 0xC0) n = 2;
    out.push_back(escaped.substr(i, n));
    i += n;
  }
  return out;
}

std::string json_quoted_key(const std::string& name) { return json(name).dump(); }

// Roughly the automaton states inlining `id` makes (byte sets, repeats unrolled, inlined rules
// followed; a rule kept apart counts 1), saturating at `cap`.
int64_t inline_weight(const GrammarBuilder& b, ExprId id, int64_t cap, int depth = 0) {
  if (depth > 64) return cap;
  const Expr& e = b.expr(id);
  switch (e.kind) {
    case ExprKind::kNothing:
    case ExprKind::kEmpty: return 0;
    case ExprKind::kBytes: return 1;
    case ExprKind::kSeq:
    case ExprKind::kAlt: {
      int64_t w = 0;
      for (ExprId c : e.children)
        if ((w += inline_weight(b, c, cap, depth + 1)) >= cap) return cap;
      return w;
    }
    case ExprKind::kRepeat: {
      const int64_t times = e.max == kUnbounded ? std::max<int64_t>(e.min, 1) : e.max;
      const int64_t w = inline_weight(b, e.children[0], cap, depth + 1);
      return w > 0 && times > cap / w ? cap : std::min(cap, w * times);
    }
    case ExprKind::kRef: {
      const Rule& r = b.rule(e.rule);
      return !r.inline_ok || r.body < 0 ? 1 : inline_weight(b, r.body, cap, depth + 1);
    }
    case ExprKind::kAutomaton: return std::min<int64_t>(cap, b.automaton_at(e.automaton).num_states);
  }
  return 1;
}

// A member heavier than this makes even a small object (<= 3 properties, any order) keep its
// members and rests apart as rules: inlined, each member is copied into every order's context
// (a 254-character maxLength string 4 times in a 3-property object: 20 ms compiles).
constexpr int64_t kMaxInlineMemberWeight = 1024;

}  // namespace

// A JSON string whose content is none of `keys` (keys given unescaped): any quoted string
// minus the quoted keys, as one product DFA. Bytes differ exactly when the unit sequences
// (characters and escapes) differ, so this is "a key spelled otherwise than every declared
// one" (`\u0061` for "a" included). The product matters beyond its language: every prefix
// of a declared key that diverges lands in the same (string body, no key) state, where a trie
// of alternatives gave each prefix its own copy of the string body (one DFA state per key
// prefix and body state, each compiled and each a first visit for the mask walk).
ExprId SchemaLowerer::key_not_in(const std::vector<std::string>& keys) {
  // Byte trie of the quoted keys: kids[n] sorted (byte, child); done[n]: n ends a key.
  std::vector<std::vector<std::pair<uint8_t, int32_t>>> kids(1);
  std::vector<uint8_t> done(1, 0);
  for (const auto& k : keys) {
    const std::string esc = json(k).dump();
    for (const auto& u : json_units(esc.substr(1, esc.size() - 2)))
      if (u.size() == 6 && u[0] == '\\')
        DI_THROW(GrammarError, "json_schema: property name ", esc, " needs a \\u escape; not supported next to additional properties");
    int32_t n = 0;
    for (char ch : esc) {
      const uint8_t c = static_cast<uint8_t>(ch);
      const int32_t fresh = static_cast<int32_t>(kids.size());
      auto& ks = kids[n];
      auto it = std::lower_bound(ks.begin(), ks.end(), std::pair<uint8_t, int32_t>{c, -1});
      n = it != ks.end() && it->first == c ? it->second : ks.insert(it, {c, fresh})->second;
      if (n == fresh) {  // after the last use of ks (emplace_back may move it)
        kids.emplace_back();
        done.push_back(0);
      }
    }
    done[n] = 1;
  }
  // Any quoted string: one DFA for every lowering (the language is fixed).
  static const Dfa any = [] {
    GrammarBuilder g;
    return *expr_to_dfa(g, g.seq({g.byte('"'), g.star(json_string_char(g)), g.byte('"')}));
  }();
  // Product (any-string state, trie node or -1), built directly: classes are any's refined by
  // every key byte, a pair steps both parts, and a pair that completes a key is rejected.
  bool cut[257] = {};
  cut[0] = cut[256] = true;
  for (int c = 1; c < 256; ++c) cut[c] = any.byte_class[c] != any.byte_class[c - 1];
  for (const auto& ks : kids)
    for (auto [c, child] : ks) cut[c] = cut[c + 1] = true;
  std::vector<uint8_t> rep, hi;  // [class] its first and last byte
  for (int c = 0; c < 256; ++c) {
    if (cut[c]) rep.push_back(static_cast<uint8_t>(c)), hi.push_back(static_cast<uint8_t>(c));
    hi.back() = static_cast<uint8_t>(c);
  }
  const int32_t nc = static_cast<int32_t>(rep.size());
  // A pair is live (reaches acceptance) when it accepts or its string state has a way on: from
  // inside a string infinitely many endings remain and the keys exclude finitely many.
  static const std::vector<uint8_t> any_out = [] {
    std::vector<uint8_t> out(any.num_states(), 0);
    for (int32_t a = 0; a < any.num_states(); ++a)
      for (int32_t c = 0; c < any.num_classes && !out[a]; ++c) out[a] = any.trans[static_cast<size_t>(a) * any.num_classes + c] >= 0;
    return out;
  }();
  // About one state per key byte: bounded like a grammar's automaton, not a regex's.
  constexpr size_t kMaxKeyStates = 200'000;
  // A pair (a, t >= 0) is determined by t (a is `any` after t's bytes) and (a, -1) by a, so
  // the pairs are indexed by trie node and by string state, no hash map.
  std::vector<int32_t> id_of_node(kids.size(), -1), id_of_any(any.num_states(), -1);
  std::vector<std::pair<int32_t, int32_t>> pairs;
  ByteAutomaton out;
  auto intern = [&](int32_t a, int32_t t) {
    int32_t& id = t >= 0 ? id_of_node[t] : id_of_any[a];
    if (id < 0) {
      if (pairs.size() >= kMaxKeyStates)
        DI_THROW(GrammarError, "json_schema: property names need more than ", kMaxKeyStates, " automaton states");
      id = static_cast<int32_t>(pairs.size());
      pairs.push_back({a, t});
      out.final.push_back(any.final[a] && (t < 0 || !done[t]));
    }
    return id;
  };
  out.start = intern(any.start, 0);
  for (size_t cur = 0; cur < pairs.size(); ++cur) {
    const auto [a, t] = pairs[cur];
    int32_t run_to = -1;  // target of the open edge (classes merge while their target repeats)
    // t's children in byte order, met in class order (every child byte starts a class).
    const std::pair<uint8_t, int32_t>* kid = t >= 0 ? kids[t].data() : nullptr;
    const std::pair<uint8_t, int32_t>* kid_end = t >= 0 ? kid + kids[t].size() : nullptr;
    for (int32_t c = 0; c < nc; ++c) {
      int32_t to = -1;
      while (kid != kid_end && kid->first < rep[c]) ++kid;
      if (const int32_t na = any.next(a, rep[c]); na >= 0) {
        const int32_t nt = kid != kid_end && kid->first == rep[c] ? kid->second : -1;
        const bool fin = any.final[na] && (nt < 0 || !done[nt]);
        if (any_out[na] || fin) to = intern(na, nt);
      }
      if (to >= 0 && to == run_to && out.edges.back().hi + 1 == rep[c]) {
        out.edges.back().hi = hi[c];
      } else if (to >= 0) {
        out.edges.push_back({static_cast<int32_t>(cur), rep[c], hi[c], to});
      }
      run_to = to;
    }
  }
  out.num_states = static_cast<int32_t>(pairs.size());
  return b.automaton(std::move(out));
}

// Comma-separated members: declared properties (props[i], required[i]) and any number of
// `additional` members. Small sets in any order, larger ones in schema order.
ExprId SchemaLowerer::members(const std::vector<ExprId>& props, const std::vector<bool>& required, ExprId additional,
                              const CountBounds& count) {
  const size_t n = props.size();
  ExprId comma = punct(',');
  ExprId more_additional = b.star(b.seq({comma, additional}));
  if (count.min > 0 || count.max >= 0) return counted_members(props, required, additional, count);
  if (n <= static_cast<size_t>(kAnyOrderMaxProperties)) {
    // Any order: rest(used) = what may follow once the properties in `used` were written.
    // Up to 3 properties everything is inlined (n! paths) unless a member is heavy; beyond,
    // each subset and each member is its own rule so the size stays O(2^n * n) instead of
    // O(n! * value size).
    bool as_rules = n > 3;
    for (size_t i = 0; i < n && !as_rules; ++i)
      as_rules = inline_weight(b, props[i], kMaxInlineMemberWeight + 1) > kMaxInlineMemberWeight;
    std::vector<ExprId> member(props);
    if (as_rules) {
      for (size_t i = 0; i < n; ++i) {
        RuleId r = b.declare_rule("member");
        b.set_inline(r, false);
        b.define_rule(r, props[i]);
        member[i] = b.ref(r);
      }
    }
    std::map<uint32_t, ExprId> memo;
    std::function<ExprId(uint32_t)> rest = [&](uint32_t used) -> ExprId {
      auto it = memo.find(used);
      if (it != memo.end()) return it->second;
      std::vector<ExprId> alts;
      bool done = true;
      for (size_t i = 0; i < n; ++i) {
        if (used >> i & 1) continue;
        if (required[i]) done = false;
        alts.push_back(b.seq({comma, member[i], rest(used | (1u << i))}));
      }
      if (done && count.deps_ok(used)) alts.push_back(b.empty());
      ExprId body = b.seq({more_additional, b.alt(std::move(alts))});
      if (as_rules) {
        RuleId r = b.declare_rule("rest");
        b.set_inline(r, false);
        b.define_rule(r, body);
        body = b.ref(r);
      }
      return memo[used] = body;
    };
    std::vector<ExprId> first{b.seq({additional, rest(0)})};
    bool none_required = std::none_of(required.begin(), required.end(), [](bool r) { return r; });
    for (size_t i = 0; i < n; ++i) first.push_back(b.seq({member[i], rest(1u << i)}));
    if (none_required) first.push_back(b.empty());
    return b.alt(std::move(first));
  }
  if (!count.deps.empty())
    schema_error(count.ptr, "dependentRequired with more than " + std::to_string(kAnyOrderMaxProperties) +
                                " named properties is not supported");
  // Schema order. rest(i): members after at least one was written, from slot i on. Each is a
  // rule (kept apart, not inlined) so the start alternatives can share them without copies.
  std::vector<ExprId> rest(n + 1);
  rest[n] = more_additional;
  for (size_t i = n; i-- > 0;) {
    ExprId slot = required[i] ? b.seq({comma, props[i], rest[i + 1]}) : b.seq({b.opt(b.seq({comma, props[i]})), rest[i + 1]});
    RuleId r = b.declare_rule("members");
    b.set_inline(r, false);
    b.define_rule(r, b.seq({more_additional, slot}));
    rest[i] = b.ref(r);
  }
  ExprId start = b.opt(b.seq({additional, rest[n]}));
  for (size_t i = n; i-- > 0;) {
    std::vector<ExprId> alts{b.seq({additional, rest[i]}), b.seq({props[i], rest[i + 1]})};
    if (!required[i]) alts.push_back(start);
    start = b.alt(std::move(alts));
  }
  return start;
}

// An object whose declared keys come in any order, however many: the matcher keeps the set of
// keys written so far (grammar.h, GrammarMark) instead of the grammar enumerating orders. Each
// byte of a declared key's literal is marked (alive while that key is unwritten; the closing
// quote writes it), the separator needs some declared key still unwritten when no other key may
// follow, and the closing brace needs every required key written. Its own rule, never inlined:
// the set lives in that rule's stack frame.
ExprId SchemaLowerer::tracked_object(const std::vector<std::string>& names, const std::vector<ExprId>& values,
                                     const std::vector<bool>& required, ExprId additional) {
  const int32_t obj = b.new_tracked_object();
  std::vector<ExprId> members;
  std::vector<int32_t> avail, req;
  for (size_t i = 0; i < names.size(); ++i) {
    if (b.expr(values[i]).kind == ExprKind::kNothing) continue;  // the key may not appear
    const int32_t k = static_cast<int32_t>(i);
    avail.push_back(k);
    if (required[i]) req.push_back(k);
    const std::string q = json_quoted_key(names[i]);
    std::vector<ExprId> parts;
    for (size_t j = 0; j + 1 < q.size(); ++j)
      parts.push_back(b.marked_byte(static_cast<uint8_t>(q[j]), {MarkKind::kKeyPrefix, obj, k, {}}));
    parts.push_back(b.marked_byte(static_cast<uint8_t>(q.back()), {MarkKind::kKeyAdd, obj, k, {}}));
    parts.push_back(punct(':'));
    parts.push_back(values[i]);
    members.push_back(b.seq(std::move(parts)));
  }
  const bool others = b.expr(additional).kind != ExprKind::kNothing;
  if (others) members.push_back(additional);
  ExprId member = b.alt(std::move(members));
  ExprId sep = others ? punct(',') : b.seq({ws(), b.marked_byte(',', {MarkKind::kMore, obj, -1, avail}), ws()});
  ExprId close = b.marked_byte('}', {MarkKind::kClose, obj, -1, req});
  ExprId body = b.seq({b.byte('{'), ws(), b.opt(b.seq({member, b.star(b.seq({sep, member}))})), ws(), close});
  RuleId r = b.declare_rule("object");
  b.set_inline(r, false);
  b.define_rule(r, body);
  return b.ref(r);
}

std::optional<std::vector<json>> unique_scalar_values(const json& s) {
  if (!s.is_object() || s.value("uniqueItems", false) != true) return std::nullopt;
  for (const char* k : {"prefixItems", "contains", "additionalItems", "unevaluatedItems"})
    if (s.contains(k)) return std::nullopt;
  if (!s.contains("items") || !s["items"].is_object()) return std::nullopt;
  const json& it = s["items"];
  std::vector<json> vals;
  for (auto e = it.begin(); e != it.end(); ++e) {
    const std::string& k = e.key();
    if (k != "enum" && k != "const" && k != "type" && constraining_keyword(k)) return std::nullopt;
  }
  if (it.contains("enum") && it["enum"].is_array()) {
    for (const auto& v : it["enum"]) vals.push_back(v);
  } else if (it.contains("const")) {
    vals.push_back(it["const"]);
  } else if (it.value("type", json()) == "boolean") {
    vals = {json(false), json(true)};
  } else if (it.value("type", json()) == "null") {
    vals = {json(nullptr)};
  } else {
    return std::nullopt;
  }
  if (it.contains("const") && it.contains("enum")) return std::nullopt;
  std::vector<json> out;
  for (const auto& v : vals) {
    if (!v.is_string() && !v.is_boolean() && !v.is_null()) return std::nullopt;  // numbers: many spellings
    if (it.contains("type")) {
      const json& t = it["type"];
      const char* want = v.is_string() ? "string" : v.is_boolean() ? "boolean" : "null";
      if (!(t == want || (t.is_array() && std::find(t.begin(), t.end(), want) != t.end()))) continue;
    }
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  const double min_items = s.contains("minItems") && s["minItems"].is_number() ? s["minItems"].get<double>() : 0;
  const double max_items = s.contains("maxItems") && s["maxItems"].is_number() ? s["maxItems"].get<double>() : 1e18;
  if (min_items > 1 || max_items < static_cast<double>(out.size())) return std::nullopt;
  return out;
}

// An array of distinct values from a small set of scalars (uniqueItems): each value's bytes
// are marked like a tracked object's keys (a value is "written" at its last byte), so every
// order is accepted and no value twice, without enumerating subsets.
ExprId SchemaLowerer::unique_array(const std::vector<json>& values, bool non_empty) {
  const int32_t obj = b.new_tracked_object();
  std::vector<ExprId> alts;
  std::vector<int32_t> all;
  for (size_t i = 0; i < values.size(); ++i) {
    const int32_t k = static_cast<int32_t>(i);
    all.push_back(k);
    const std::string t = values[i].dump();
    std::vector<ExprId> parts;
    for (size_t j = 0; j + 1 < t.size(); ++j)
      parts.push_back(b.marked_byte(static_cast<uint8_t>(t[j]), {MarkKind::kKeyPrefix, obj, k, {}}));
    parts.push_back(b.marked_byte(static_cast<uint8_t>(t.back()), {MarkKind::kKeyAdd, obj, k, {}}));
    alts.push_back(b.seq(std::move(parts)));
  }
  ExprId item = b.alt(std::move(alts));
  ExprId sep = b.seq({ws(), b.marked_byte(',', {MarkKind::kMore, obj, -1, all}), ws()});
  ExprId items = b.seq({item, b.star(b.seq({sep, item}))});
  ExprId body = b.seq({b.byte('['), ws(), non_empty ? items : b.opt(items), ws(), b.byte(']')});
  RuleId r = b.declare_rule("unique_array");
  b.set_inline(r, false);
  b.define_rule(r, body);
  return b.ref(r);
}

// Any order with a member count: rest(used, c) after c members of which `used` are declared.
// Without an upper bound the count saturates at the lower bound.
ExprId SchemaLowerer::counted_members(const std::vector<ExprId>& props, const std::vector<bool>& required,
                                      ExprId additional, const CountBounds& count) {
  const size_t n = props.size();
  if (n > static_cast<size_t>(kAnyOrderMaxProperties))
    schema_error(count.ptr, "minProperties/maxProperties with more than " + std::to_string(kAnyOrderMaxProperties) +
                                " declared properties is not supported");
  const int64_t cap = count.max >= 0 ? count.max : count.min;
  if ((int64_t{1} << n) * (cap + 1) > 4096) schema_error(count.ptr, "minProperties/maxProperties bound too large");
  ExprId comma = punct(',');
  ExprId more_additional = b.star(b.seq({comma, additional}));
  std::vector<ExprId> member(props);
  for (size_t i = 0; i < n; ++i) {
    RuleId r = b.declare_rule("member");
    b.set_inline(r, false);
    b.define_rule(r, props[i]);
    member[i] = b.ref(r);
  }
  std::map<int64_t, ExprId> memo;
  std::function<ExprId(uint32_t, int64_t)> rest = [&](uint32_t used, int64_t c) -> ExprId {
    const bool saturated = count.max < 0 && c >= count.min;
    if (saturated) c = count.min;
    auto it = memo.find(static_cast<int64_t>(used) * (cap + 1) + c);
    if (it != memo.end()) return it->second;
    bool done = c >= count.min;
    std::vector<ExprId> alts;
    for (size_t i = 0; i < n; ++i) {
      if (used >> i & 1) continue;
      if (required[i]) done = false;
      if (count.max < 0 || c < count.max) alts.push_back(b.seq({comma, member[i], rest(used | (1u << i), c + 1)}));
    }
    if (!saturated && (count.max < 0 || c < count.max)) alts.push_back(b.seq({comma, additional, rest(used, c + 1)}));
    if (done && count.deps_ok(used)) alts.push_back(b.empty());
    ExprId body = saturated ? b.seq({more_additional, b.alt(std::move(alts))}) : b.alt(std::move(alts));
    RuleId r = b.declare_rule("rest");
    b.set_inline(r, false);
    b.define_rule(r, body);
    return memo[static_cast<int64_t>(used) * (cap + 1) + c] = b.ref(r);
  };
  std::vector<ExprId> first;
  if (count.max != 0) {
    first.push_back(b.seq({additional, rest(0, 1)}));
    for (size_t i = 0; i < n; ++i) first.push_back(b.seq({member[i], rest(1u << i, 1)}));
  }
  bool none_required = std::none_of(required.begin(), required.end(), [](bool r) { return r; });
  if (none_required && count.min == 0) first.push_back(b.empty());
  return b.alt(std::move(first));
}

// JSON-escaped content of a property name (what the grammar sees between the quotes).
static std::string json_quoted(const std::string& name) { return json(name).dump(); }

ExprId SchemaLowerer::lower_object(const json& s, const std::string& ptr, int depth) {
  std::vector<std::string> names;
  std::vector<const json*> schemas;
  std::vector<std::string> ptrs;
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) schema_error(ptr + "/properties", "must be an object");
    for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
      names.push_back(it.key());
      schemas.push_back(&it.value());
      ptrs.push_back(ptr + "/properties/" + ptr_escape(it.key()));
    }
  }
  static const json kTrue = true;
  const json* add_schema = s.contains("additionalProperties") ? &s["additionalProperties"] : &kTrue;
  // patternProperties: (pattern, schema, pointer), each pattern as a DFA over the quoted key.
  std::vector<PatternProp> pats;
  if (s.contains("patternProperties")) {
    const json& pp = s["patternProperties"];
    if (!pp.is_object()) schema_error(ptr + "/patternProperties", "must be an object");
    if (pp.size() > 4) schema_error(ptr + "/patternProperties", "more than 4 patterns are not supported");
    for (auto it = pp.begin(); it != pp.end(); ++it) {
      std::string pptr = ptr + "/patternProperties/" + ptr_escape(it.key());
      RegexOptions o;
      o.json_string = true;
      o.search = true;
      try {
        ExprId e = b.seq({b.byte('"'), regex_to_expr(b, it.key(), o), b.byte('"')});
        pats.push_back({pptr, &it.value(), *expr_to_dfa(b, e)});
      } catch (const GrammarError& e) {
        schema_error(pptr, e.what());
      }
    }
  }
  // propertyNames: every key is a string valid against it (regular languages only).
  std::optional<Dfa> names_dfa;
  if (s.contains("propertyNames")) {
    const std::string nptr = ptr + "/propertyNames";
    json ns = json{{"allOf", json::array({s["propertyNames"], json{{"type", "string"}}})}};
    auto d = expr_to_dfa(b, lower(ns, nptr, depth + 1));
    if (!d) schema_error(nptr, "keyword 'propertyNames' with a non-regular schema is not supported");
    names_dfa = std::move(*d);
  }
  std::set<std::string> req;
  std::vector<std::string> req_order;  // document order of `required`
  if (s.contains("required")) {
    if (!s["required"].is_array()) schema_error(ptr + "/required", "must be an array");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) schema_error(ptr + "/required", "entries must be strings");
      if (req.insert(r.get<std::string>()).second) req_order.push_back(r.get<std::string>());
    }
  }
  // dependentRequired: trigger -> names; all of them are tracked like declared properties.
  std::vector<std::pair<std::string, std::vector<std::string>>> dep_req;
  if (s.contains("dependentRequired")) {
    const json& d = s["dependentRequired"];
    if (!d.is_object()) schema_error(ptr + "/dependentRequired", "must be an object");
    for (auto it = d.begin(); it != d.end(); ++it) {
      if (!it.value().is_array()) schema_error(ptr + "/dependentRequired/" + ptr_escape(it.key()), "must be an array");
      std::vector<std::string> need;
      for (const auto& x : it.value()) {
        if (!x.is_string()) schema_error(ptr + "/dependentRequired/" + ptr_escape(it.key()), "entries must be strings");
        need.push_back(x.get<std::string>());
      }
      if (!need.empty()) dep_req.push_back({it.key(), need});
    }
  }
  const size_t num_declared = names.size();
  if (!dep_req.empty()) {
    std::set<std::string> all(names.begin(), names.end());
    all.insert(req_order.begin(), req_order.end());
    for (const auto& [t, need] : dep_req) {
      all.insert(t);
      all.insert(need.begin(), need.end());
    }
    if (all.size() > static_cast<size_t>(kAnyOrderMaxProperties)) {
      // Too many names to track as a set: split on each trigger instead (present: its names
      // are required; absent: the key is not there), as a dependent schema.
      json x = s;
      x.erase("dependentRequired");
      x["type"] = "object";
      for (const auto& [t, need] : dep_req) {
        json req = json{{"required", need}};
        json& ds = x["dependentSchemas"];
        ds[t] = ds.contains(t) ? json{{"allOf", json::array({ds[t], req})}} : req;
      }
      return lower(x, ptr, depth + 1);
    }
  }
  std::vector<std::string> extra_names = req_order;  // named but not declared: additional properties
  for (const auto& [t, need] : dep_req) {
    extra_names.push_back(t);
    extra_names.insert(extra_names.end(), need.begin(), need.end());
  }
  for (const auto& r : extra_names) {
    if (std::find(names.begin(), names.end(), r) != names.end()) continue;
    names.push_back(r);
    schemas.push_back(add_schema);
    ptrs.push_back(ptr + "/additionalProperties");
  }
  // A named key also matching patterns must satisfy those schemas too (and an undeclared
  // one then is not "additional").
  std::vector<json> merged(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    json all = json::array();
    if (i < num_declared) all.push_back(*schemas[i]);
    for (const auto& p : pats)
      if (p.dfa.matches(json_quoted(names[i]))) all.push_back(*p.schema);
    if (all.empty()) all.push_back(*add_schema);
    if (names_dfa && !names_dfa->matches(json_quoted(names[i]))) all = json::array({false});
    if (all.size() > 1) merged[i] = json{{"allOf", all}}, schemas[i] = &merged[i];
    else if (i >= num_declared || all[0] != *schemas[i]) merged[i] = all[0], schemas[i] = &merged[i];
  }
  std::vector<ExprId> props, values;
  std::vector<bool> required;
  for (size_t i = 0; i < names.size(); ++i) {
    ExprId v = lower(*schemas[i], ptrs[i], depth + 1);
    required.push_back(req.count(names[i]) > 0);
    if (b.expr(v).kind == ExprKind::kNothing) {
      if (required.back()) return b.nothing();
      v = b.nothing();
    }
    values.push_back(v);
    props.push_back(b.seq({string_literal(names[i]), punct(':'), v}));
  }
  ExprId add_value = lower(*add_schema, ptr + "/additionalProperties", depth + 1);
  ExprId add_member = b.nothing();
  if (pats.empty() && !names_dfa) {
    if (b.expr(add_value).kind != ExprKind::kNothing) add_member = b.seq({key_not_in(names), punct(':'), add_value});
  } else {
    add_member = pattern_members(names, pats, names_dfa ? &*names_dfa : nullptr, add_value, ptr, depth);
  }
  ExprId additional = b.nothing();
  if (b.expr(add_member).kind != ExprKind::kNothing) {
    // Referenced from every slot between members: one shared rule instead of many copies.
    RuleId r = b.declare_rule("additional");
    b.set_inline(r, false);
    b.define_rule(r, add_member);
    additional = b.ref(r);
  }
  CountBounds count;
  for (const char* k : {"minProperties", "maxProperties"}) {
    if (!s.contains(k)) continue;
    if (!s[k].is_number() || s[k].get<double>() < 0) schema_error(ptr + "/" + k, "must be a non-negative number");
    int64_t v = static_cast<int64_t>(std::min(s[k].get<double>(), 1e9));
    (k[1] == 'i' ? count.min : count.max) = v;
    count.ptr = ptr + "/" + k;
  }
  if (count.max >= 0 && count.min > count.max) return b.nothing();
  auto index_of = [&](const std::string& n) {
    return static_cast<int>(std::find(names.begin(), names.end(), n) - names.begin());
  };
  for (const auto& [t, need] : dep_req) {
    if (names.size() > 31) schema_error(ptr + "/dependentRequired", "too many named properties");
    uint32_t m = 0;
    for (const auto& x : need) m |= 1u << index_of(x);
    count.deps.push_back({index_of(t), m});
    if (count.ptr.empty()) count.ptr = ptr + "/dependentRequired";
  }
  if (names.size() > static_cast<size_t>(kAnyOrderMaxProperties) && count.min == 0 && count.max < 0 &&
      count.deps.empty() && !s.contains("x-di-witness"))
    return tracked_object(names, values, required, additional);
  if (s.contains("x-di-witness")) {
    std::vector<const json*> sch(schemas.begin(), schemas.end());
    ObjectParts o{names, sch, props, required, additional, add_schema, names_dfa ? &*names_dfa : nullptr, !pats.empty()};
    return b.seq({b.byte('{'), ws(), witness_members(s["x-di-witness"], o, count, ptr, depth), ws(), b.byte('}')});
  }
  return b.seq({b.byte('{'), ws(), members(props, required, additional, count), ws(), b.byte('}')});
}

ExprId SchemaLowerer::lower_array(const json& s, const std::string& ptr, int depth) {
  if (auto vals = unique_scalar_values(s)) {
    const bool non_empty = s.contains("minItems") && s["minItems"].is_number() && s["minItems"].get<double>() > 0;
    if (vals->empty()) return non_empty ? b.nothing() : b.seq({b.byte('['), ws(), b.byte(']')});
    return unique_array(*vals, non_empty);
  }
  std::vector<ExprId> prefix;
  static const json kTrue = true;
  const json* items = &kTrue;
  std::string items_ptr = ptr + "/items";
  std::vector<const json*> prefix_schemas;
  std::vector<std::string> prefix_ptrs;
  auto lower_prefix = [&](const json& arr, const std::string& p) {
    if (!arr.is_array()) schema_error(p, "must be an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      prefix_schemas.push_back(&arr[i]);
      prefix_ptrs.push_back(p + "/" + std::to_string(i));
    }
  };
  if (s.contains("prefixItems")) {
    lower_prefix(s["prefixItems"], ptr + "/prefixItems");
    if (s.contains("items")) items = &s["items"];
  } else if (s.contains("items") && s["items"].is_array()) {  // draft 4-2019 tuple form
    lower_prefix(s["items"], ptr + "/items");
    if (s.contains("additionalItems")) items = &s["additionalItems"], items_ptr = ptr + "/additionalItems";
  } else if (s.contains("items")) {
    items = &s["items"];
  }
  auto count = [&](const char* k, int64_t dflt) -> int64_t {
    if (!s.contains(k)) return dflt;
    const json& v = s[k];
    if (!v.is_number() || v.get<double>() < 0) schema_error(ptr + "/" + k, "must be a non-negative number");
    return static_cast<int64_t>(std::min(v.get<double>(), 1e9));
  };
  const int64_t min_items = count("minItems", 0), max_items = count("maxItems", -1);
  if (max_items >= 0 && min_items > max_items) return b.nothing();
  if (s.contains("contains")) {
    ArrayShape shape{prefix_schemas, prefix_ptrs, items, items_ptr, min_items, max_items};
    if (ExprId e = lower_contains(s, shape, ptr, depth); e >= 0) return e;
  }
  for (size_t i = 0; i < prefix_schemas.size(); ++i) prefix.push_back(lower(*prefix_schemas[i], prefix_ptrs[i], depth + 1));
  for (auto [v, k] : {std::pair{min_items, "/minItems"}, std::pair{max_items, "/maxItems"}})
    if (v > kMaxCountBound) schema_error(ptr + k, "bounds above " + std::to_string(kMaxCountBound) + " are not supported");
  ExprId item = lower(*items, items_ptr, depth + 1);
  ExprId comma = punct(',');
  const int64_t k = static_cast<int64_t>(prefix.size());
  const int64_t cap = max_items;
  // after(i): what may follow once i elements are written (i >= 1).
  std::function<ExprId(int64_t)> after = [&](int64_t i) -> ExprId {
    if (cap >= 0 && i >= cap) return b.empty();
    if (i >= k) {
      // Large counts become nested block rules instead of unrolled copies.
      return counted_repeat(b, b.seq({comma, item}), std::max<int64_t>(min_items - i, 0), cap >= 0 ? cap - i : -1);
    }
    ExprId next = b.seq({comma, prefix[i], after(i + 1)});
    return i >= min_items ? b.opt(next) : next;
  };
  ExprId body;
  if (cap == 0) {
    body = b.empty();
  } else {
    ExprId first = b.seq({k > 0 ? prefix[0] : item, after(1)});
    body = min_items == 0 ? b.opt(first) : first;
  }
  return b.seq({b.byte('['), ws(), body, ws(), b.byte(']')});
}

// Members whose key is not one of `names`: partitioned by the set T of patterns the key
// matches (value: all of T's schemas; T empty: additionalProperties), keys restricted to
// propertyNames. Each part's key language is a product DFA over the quoted key.
ExprId SchemaLowerer::pattern_members(const std::vector<std::string>& names, const std::vector<PatternProp>& pats,
                                      const Dfa* names_dfa, ExprId add_value, const std::string& ptr, int depth) {
  auto dfa_of = [&](ExprId e) { return *expr_to_dfa(b, e); };
  Dfa any_key = dfa_of(b.seq({b.byte('"'), b.star(json_string_char(b)), b.byte('"')}));
  std::vector<ExprId> lits;
  for (const auto& n : names) lits.push_back(b.literal(json_quoted(n)));
  Dfa named = dfa_of(b.alt(std::move(lits)));
  std::vector<const Dfa*> ops{&any_key, &named};
  if (names_dfa) ops.push_back(names_dfa);
  const size_t base = ops.size();
  for (const auto& p : pats) ops.push_back(&p.dfa);
  const uint32_t k = static_cast<uint32_t>(pats.size());
  std::vector<ExprId> alts;
  for (uint32_t t = 0; t < (1u << k); ++t) {
    ExprId value;
    if (t == 0) {
      value = add_value;
    } else {
      json all = json::array();
      std::string vptr;
      for (uint32_t i = 0; i < k; ++i)
        if (t >> i & 1) all.push_back(*pats[i].schema), vptr = pats[i].ptr;
      value = lower(all.size() == 1 ? all[0] : json{{"allOf", all}}, vptr, depth + 1);
    }
    if (b.expr(value).kind == ExprKind::kNothing) continue;
    Dfa keys;
    try {
      keys = dfa_product(ops, [&](uint32_t m) {
        if (!(m & 1) || (m & 2) || (names_dfa && !(m & 4))) return false;
        return (m >> base) == t;
      });
    } catch (const GrammarError& e) {
      schema_error(ptr + "/patternProperties", e.what());
    }
    if (dfa_is_empty(keys)) continue;
    alts.push_back(b.seq({dfa_to_expr(b, keys), punct(':'), value}));
  }
  return b.alt(std::move(alts));
}

const json* SchemaLowerer::resolve(const std::string& ref, const std::string& ptr, std::string* target) {
  std::string base_ptr, frag;
  size_t hash = ref.find('#');
  std::string base = ref.substr(0, hash);
  frag = hash == std::string::npos ? "" : ref.substr(hash + 1);
  if (!base.empty()) {
    std::string root_id = root_.is_object() && root_.contains("$id") && root_["$id"].is_string() ? root_["$id"].get<std::string>() : "";
    if (base == root_id) {
      base_ptr = "";
    } else {
      bool found = false;
      for (const auto& [id, p] : id_index_) {
        if (id[0] == '#') continue;
        if (id == base || (id.size() > base.size() && id.compare(id.size() - base.size(), base.size(), base) == 0 &&
                           id[id.size() - base.size() - 1] == '/')) {
          base_ptr = p;
          found = true;
          break;
        }
      }
      if (!found) schema_error(ptr, "$ref '" + ref + "' is not in this document (remote references are not supported)");
    }
  }
  if (!frag.empty() && frag[0] != '/') {
    auto it = id_index_.find("#" + frag);
    if (it == id_index_.end()) schema_error(ptr, "$ref '" + ref + "': unknown anchor");
    if (it->second == "!ambiguous") schema_error(ptr, "$ref '" + ref + "': anchor defined in several resources");
    *target = it->second;
  } else {
    std::string dec;  // percent-decoding
    for (size_t i = 0; i < frag.size(); ++i) {
      if (frag[i] == '%' && i + 2 < frag.size()) {
        // Two hex digits, or a named error (std::stoi threw an untyped invalid_argument on "%s/").
        if (!std::isxdigit(static_cast<unsigned char>(frag[i + 1])) || !std::isxdigit(static_cast<unsigned char>(frag[i + 2])))
          schema_error(ptr, "$ref '" + ref + "': '%' must be followed by two hex digits");
        dec += static_cast<char>(std::stoi(frag.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        dec += frag[i];
      }
    }
    *target = base_ptr + dec;
  }
  // Walk the pointer.
  const json* cur = &root_;
  std::string p = *target;
  size_t i = 0;
  while (i < p.size()) {
    if (p[i] != '/') schema_error(ptr, "$ref '" + ref + "': malformed JSON pointer");
    size_t j = p.find('/', i + 1);
    std::string tok = p.substr(i + 1, j == std::string::npos ? std::string::npos : j - i - 1);
    std::string un;
    for (size_t k = 0; k < tok.size(); ++k) {
      if (tok[k] == '~' && k + 1 < tok.size()) { un += tok[k + 1] == '1' ? '/' : '~'; ++k; }
      else un += tok[k];
    }
    if (cur->is_object() && cur->contains(un)) cur = &(*cur)[un];
    // An index of more than 9 digits is past any array here (std::stoul threw out_of_range past 2^64).
    else if (cur->is_array() && !un.empty() && un.size() <= 9 && std::all_of(un.begin(), un.end(), ::isdigit) &&
             std::stoul(un) < cur->size())
      cur = &(*cur)[std::stoul(un)];
    else schema_error(ptr, "$ref '" + ref + "' does not resolve");
    i = j == std::string::npos ? p.size() : j;
  }
  return cur;
}

ExprId SchemaLowerer::lower_ref(const std::string& ref, const std::string& ptr) {
  std::string target;
  const json* s = resolve(ref, ptr, &target);
  auto it = ref_rules_.find(target);
  if (it != ref_rules_.end()) return b.ref(it->second);
  RuleId r = b.declare_rule("ref");
  ref_rules_[target] = r;
  b.define_rule(r, lower(*s, target, 1));
  return b.ref(r);
}

}  // namespace deepinfer::structured
