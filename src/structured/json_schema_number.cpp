// Numbers for the JSON Schema lowering: bounds (integral or decimal, inclusive or exclusive)
// and multipleOf, as exact regular languages over JSON number text.
//
// Bounded numbers are written without an exponent (the compact serializations this lowering
// targets print such values in plain decimal), except bounds at zero (minimum: 0 and the like),
// where every spelling is decided by its sign alone (5e-06 >= 0); unbounded ones accept every
// JSON spelling.
// A decimal bound is compared digit by digit: for x = I.F against b = Ib.Fb (I without
// leading zeros, Fb without trailing zeros), x > b when I > Ib (longer, or equal length and
// lexicographically larger) or I == Ib and F > Fb as zero-padded digit strings.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/check.h"
#include "structured/json_schema_impl.h"
#include "structured/regular.h"

namespace deepinfer::structured {
namespace {

struct Decimal {
  bool neg = false;
  std::string int_part = "0";  // no leading zeros
  std::string frac;            // no trailing zeros
  bool is_zero() const { return int_part == "0" && frac.empty(); }
};

// The shortest round-trip text of a schema number (what its author wrote, for any double
// that came from a short literal), as an exact decimal.
Decimal to_decimal(const json& v) {
  std::string t = v.dump();
  Decimal d;
  size_t i = 0;
  if (t[i] == '-') d.neg = true, ++i;
  std::string digits;
  int64_t point = -1, exp = 0;
  for (; i < t.size() && t[i] != 'e' && t[i] != 'E'; ++i) {
    if (t[i] == '.') point = static_cast<int64_t>(digits.size());
    else digits += t[i];
  }
  if (i < t.size()) exp = std::stoll(t.substr(i + 1));
  if (point < 0) point = static_cast<int64_t>(digits.size());
  point += exp;
  DI_CHECK(point > -1000 && point < 1000, "number bound exponent out of range: ", t);
  if (point <= 0) digits = std::string(static_cast<size_t>(-point), '0') + digits, point = 0;
  if (point > static_cast<int64_t>(digits.size())) digits += std::string(point - digits.size(), '0');
  d.int_part = digits.substr(0, point);
  d.frac = digits.substr(point);
  d.int_part.erase(0, std::min(d.int_part.find_first_not_of('0'), d.int_part.size()));
  if (d.int_part.empty()) d.int_part = "0";
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  if (d.is_zero()) d.neg = false;
  return d;
}

class DecimalLang {
 public:
  explicit DecimalLang(GrammarBuilder& b) : b_(b) {}

  ExprId digit(char lo = '0', char hi = '9') { return b_.byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); }
  ExprId digits(int32_t n) { return b_.repeat(digit(), n, n); }
  ExprId any_int() { return b_.alt({b_.byte('0'), b_.seq({digit('1', '9'), b_.star(digit())})}); }
  ExprId opt_frac() { return b_.opt(b_.seq({b_.byte('.'), b_.plus(digit())})); }
  ExprId nonzero_tail() { return b_.seq({b_.star(digit()), digit('1', '9'), b_.star(digit())}); }

  // Integer parts (no leading zeros) greater than s.
  ExprId int_gt(const std::string& s) {
    const int32_t n = static_cast<int32_t>(s.size());
    std::vector<ExprId> alts{b_.seq({digit('1', '9'), b_.repeat(digit(), n, kUnbounded)})};
    for (int32_t i = 0; i < n; ++i)
      if (s[i] < '9') alts.push_back(b_.seq({b_.literal(s.substr(0, i)), digit(s[i] + 1, '9'), digits(n - 1 - i)}));
    return b_.alt(std::move(alts));
  }
  // Integer parts less than s.
  ExprId int_lt(const std::string& s) {
    const int32_t n = static_cast<int32_t>(s.size());
    std::vector<ExprId> alts;
    if (n > 1) alts.push_back(b_.alt({b_.byte('0'), b_.seq({digit('1', '9'), b_.repeat(digit(), 0, n - 2)})}));
    for (int32_t i = 0; i < n; ++i) {
      char lo = (i == 0 && n > 1) ? '1' : '0';
      if (s[i] > lo) alts.push_back(b_.seq({b_.literal(s.substr(0, i)), digit(lo, s[i] - 1), digits(n - 1 - i)}));
    }
    return b_.alt(std::move(alts));
  }
  // Magnitudes (unsigned number text) above b (strict) or at least b.
  ExprId mag_ge(const Decimal& d, bool strict) {
    std::vector<ExprId> alts{b_.seq({int_gt(d.int_part), opt_frac()})};
    ExprId tail;
    if (d.frac.empty()) {
      tail = strict ? b_.seq({b_.byte('.'), nonzero_tail()}) : opt_frac();
    } else {
      const std::string& f = d.frac;
      std::vector<ExprId> fr;
      for (size_t i = 0; i < f.size(); ++i)
        if (f[i] < '9') fr.push_back(b_.seq({b_.literal(f.substr(0, i)), digit(f[i] + 1, '9'), b_.star(digit())}));
      fr.push_back(b_.seq({b_.literal(f), strict ? nonzero_tail() : b_.star(digit())}));
      tail = b_.seq({b_.byte('.'), b_.alt(std::move(fr))});
    }
    alts.push_back(b_.seq({b_.literal(d.int_part), tail}));
    return b_.alt(std::move(alts));
  }
  // Magnitudes below b (strict) or at most b.
  ExprId mag_le(const Decimal& d, bool strict) {
    std::vector<ExprId> alts{b_.seq({int_lt(d.int_part), opt_frac()})};
    ExprId tail;
    if (d.frac.empty()) {
      tail = strict ? b_.nothing() : b_.opt(b_.seq({b_.byte('.'), b_.plus(b_.byte('0'))}));
    } else {
      const std::string& f = d.frac;
      std::vector<ExprId> fr;
      for (size_t i = 0; i < f.size(); ++i) {
        if (f[i] > '0') fr.push_back(b_.seq({b_.literal(f.substr(0, i)), digit('0', f[i] - 1), b_.star(digit())}));
        if (i > 0) fr.push_back(b_.literal(f.substr(0, i)));  // a proper prefix: the rest of f is > 0
      }
      if (!strict) fr.push_back(b_.seq({b_.literal(f), b_.star(b_.byte('0'))}));
      tail = b_.opt(b_.seq({b_.byte('.'), b_.alt(std::move(fr))}));
    }
    alts.push_back(b_.seq({b_.literal(d.int_part), tail}));
    return b_.alt(std::move(alts));
  }
  // Magnitudes within optional bounds (both given: DFA intersection).
  ExprId mag_range(const std::optional<Decimal>& lo, bool lo_strict, const std::optional<Decimal>& hi, bool hi_strict) {
    if (!lo && !hi) return b_.seq({any_int(), opt_frac()});
    if (!lo) return mag_le(*hi, hi_strict);
    if (!hi) return mag_ge(*lo, lo_strict);
    return intersect(b_, {mag_ge(*lo, lo_strict), mag_le(*hi, hi_strict)});
  }

 private:
  GrammarBuilder& b_;
};

Decimal negated(Decimal d) {
  if (!d.is_zero()) d.neg = !d.neg;
  return d;
}

}  // namespace

ExprId intersect(GrammarBuilder& b, const std::vector<ExprId>& parts) {
  if (parts.size() == 1) return parts[0];
  std::vector<Dfa> dfas;
  for (ExprId p : parts) {
    auto d = expr_to_dfa(b, p);
    DI_CHECK(d.has_value(), "intersect: operand is not regular");
    dfas.push_back(std::move(*d));
  }
  std::vector<const Dfa*> ops;
  for (const auto& d : dfas) ops.push_back(&d);
  const uint32_t all = (1u << ops.size()) - 1;
  return dfa_to_expr(b, dfa_product(ops, [all](uint32_t m) { return m == all; }));
}

// Number text (no exponent) whose value is within the bounds; -0 counts as 0.
static ExprId decimal_range_expr(GrammarBuilder& b, const std::optional<Decimal>& lo, bool lo_excl,
                                 const std::optional<Decimal>& hi, bool hi_excl) {
  DecimalLang L(b);
  std::vector<ExprId> alts;
  if (!hi || !hi->neg) {  // x >= 0 written without '-': magnitude in [max(lo, 0), hi]
    std::optional<Decimal> mlo;
    if (lo && !lo->neg) mlo = lo;
    alts.push_back(L.mag_range(mlo, mlo && lo_excl, hi, hi_excl));
  }
  if (!lo || lo->neg || lo->is_zero()) {  // '-' m: -m in [lo, hi], i.e. m in [-hi, -lo]
    std::optional<Decimal> mlo, mhi;
    bool mlo_strict = false;
    if (hi && (hi->neg || hi->is_zero())) mlo = negated(*hi), mlo_strict = hi_excl;
    if (lo) mhi = negated(*lo);
    alts.push_back(b.seq({b.byte('-'), L.mag_range(mlo, mlo_strict, mhi, mhi && lo_excl)}));
  }
  return b.alt(std::move(alts));
}

// Numbers x with x * 10^d divisible by p (p >= 1): the digits of x, and its first d fraction
// digits, drive a remainder automaton; fraction digits past d must be zeros. `frac`: whether
// a fraction part may be written at all (draft-4 integers have none).
static ExprId decimal_multiple_expr(GrammarBuilder& b, int64_t p, int32_t d, bool frac) {
  ByteAutomaton a;
  // 0 start, 1 after '-', 2 + r: integer part with remainder r (2 + p: the integer "0"),
  // then F(r, j) = 3 + p + r * (d + 1) + j: j fraction digits read, then Z(r) trailing zeros.
  const int32_t P = static_cast<int32_t>(p), zero_int = 2 + P, fbase = 3 + P, zbase = fbase + P * (d + 1);
  a.num_states = zbase + P;
  a.final.assign(a.num_states, false);
  auto F = [&](int64_t r, int32_t j) { return static_cast<int32_t>(fbase + r * (d + 1) + j); };
  auto dig = [&](int32_t from, uint8_t c, int32_t to) { a.edges.push_back({from, c, c, to}); };
  int64_t pow_rest = 1;  // 10^(d - j) mod p, filled per j below
  int64_t pow_d = 1;  // 10^d mod p: an integer part with remainder r is final when r * 10^d = 0 mod p
  for (int32_t i = 0; i < d; ++i) pow_d = pow_d * 10 % p;
  for (int64_t r = 0; r < p; ++r) a.final[2 + r] = (r * pow_d) % p == 0;
  a.final[zero_int] = true;
  for (int32_t from : {0, 1}) {
    dig(from, '0', zero_int);
    for (int c = 1; c <= 9; ++c) dig(from, static_cast<uint8_t>('0' + c), static_cast<int32_t>(2 + c % p));
  }
  dig(0, '-', 1);
  for (int64_t r = 0; r < p; ++r)
    for (int c = 0; c <= 9; ++c) dig(static_cast<int32_t>(2 + r), static_cast<uint8_t>('0' + c), static_cast<int32_t>(2 + (r * 10 + c) % p));
  if (!frac) return b.automaton(std::move(a));
  dig(zero_int, '.', F(0, 0));
  for (int64_t r = 0; r < p; ++r) dig(static_cast<int32_t>(2 + r), '.', F(r, 0));
  for (int32_t j = d; j >= 0; --j) {
    for (int64_t r = 0; r < p; ++r) {
      if (j > 0) a.final[F(r, j)] = (r * pow_rest) % p == 0;
      if (j < d)
        for (int c = 0; c <= 9; ++c) dig(F(r, j), static_cast<uint8_t>('0' + c), F((r * 10 + c) % p, j + 1));
      else
        dig(F(r, j), '0', static_cast<int32_t>(zbase + r));
    }
    pow_rest = pow_rest * 10 % p;
  }
  for (int64_t r = 0; r < p; ++r) {
    a.final[zbase + r] = r == 0;
    dig(static_cast<int32_t>(zbase + r), '0', static_cast<int32_t>(zbase + r));
  }
  return b.automaton(std::move(a));
}

// Every JSON spelling (exponents of any sign and size included) of a number whose sign is
// bounded by zero: lo/hi are "x >= 0" (0 inclusive), "x > 0" (exclusive), and likewise above.
// Only the sign and whether the value is zero decide, so the language is regular; other bounds
// are compared digit by digit over plain decimal text (decimal_range_expr).
static ExprId zero_bounded_expr(GrammarBuilder& b, bool has_lo, bool lo_excl, bool has_hi, bool hi_excl) {
  auto digit = [&](char lo, char hi) { return b.byte_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)); };
  ExprId digits = b.plus(digit('0', '9'));
  ExprId exp = b.opt(b.seq({b.bytes({{'e', 'e'}, {'E', 'E'}}), b.opt(b.bytes({{'+', '+'}, {'-', '-'}})), digits}));
  // Mantissas of value zero, and of value non-zero (a non-zero digit somewhere).
  ExprId zero = b.seq({b.byte('0'), b.opt(b.seq({b.byte('.'), b.plus(b.byte('0'))}))});
  ExprId nonzero = b.alt({b.seq({digit('1', '9'), b.star(digit('0', '9')), b.opt(b.seq({b.byte('.'), digits}))}),
                          b.seq({b.byte('0'), b.byte('.'), b.star(b.byte('0')), digit('1', '9'), b.star(digit('0', '9'))})});
  ExprId minus = b.byte('-');
  std::vector<ExprId> alts;
  const bool pos_ok = !has_hi, neg_ok = !has_lo;  // a positive value passes no upper bound of 0
  const bool zero_ok = !(has_lo && lo_excl) && !(has_hi && hi_excl);
  if (pos_ok) alts.push_back(b.seq({nonzero, exp}));
  if (neg_ok) alts.push_back(b.seq({minus, nonzero, exp}));
  if (zero_ok) alts.push_back(b.seq({b.opt(minus), zero, exp}));
  return b.alt(std::move(alts));
}

ExprId SchemaLowerer::lower_number(const json& s, const std::string& ptr, bool integer) {
  const json *lo = nullptr, *hi = nullptr;
  bool lo_excl = false, hi_excl = false;
  auto num = [&](const char* k) -> const json* {
    if (!s.contains(k) || s[k].is_boolean()) return nullptr;
    if (!s[k].is_number()) schema_error(ptr + "/" + k, "must be a number");
    if (!std::isfinite(s[k].get<double>()) || std::fabs(s[k].get<double>()) > 1e300)
      schema_error(ptr + "/" + k, "bound out of range");
    return &s[k];
  };
  lo = num("minimum");
  hi = num("maximum");
  // Draft 4: exclusiveMinimum/Maximum are booleans modifying minimum/maximum; a number there
  // is no keyword. Later drafts: numbers, bounds of their own.
  if (auto x = draft4_ ? nullptr : num("exclusiveMinimum"); x && (!lo || x->get<double>() >= lo->get<double>()))
    lo = x, lo_excl = true;
  if (auto x = draft4_ ? nullptr : num("exclusiveMaximum"); x && (!hi || x->get<double>() <= hi->get<double>()))
    hi = x, hi_excl = true;
  if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true && lo) lo_excl = true;  // draft 4
  if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true && hi) hi_excl = true;
  const bool frac_ok = !(integer && draft4_);  // draft 4 counts 1.0 as a number, not an integer
  ExprId zero_frac = frac_ok ? b.opt(b.seq({b.byte('.'), b.plus(b.byte('0'))})) : b.empty();
  std::vector<ExprId> parts;
  auto zero = [](const json* v) { return !v || v->get<double>() == 0; };
  if ((lo || hi) && integer && frac_ok && zero(lo) && zero(hi) && !s.contains("multipleOf")) {
    // Sign-bounded integers: every integral spelling of the right sign (1e+18 >= 0).
    parts.push_back(integer_spellings_expr());
    parts.push_back(zero_bounded_expr(b, lo != nullptr, lo_excl, hi != nullptr, hi_excl));
  } else if (lo || hi) {
    if (integer) {
      // On integers a fractional bound rounds inward.
      // Integer bounds are taken exactly when written as integers (the whole int64 range, e.g.
      // 9223372036854775807); fractional ones round inward.
      auto bound = [&](const json* v, bool is_lo, bool excl) -> int64_t {
        constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
        if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMax))
          schema_error(ptr, "integer bounds beyond 64 bits are not supported");
        if (v->is_number_integer()) {
          const int64_t x = v->get<int64_t>();
          if (!excl) return x;
          if ((is_lo && x == kMax) || (!is_lo && x == kMin)) schema_error(ptr, "integer bounds beyond 64 bits are not supported");
          return is_lo ? x + 1 : x - 1;
        }
        const double d = v->get<double>();
        if (std::fabs(d) > 9e18) schema_error(ptr, "integer bounds beyond 64 bits are not supported");
        return static_cast<int64_t>(is_lo ? (excl ? std::floor(d) + 1 : std::ceil(d)) : (excl ? std::ceil(d) - 1 : std::floor(d)));
      };
      std::optional<int64_t> ilo, ihi;
      if (lo) ilo = bound(lo, true, lo_excl);
      if (hi) ihi = bound(hi, false, hi_excl);
      for (auto x : {ilo, ihi})  // magnitudes are negated in int_range_expr
        if (x && *x == std::numeric_limits<int64_t>::min())
          schema_error(ptr, "integer bounds beyond 64 bits are not supported");
      if (ilo && ihi && *ilo > *ihi) return b.nothing();
      parts.push_back(b.seq({int_range_expr(b, ilo, ihi, true), zero_frac}));
    } else {
      std::optional<Decimal> dlo, dhi;
      if (lo) dlo = to_decimal(*lo);
      if (hi) dhi = to_decimal(*hi);
      if ((!dlo || dlo->is_zero()) && (!dhi || dhi->is_zero()) && !s.contains("multipleOf"))
        parts.push_back(zero_bounded_expr(b, dlo.has_value(), lo_excl, dhi.has_value(), hi_excl));
      else
        parts.push_back(decimal_range_expr(b, dlo, lo_excl, dhi, hi_excl));
    }
  }
  if (s.contains("multipleOf")) {
    const json& m = s["multipleOf"];
    if (!m.is_number() || m.get<double>() <= 0) schema_error(ptr + "/multipleOf", "must be a positive number");
    // m = p / 10^d exactly (its shortest decimal text).
    Decimal dm = to_decimal(m);
    std::string pd = dm.int_part + dm.frac;
    pd.erase(0, std::min(pd.find_first_not_of('0'), pd.size()));
    int32_t d = static_cast<int32_t>(dm.frac.size());
    if (pd.size() > 9 || d > 12) schema_error(ptr + "/multipleOf", "keyword 'multipleOf' with this value is not supported");
    int64_t p = std::stoll(pd);
    if (integer) {  // an integer x is a multiple of p / 10^d iff it is one of p / gcd(p, 10^d)
      int64_t t = 1;
      for (int32_t i = 0; i < d; ++i) t *= 10;
      p /= std::gcd(p, t);
      d = 0;
    }
    if (p * (d + 3) > 100'000) schema_error(ptr + "/multipleOf", "keyword 'multipleOf' with this value is not supported (automaton too large)");
    parts.push_back(decimal_multiple_expr(b, p, d, frac_ok));
  }
  if (parts.empty()) return number_rule(integer);
  try {
    return intersect(b, parts);
  } catch (const GrammarError& e) {
    schema_error(ptr, std::string("numeric bounds with multipleOf: ") + e.what());
  }
}

}  // namespace deepinfer::structured
