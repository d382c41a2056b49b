// Numbers, strings, formats, literals and allOf merging for the JSON Schema lowering.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/check.h"
#include "structured/json_schema_impl.h"
#include "structured/regex.h"
#include "structured/regular.h"

namespace deepinfer::structured {
namespace {

ExprId digit(GrammarBuilder& b, char lo, char hi) {
  return b.byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
}

// Digit strings of |x| digits, lexicographically within [x, y] (same length).
ExprId between(GrammarBuilder& b, const std::string& x, const std::string& y) {
  if (x.empty()) return b.empty();
  const size_t n = x.size();
  // Every digit string of this length: one repeat (recursing here doubled per digit: 2^19
  // expressions for a bound near 1e18).
  if (x.find_first_not_of('0') == std::string::npos && y.find_first_not_of('9') == std::string::npos)
    return b.repeat(digit(b, '0', '9'), static_cast<int32_t>(n), static_cast<int32_t>(n));
  if (x[0] == y[0]) return b.seq({b.byte(x[0]), between(b, x.substr(1), y.substr(1))});
  std::vector<ExprId> alts;
  alts.push_back(b.seq({b.byte(x[0]), between(b, x.substr(1), std::string(n - 1, '9'))}));
  if (x[0] + 1 <= y[0] - 1)
    alts.push_back(b.seq({digit(b, x[0] + 1, y[0] - 1), b.repeat(digit(b, '0', '9'), n - 1, n - 1)}));
  alts.push_back(b.seq({b.byte(y[0]), between(b, std::string(n - 1, '0'), y.substr(1))}));
  return b.alt(std::move(alts));
}

// Non-negative integers in [a, c] (c < 0: unbounded), no leading zeros.
ExprId nonneg_range(GrammarBuilder& b, int64_t a, int64_t c) {
  if (c >= 0 && a > c) return b.nothing();
  const std::string sa = std::to_string(a);
  const size_t la = sa.size();
  const size_t lc = c >= 0 ? std::to_string(c).size() : la;
  std::vector<ExprId> alts;
  for (size_t len = la; len <= lc; ++len) {
    std::string lo = len == la ? sa : "1" + std::string(len - 1, '0');
    std::string hi = (c >= 0 && len == lc) ? std::to_string(c) : std::string(len, '9');
    alts.push_back(between(b, lo, hi));
  }
  if (c < 0) alts.push_back(b.seq({digit(b, '1', '9'), b.repeat(digit(b, '0', '9'), la, kUnbounded)}));
  return b.alt(std::move(alts));
}

bool is_int_value(double v) { return std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.2e18; }

ExprId counted_repeat_memo(GrammarBuilder& b, ExprId x, int64_t mn, int64_t mx, std::map<ExprId, ExprId>& blocks,
                           int64_t direct, int64_t block) {
  if (mx >= 0 && mx <= direct) return b.repeat(x, static_cast<int32_t>(mn), static_cast<int32_t>(mx));
  if (mx < 0) {
    if (mn <= direct) return b.repeat(x, static_cast<int32_t>(mn), kUnbounded);
    return b.seq({counted_repeat_memo(b, x, mn, mn, blocks, direct, block), b.star(x)});
  }
  auto it = blocks.find(x);
  if (it == blocks.end()) {
    RuleId r = b.declare_rule("block");
    b.set_inline(r, false);  // a call: the caller's automaton counts blocks, not copies of x
    b.define_rule(r, b.repeat(x, block, block));
    it = blocks.emplace(x, b.ref(r)).first;
  }
  const ExprId y = it->second;
  // A length m = q * block + r (r < block) is q blocks then r units; split [mn, mx] by q.
  const int64_t qa = mn / block, ra = mn % block, qb = mx / block, rb = mx % block;
  auto units = [&](int64_t lo, int64_t hi) { return b.repeat(x, static_cast<int32_t>(lo), static_cast<int32_t>(hi)); };
  if (qa == qb) return b.seq({counted_repeat_memo(b, y, qa, qa, blocks, direct, block), units(ra, rb)});
  std::vector<ExprId> alts{b.seq({counted_repeat_memo(b, y, qa, qa, blocks, direct, block), units(ra, block - 1)})};
  if (qa + 1 <= qb - 1) alts.push_back(b.seq({counted_repeat_memo(b, y, qa + 1, qb - 1, blocks, direct, block), units(0, block - 1)}));
  alts.push_back(b.seq({counted_repeat_memo(b, y, qb, qb, blocks, direct, block), units(0, rb)}));
  return b.alt(std::move(alts));
}

}  // namespace

ExprId counted_repeat(GrammarBuilder& b, ExprId x, int64_t mn, int64_t mx, int64_t direct, int64_t block) {
  DI_CHECK(mn >= 0 && (mx < 0 || mx >= mn), "counted_repeat bounds ", mn, "..", mx);
  DI_CHECK(block >= 1 && direct >= block, "counted_repeat block ", block, " direct ", direct);
  std::map<ExprId, ExprId> blocks;
  return counted_repeat_memo(b, x, mn, mx, blocks, direct, block);
}

ExprId int_range_expr(GrammarBuilder& b, std::optional<int64_t> lo, std::optional<int64_t> hi, bool neg_zero) {
  std::vector<ExprId> alts;
  if (!hi || *hi >= 0) alts.push_back(nonneg_range(b, lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1));
  if (!lo || *lo < 0) {
    int64_t mag_lo = hi ? std::max<int64_t>(1, -*hi) : 1;
    alts.push_back(b.seq({b.byte('-'), nonneg_range(b, mag_lo, lo ? -*lo : -1)}));
  }
  if (neg_zero && (!lo || *lo <= 0) && (!hi || *hi >= 0)) alts.push_back(b.literal("-0"));
  return b.alt(std::move(alts));
}

// Integers divisible by k: digits of |x| drive a remainder automaton (states 0..k-1).
ExprId multiple_of_expr(GrammarBuilder& b, int64_t k) {
  ByteAutomaton a;
  // state 0: start; 1: after '-'; 2: "0" (final); 3 + r: remainder r after a nonzero lead.
  a.num_states = static_cast<int32_t>(3 + k);
  a.final.assign(a.num_states, false);
  a.final[2] = true;
  a.final[3] = true;
  for (int32_t from : {0, 1}) {
    a.edges.push_back({from, '0', '0', 2});
    for (int d = 1; d <= 9; ++d)
      a.edges.push_back({from, static_cast<uint8_t>('0' + d), static_cast<uint8_t>('0' + d), static_cast<int32_t>(3 + d % k)});
  }
  a.edges.push_back({0, '-', '-', 1});
  for (int64_t r = 0; r < k; ++r)
    for (int d = 0; d <= 9; ++d)
      a.edges.push_back({static_cast<int32_t>(3 + r), static_cast<uint8_t>('0' + d), static_cast<uint8_t>('0' + d),
                         static_cast<int32_t>(3 + (r * 10 + d) % k)});
  return b.automaton(std::move(a));
}

// Every JSON spelling of an integral value (draft 6 on: 1.0, 1e+18, 0e5, 1.25e2), shared as one
// rule: plain integers with an optional all-zero fraction; zero mantissas with any exponent;
// mantissas whose significant fraction digits (at most 17) the non-negative exponent covers.
// Negative exponents over trailing integer zeros (1500e-2) and longer fractions are not
// spelled (no model writes them for integers; a regular language cannot compare the counts).
ExprId SchemaLowerer::integer_spellings() {
  if (integer_rule_ >= 0) return b.ref(integer_rule_);
  integer_rule_ = b.declare_rule("json_integer");
  b.set_inline(integer_rule_, false);
  b.define_rule(integer_rule_, integer_spellings_expr());
  return b.ref(integer_rule_);
}

ExprId SchemaLowerer::integer_spellings_expr() {
  ExprId d09 = digit(b, '0', '9'), d19 = digit(b, '1', '9');
  ExprId nat = b.alt({b.byte('0'), b.seq({d19, b.star(d09)})});
  ExprId minus = b.opt(b.byte('-'));
  ExprId zeros_frac = b.opt(b.seq({b.byte('.'), b.plus(b.byte('0'))}));
  ExprId e = b.bytes({{'e', 'e'}, {'E', 'E'}});
  ExprId any_exp = b.seq({e, b.opt(b.bytes({{'+', '+'}, {'-', '-'}})), b.plus(d09)});
  ExprId pos_exp = b.seq({e, b.opt(b.byte('+')), b.plus(d09)});
  std::vector<ExprId> alts{b.seq({minus, nat, zeros_frac}),
                           b.seq({minus, b.byte('0'), zeros_frac, any_exp}),
                           b.seq({minus, d19, b.star(d09), zeros_frac, pos_exp})};
  for (int64_t k = 1; k <= 17; ++k) {  // k significant fraction digits, exponent >= k
    ExprId frac = b.seq({b.byte('.'), b.repeat(d09, static_cast<int32_t>(k - 1), static_cast<int32_t>(k - 1)), d19,
                         b.star(b.byte('0'))});
    ExprId exp_ge = b.seq({e, b.opt(b.byte('+')), b.star(b.byte('0')), int_range_expr(b, k, std::nullopt, false)});
    alts.push_back(b.seq({minus, nat, frac, exp_ge}));
  }
  return b.alt(std::move(alts));
}

ExprId SchemaLowerer::number_rule(bool integer) {
  ExprId digits = b.plus(digit(b, '0', '9'));
  ExprId int_part = b.seq({b.opt(b.byte('-')), b.alt({b.byte('0'), b.seq({digit(b, '1', '9'), b.star(digit(b, '0', '9'))})})});
  // Draft 4 counts 1.0 as a number, not an integer; later drafts accept it as an integer.
  if (integer) return draft4_ ? int_part : integer_spellings();
  ExprId frac = b.opt(b.seq({b.byte('.'), digits}));
  ExprId exp = b.opt(b.seq({b.bytes({{'e', 'e'}, {'E', 'E'}}), b.opt(b.bytes({{'+', '+'}, {'-', '-'}})), digits}));
  return b.seq({int_part, frac, exp});
}

namespace {

// RFC 3986 IPv6address: 8 groups, or fewer around one "::", the last 32 bits possibly IPv4.
std::string ipv6_re() {
  const std::string h = "[0-9a-fA-F]{1,4}", oct = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  const std::string ls32 = "(" + h + ":" + h + "|" + oct + "(\\." + oct + "){3})";
  auto groups = [&](int n) { return n == 0 ? std::string() : "(" + h + ":){" + std::to_string(n) + "}"; };
  auto before = [&](int k) {  // [ *k( h16 ":" ) h16 ]
    return k < 0 ? std::string() : "((" + h + ":){0," + std::to_string(k) + "}" + h + ")?";
  };
  std::string re = "(" + groups(6) + ls32 + "|::" + groups(5) + ls32;
  for (int k = 0; k <= 4; ++k) re += "|" + before(k - 1) + "::" + groups(4 - k) + ls32;
  re += "|" + before(4) + "::" + h + "|" + before(5) + "::)";
  return re;
}

// RFC 3986 URI / URI-reference, or with `iri` RFC 3987 IRI / IRI-reference (ucschar in
// unreserved, iprivate in queries), written out from the ABNF.
std::string uri_re(bool iri, bool reference) {
  const std::string ucs = iri ? R"(\u00A0-\uD7FF\uF900-\uFDCF\uFDF0-\uFFEF\u{10000}-\u{1FFFD}\u{20000}-\u{2FFFD}\u{30000}-\u{3FFFD})"
                                R"(\u{40000}-\u{4FFFD}\u{50000}-\u{5FFFD}\u{60000}-\u{6FFFD}\u{70000}-\u{7FFFD}\u{80000}-\u{8FFFD})"
                                R"(\u{90000}-\u{9FFFD}\u{A0000}-\u{AFFFD}\u{B0000}-\u{BFFFD}\u{C0000}-\u{CFFFD}\u{D0000}-\u{DFFFD})"
                                R"(\u{E1000}-\u{EFFFD})"
                              : "";
  const std::string unres = "A-Za-z0-9\\-._~" + ucs, sub = "!$&'()*+,;=", pct = "%[0-9A-Fa-f]{2}";
  const std::string pchar = "([" + unres + sub + ":@]|" + pct + ")";
  const std::string seg = pchar + "*", seg_nz = pchar + "+";
  const std::string seg_nz_nc = "([" + unres + sub + "@]|" + pct + ")+";
  const std::string oct = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  const std::string host = "(\\[(" + ipv6_re() + "|[vV][0-9A-Fa-f]+\\.[" + "A-Za-z0-9\\-._~" + sub + ":]+)\\]|([" + unres +
                           sub + "]|" + pct + ")*)";
  const std::string authority = "(([" + unres + sub + ":]|" + pct + ")*@)?" + host + "(:[0-9]*)?";
  const std::string abempty = "(/" + seg + ")*", absolute = "/(" + seg_nz + "(/" + seg + ")*)?";
  const std::string private_use = iri ? R"(\uE000-\uF8FF\u{F0000}-\u{FFFFD}\u{100000}-\u{10FFFD})" : "";
  const std::string query = "(\\?(" + pchar + "|[/?" + private_use + "])*)?", frag = "(#(" + pchar + "|[/?])*)?";
  const std::string full = "[A-Za-z][A-Za-z0-9+\\-.]*:(//" + authority + abempty + "|" + absolute + "|" + seg_nz + "(/" +
                           seg + ")*|)" + query + frag;
  if (!reference) return full;
  const std::string relative = "(//" + authority + abempty + "|" + absolute + "|" + seg_nz_nc + "(/" + seg + ")*|)" + query + frag;
  return "(" + full + "|" + relative + ")";
}

}  // namespace

ExprId SchemaLowerer::format_expr(const std::string& fmt, const std::string& ptr) {
  // Day ranges per month; 02-29 only in leap years (divisible by 4, centuries by 400).
  static const std::string kDate =
      R"((\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))|)"
      R"((\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29))";
  static const std::string kTime = R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))";
  // RFC 3339 appendix A: each unit may only be followed by the next smaller one (P1Y2D is invalid).
  static const std::string kDur1 = R"((\d+H(\d+M(\d+S)?)?|\d+M(\d+S)?|\d+S))";
  static const std::string kLabel = R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
  static const std::string kOct = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  static const std::string kH = R"([0-9a-fA-F]{1,4})";
  std::string re;
  if (fmt == "date") re = kDate;
  else if (fmt == "time") re = kTime;
  else if (fmt == "date-time") re = kDate + "[Tt]" + kTime;
  else if (fmt == "duration")
    re = "P(\\d+W|(\\d+Y(\\d+M(\\d+D)?)?|\\d+M(\\d+D)?|\\d+D)(T" + kDur1 + ")?|T" + kDur1 + ")";
  else if (fmt == "email")
    // RFC 5321: dot-atom or quoted local part; host name or [IPv4] / [IPv6:...] literal.
    re = std::string(R"(([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*|"([\x20\x21\x23-\x5B\x5D-\x7E]|\\[\x20-\x7E])*")@)") +
         "(" + kLabel + "(\\." + kLabel + ")*|\\[" + kOct + "(\\." + kOct + "){3}\\]|\\[IPv6:" + ipv6_re() + "\\])";
  else if (fmt == "uuid") re = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  else if (fmt == "ipv4") re = kOct + "(\\." + kOct + "){3}";
  else if (fmt == "ipv6") re = ipv6_re();
  else if (fmt == "hostname") re = kLabel + "(\\." + kLabel + ")*";
  else if (fmt == "uri") re = uri_re(false, false);
  else if (fmt == "uri-reference") re = uri_re(false, true);
  else if (fmt == "iri") re = uri_re(true, false);
  else if (fmt == "iri-reference") re = uri_re(true, true);
  else if (fmt == "json-pointer") re = R"((/([^~/]|~[01])*)*)";  // RFC 6901
  else if (fmt == "relative-json-pointer") re = R"((0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*))";
  else if (fmt == "uri-template") {  // RFC 6570: literals and {expressions} of variable names
    const std::string var = R"(([A-Za-z0-9_]|%[0-9A-Fa-f]{2})(\.?([A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*(:[1-9][0-9]{0,3}|\*)?)";
    re = R"(([\x21\x23\x24\x26-\x3B\x3D\x3F-\x5B\x5D\x5F\x61-\x7A\x7E]|[^\x00-\x7F]|%[0-9A-Fa-f]{2}|\{[+#./;?&=,!@|]?)" +
         var + "(," + var + R"()*\})*)";
  }
  else if (fmt == "idn-email" || fmt == "idn-hostname" || fmt == "regex")
    schema_error(ptr, "format '" + fmt + "' is not supported");
  else
    return -1;  // unknown formats are annotations (JSON Schema 2020-12 §7.2)
  RegexOptions o;
  o.json_string = true;
  return regex_to_expr(b, re, o);
}

// A string's content language is the intersection of its format, pattern and length
// languages (product of their DFAs when more than one applies).
ExprId SchemaLowerer::lower_string(const json& s, const std::string& ptr) {
  std::vector<ExprId> parts;  // content languages (between the quotes)
  std::string fmt = opt_.format_assertion && s.contains("format") && s["format"].is_string() ? s["format"].get<std::string>() : "";
  if (!fmt.empty()) {
    ExprId f = format_expr(fmt, ptr + "/format");
    if (f >= 0) parts.push_back(f);
  }
  std::vector<json> patterns;  // `pattern`, and more from allOf merges (all must match)
  if (s.contains("pattern")) patterns.push_back(s["pattern"]);
  if (s.contains("x-di-patterns")) patterns.insert(patterns.end(), s["x-di-patterns"].begin(), s["x-di-patterns"].end());
  for (const json& pat : patterns) {
    if (!pat.is_string()) schema_error(ptr + "/pattern", "must be a string");
    RegexOptions o;
    o.json_string = true;
    o.search = true;
    try {
      parts.push_back(regex_to_expr(b, pat.get<std::string>(), o));
    } catch (const GrammarError& e) {
      schema_error(ptr + "/pattern", e.what());
    }
  }
  if (s.contains("minLength") || s.contains("maxLength")) {
    auto get = [&](const char* k, int64_t d) -> int64_t {
      if (!s.contains(k)) return d;
      if (!s[k].is_number() || s[k].get<double>() < 0) schema_error(ptr + "/" + k, "must be a non-negative number");
      return static_cast<int64_t>(std::min(s[k].get<double>(), 1e9));
    };
    int64_t mn = get("minLength", 0), mx = get("maxLength", -1);
    if (mx >= 0 && mn > mx) return b.nothing();
    const bool alone = parts.empty();
    const int64_t limit = alone ? kMaxCountBound : 10000;
    if (mn > limit || mx > limit)
      schema_error(ptr + (mx > limit ? "/maxLength" : "/minLength"),
                   "string length bounds above " + std::to_string(limit) +
                       (alone ? "" : " together with pattern/format") + " are not supported");
    // Alone, long bounds count blocks of characters (a few hundred states for any bound);
    // next to a pattern or format the bound must unroll for the DFA intersection. Strings
    // use blocks of 128 characters and unroll up to 256 (items: 64 / 128): a mask at a
    // position whose remaining block is longer than the longest text token is decided by the
    // counter's chain, and only the positions near a block's end, where tokens cross into the
    // caller, need the real stack; a longer block halves how many of those a string has
    // (PERFORMANCE.md, fourteenth session: Github_easy/trivial first-visit masks).
    if (mn > 0 || mx >= 0)
      parts.push_back(alone ? counted_repeat(b, json_string_char(b), mn, mx, kStringDirect, kStringBlock)
                            : b.repeat(json_string_char(b), static_cast<int32_t>(mn), mx < 0 ? kUnbounded : static_cast<int32_t>(mx)));
  }
  if (parts.empty()) return string_rule();
  ExprId content = parts[0];
  if (parts.size() > 1) {
    std::vector<Dfa> dfas;
    try {
      for (ExprId p : parts) dfas.push_back(*expr_to_dfa(b, p, kMaxStringStates));
      std::vector<const Dfa*> ops;
      for (const auto& d : dfas) ops.push_back(&d);
      const uint32_t all = (1u << ops.size()) - 1;
      // A pattern with a length bound multiplies (pattern states x length); e-mail patterns
      // with maxLength 254 reach ~50k states, so this product may go past the default limit.
      // Minimised, so that a searched pattern once found is one string body per position
      // (regular.h dfa_minimize: the mask walk's counted-text shortcut needs that chain).
      content = dfa_to_expr(b, dfa_minimize(dfa_product(ops, [all](uint32_t m) { return m == all; }, kMaxStringStates)));
    } catch (const GrammarError& e) {
      schema_error(ptr, std::string("pattern/format/length intersection: ") + e.what());
    }
  } else if (!patterns.empty() || !fmt.empty()) {
    // A lone pattern or format, minimised for the same reason (a pattern searched for leaves
    // several equivalent "found" states; minimal, they are one string body with self-loops).
    // Past the state bound the expression stays as it was: the automaton build decides then.
    try {
      if (std::optional<Dfa> d = expr_to_dfa(b, content, kMaxStringStates)) content = dfa_to_expr(b, dfa_minimize(*d));
    } catch (const GrammarError&) {
    }
  }
  return b.seq({b.byte('"'), content, b.byte('"')});
}

ExprId SchemaLowerer::string_literal(const std::string& s) { return b.literal(json(s).dump()); }

// A JSON value as text: numbers accept every spelling of the same value that a compact
// serializer can produce (1, 1.0), objects any key order when small.
ExprId SchemaLowerer::literal(const json& v, const std::string& ptr) {
  if (v.is_number()) {
    double d = v.get<double>();
    if (is_int_value(d)) {
      ExprId frac = b.opt(b.seq({b.byte('.'), b.plus(b.byte('0'))}));
      int64_t i = static_cast<int64_t>(d);
      if (i == 0) return b.seq({b.opt(b.byte('-')), b.byte('0'), frac});
      // A serializer may print a large integral double in exponent form (9.007199254740992e+15).
      return b.alt({b.seq({b.literal(std::to_string(i)), frac}), b.literal(json(d).dump())});
    }
    return b.alt({b.literal(v.dump()), b.literal(json(d).dump())});
  }
  if (v.is_array()) {
    std::vector<ExprId> parts{b.byte('['), ws()};
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) parts.push_back(punct(','));
      parts.push_back(literal(v[i], ptr));
    }
    parts.push_back(ws());
    parts.push_back(b.byte(']'));
    return b.seq(std::move(parts));
  }
  if (v.is_object()) {
    std::vector<ExprId> members;
    for (auto it = v.begin(); it != v.end(); ++it)
      members.push_back(b.seq({string_literal(it.key()), punct(':'), literal(it.value(), ptr)}));
    if (members.size() > 4) schema_error(ptr, "object literals with more than 4 keys are not supported");
    std::vector<size_t> idx(members.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::vector<ExprId> perms;
    do {
      std::vector<ExprId> parts{b.byte('{'), ws()};
      for (size_t i = 0; i < idx.size(); ++i) {
        if (i) parts.push_back(punct(','));
        parts.push_back(members[idx[i]]);
      }
      parts.push_back(ws());
      parts.push_back(b.byte('}'));
      perms.push_back(b.seq(std::move(parts)));
    } while (std::next_permutation(idx.begin(), idx.end()));
    return b.alt(std::move(perms));
  }
  return b.literal(v.dump());
}

}  // namespace deepinfer::structured
