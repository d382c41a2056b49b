// GBNF (llama.cpp grammar syntax) -> grammar.
//   name ::= alt1 | alt2        rule; `root` is the start rule
//   "text" [a-z^...] .          literal, class (negated with ^), any character
//   name ( ... )                rule reference, group
//   * + ? {m} {m,} {m,n}        repetition
//   <[id]>                      special token `id` (TokenizerInfo::terminal_ids)
//   # comment
// A rule body runs until the next `name ::=`, so newlines may appear anywhere.
#include "structured/ebnf.h"

#include <algorithm>
#include <map>
#include <string>

#include "core/check.h"
#include "structured/grammar_text.h"
#include "structured/json_schema.h"
#include "structured/lark.h"

namespace deepinfer::structured {
namespace {

class EbnfParser : GrammarTextParser {
 public:
  EbnfParser(std::string_view src, GrammarBuilder& b) : GrammarTextParser(src, b, "ebnf") {}
  Grammar parse();

 private:
  void skip_space() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') { ++pos_; continue; }
      if (c == '#') { while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_; continue; }
      break;
    }
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string parse_name() {
    size_t st = pos_;
    while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
    if (st == pos_) fail(pos_, "expected a rule name");
    return std::string(s_.substr(st, pos_ - st));
  }
  bool at_rule_start() {  // NAME ::= ahead?
    size_t save = pos_;
    size_t p = pos_;
    while (p < s_.size() && name_char(s_[p])) ++p;
    if (p == pos_) return false;
    pos_ = p;
    skip_space();
    bool r = s_.substr(pos_, 3) == "::=";
    pos_ = save;
    return r;
  }
  uint32_t parse_char();  // one (possibly escaped) code point inside a literal or class
  ExprId parse_alt(int depth);
  ExprId parse_seq(int depth);
  ExprId parse_atom(int depth);

  std::map<RuleId, bool> defined_;
};

uint32_t EbnfParser::parse_char() {
  auto hex = [&](int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      if (pos_ >= s_.size()) fail(pos_, "truncated escape");
      char c = s_[pos_++];
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) fail(pos_ - 1, "invalid hex digit");
      v = v * 16 + d;
    }
    return v;
  };
  unsigned char c = static_cast<unsigned char>(s_[pos_]);
  if (c == '\\') {
    ++pos_;
    if (pos_ >= s_.size()) fail(pos_, "truncated escape");
    char e = s_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return static_cast<uint32_t>(e);
      default: fail(pos_ - 1, std::string("unknown escape \\") + e);
    }
  }
  size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  if (pos_ + n > s_.size()) fail(pos_, "invalid UTF-8");
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_ + k]) & 0x3F);
  pos_ += n;
  return cp;
}

ExprId EbnfParser::parse_alt(int depth) {
  if (depth > 500) fail(pos_, "nesting too deep");
  std::vector<ExprId> alts{parse_seq(depth)};
  while (pos_ < s_.size() && s_[pos_] == '|') {
    ++pos_;
    alts.push_back(parse_seq(depth));
  }
  return b_.alt(std::move(alts));
}

ExprId EbnfParser::parse_seq(int depth) {
  std::vector<ExprId> items;
  for (;;) {
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')' || at_rule_start()) break;
    ExprId a = parse_atom(depth);
    for (;;) {
      if (pos_ >= s_.size()) break;
      char q = s_[pos_];
      if (q == '*') { ++pos_; a = b_.star(a); }
      else if (q == '+') { ++pos_; a = b_.plus(a); }
      else if (q == '?') { ++pos_; a = b_.opt(a); }
      else if (q == '{') {
        size_t at = pos_++;
        auto num = [&]() -> int64_t {
          skip_space();
          size_t st = pos_;
          int64_t v = 0;
          while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) v = std::min<int64_t>(v * 10 + (s_[pos_++] - '0'), 1 << 20);
          return pos_ > st ? v : -1;
        };
        int64_t lo = num(), hi;
        if (lo < 0) fail(at, "expected a number in {m,n}");
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          hi = num();
        } else {
          hi = lo;
        }
        skip_space();
        if (pos_ >= s_.size() || s_[pos_] != '}') fail(at, "unterminated {m,n}");
        ++pos_;
        if (hi >= 0 && hi < lo) fail(at, "repetition {m,n} with n < m");
        if (lo > 10000 || hi > 10000) fail(at, "repetition count above 10000");
        a = b_.repeat(a, static_cast<int32_t>(lo), hi < 0 ? kUnbounded : static_cast<int32_t>(hi));
      } else {
        break;
      }
    }
    items.push_back(a);
  }
  return b_.seq(std::move(items));
}

ExprId EbnfParser::parse_atom(int depth) {
  size_t at = pos_;
  char c = s_[pos_];
  if (c == '"') {
    ++pos_;
    std::vector<ExprId> parts;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      uint32_t cp = parse_char();
      parts.push_back(b_.codepoint_range(cp, cp));
    }
    if (pos_ >= s_.size()) fail(at, "unterminated string literal");
    ++pos_;
    return b_.seq(std::move(parts));
  }
  if (c == '[') {
    ++pos_;
    bool neg = pos_ < s_.size() && s_[pos_] == '^';
    if (neg) ++pos_;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    while (pos_ < s_.size() && s_[pos_] != ']') {
      uint32_t lo = parse_char(), hi = lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail(at, "character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    if (pos_ >= s_.size()) fail(at, "unterminated character class");
    ++pos_;
    if (neg) {
      std::sort(ranges.begin(), ranges.end());
      std::vector<std::pair<uint32_t, uint32_t>> inv;
      uint32_t next = 0;
      for (auto [lo, hi] : ranges) {
        if (lo > next) inv.push_back({next, lo - 1});
        next = std::max(next, hi + 1);
      }
      if (next <= 0x10FFFF) inv.push_back({next, 0x10FFFF});
      ranges = std::move(inv);
    }
    return b_.codepoints(ranges);
  }
  if (c == '(') {
    ++pos_;
    ExprId e = parse_alt(depth + 1);
    skip_space();
    if (pos_ >= s_.size() || s_[pos_] != ')') fail(at, "unclosed '('");
    ++pos_;
    return e;
  }
  if (c == '.') {
    ++pos_;
    return b_.codepoint_range(0, 0x10FFFF);
  }
  if (c == '<') return special_token_ref();
  if (name_char(c)) {
    std::string name = parse_name();
    return b_.ref(rule_ref(name, at));
  }
  fail(at, std::string("unexpected character '") + c + "'");
}

Grammar EbnfParser::parse() {
  skip_space();
  if (pos_ >= s_.size()) fail(0, "empty grammar");
  while (pos_ < s_.size()) {
    size_t at = pos_;
    std::string name = parse_name();
    skip_space();
    if (s_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    RuleId r = rule_ref(name, at);
    if (defined_[r]) fail(at, "rule '" + name + "' defined twice");
    defined_[r] = true;
    ExprId body = parse_alt(0);
    b_.define_rule(r, body);
    skip_space();
    if (pos_ < s_.size() && !at_rule_start()) fail(pos_, std::string("unexpected '") + s_[pos_] + "'");
  }
  for (RuleId r = 0; r < b_.num_rules(); ++r)
    if (!defined_[r]) fail(first_use_[r], "undefined rule '" + b_.rule(r).name + "'");
  RuleId root = b_.find_rule("root");
  if (root < 0) fail(0, "no 'root' rule");
  return std::move(b_).finish(root);
}

}  // namespace

Grammar ebnf_to_grammar(std::string_view src, const JsonGrammarOptions& json) {
  if (looks_like_lark(src)) return lark_to_grammar(src, json);
  GrammarBuilder b;
  EbnfParser p(src, b);
  return p.parse();
}

Grammar ebnf_to_grammar(std::string_view src) { return ebnf_to_grammar(src, JsonGrammarOptions{}); }

}  // namespace deepinfer::structured
