#include "structured/regex.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "structured/unicode_tables.h"

namespace deepinfer::structured {
namespace {

using CpRanges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int32_t kMaxRepeat = 1000;

CpRanges normalize(CpRanges r) {
  std::sort(r.begin(), r.end());
  CpRanges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.push_back({lo, hi});
  }
  return out;
}

CpRanges negate(const CpRanges& r) {
  CpRanges n = normalize(r), out;
  uint32_t next = 0;
  for (auto [lo, hi] : n) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

// Simple case folding: ASCII, Latin-1, Latin Extended-A pairs, Greek, Cyrillic, plus the two
// non-ASCII folds of ASCII letters (U+017F long s, U+212A Kelvin sign).
void add_case_variants(CpRanges& r) {
  CpRanges extra;
  auto fold = [&](uint32_t c) {
    auto add = [&](uint32_t x) { extra.push_back({x, x}); };
    if (c >= 'a' && c <= 'z') add(c - 32);
    if (c >= 'A' && c <= 'Z') add(c + 32);
    if (c == 's' || c == 'S') add(0x17F);
    if (c == 0x17F) { add('s'); add('S'); }
    if (c == 'k' || c == 'K') add(0x212A);
    if (c == 0x212A) { add('k'); add('K'); }
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) add(c + 32);
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) add(c - 32);
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
      bool pair_even = (c < 0x139) || (c > 0x148 && c < 0x179);
      if (pair_even) add(c ^ 1);
      else add(((c - 1) ^ 1) + 1);
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) add(c + 32);
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) add(c - 32);
    if (c >= 0x410 && c <= 0x42F) add(c + 32);
    if (c >= 0x430 && c <= 0x44F) add(c - 32);
    if (c >= 0x400 && c <= 0x40F) add(c + 0x50);
    if (c >= 0x450 && c <= 0x45F) add(c - 0x50);
  };
  for (auto [lo, hi] : r)
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x500); ++c) fold(c);
  for (auto [lo, hi] : r)
    if (lo <= 0x212A && hi >= 0x212A) fold(0x212A);
  r.insert(r.end(), extra.begin(), extra.end());
  r = normalize(std::move(r));
}

// \p{...} names: general categories by short or long name (loose matching: case, spaces,
// '_' and '-' ignored; an optional "gc=" / "General_Category=" prefix), plus Any and ASCII.
// False for unknown names (scripts and binary properties are not supported).
bool unicode_class(std::string_view name, CpRanges* out) {
  std::string key;
  for (char c : name)
    if (c != ' ' && c != '_' && c != '-') key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* prefix : {"gc=", "generalcategory="})
    if (key.rfind(prefix, 0) == 0) key = key.substr(std::strlen(prefix));
  static const std::pair<const char*, const char*> kLong[] = {
      {"letter", "l"}, {"uppercaseletter", "lu"}, {"lowercaseletter", "ll"}, {"titlecaseletter", "lt"},
      {"casedletter", "lc"}, {"modifierletter", "lm"}, {"otherletter", "lo"}, {"mark", "m"},
      {"nonspacingmark", "mn"}, {"spacingmark", "mc"}, {"enclosingmark", "me"}, {"number", "n"},
      {"decimalnumber", "nd"}, {"digit", "nd"}, {"letternumber", "nl"}, {"othernumber", "no"},
      {"punctuation", "p"}, {"punct", "p"}, {"connectorpunctuation", "pc"}, {"dashpunctuation", "pd"},
      {"openpunctuation", "ps"}, {"closepunctuation", "pe"}, {"initialpunctuation", "pi"},
      {"finalpunctuation", "pf"}, {"otherpunctuation", "po"}, {"symbol", "s"}, {"mathsymbol", "sm"},
      {"currencysymbol", "sc"}, {"modifiersymbol", "sk"}, {"othersymbol", "so"}, {"separator", "z"},
      {"spaceseparator", "zs"}, {"lineseparator", "zl"}, {"paragraphseparator", "zp"}, {"other", "c"},
      {"control", "cc"}, {"cntrl", "cc"}, {"format", "cf"}, {"surrogate", "cs"}, {"privateuse", "co"},
      {"unassigned", "cn"}, {"combiningmark", "m"}};
  for (auto [l, sh] : kLong)
    if (key == l) key = sh;
  if (key == "any") { *out = {{0, kMaxCp}}; return true; }
  if (key == "ascii") { *out = {{0, 0x7F}}; return true; }
  auto add_matching = [&](auto pred) {
    bool any = false;
    for (size_t i = 0; i < kNumUnicodeCategories; ++i) {
      const auto& t = kUnicodeCategories[i];
      std::string n = {static_cast<char>(std::tolower(t.name[0])), static_cast<char>(std::tolower(t.name[1]))};
      if (!pred(n)) continue;
      any = true;
      for (size_t k = 0; k < t.num_ranges; ++k) out->push_back({t.ranges[2 * k], t.ranges[2 * k + 1]});
    }
    return any;
  };
  out->clear();
  if (key == "cn" || key == "c") {  // unassigned: the complement of every listed category and the surrogates
    add_matching([](const std::string&) { return true; });
    out->push_back({0xD800, 0xDFFF});
    CpRanges unassigned = negate(*out);
    out->clear();
    if (key == "c") add_matching([](const std::string& n) { return n[0] == 'c'; });
    out->insert(out->end(), unassigned.begin(), unassigned.end());
    *out = normalize(std::move(*out));
    return true;
  }
  bool found = false;
  if (key == "lc") found = add_matching([](const std::string& n) { return n == "lu" || n == "ll" || n == "lt"; });
  else if (key.size() == 1) found = add_matching([&](const std::string& n) { return n[0] == key[0]; });
  else if (key.size() == 2) found = add_matching([&](const std::string& n) { return n == key; }) || key == "cs";
  *out = normalize(std::move(*out));
  return found;
}

struct Node {
  enum Kind { kSet, kSeq, kAlt, kRepeat, kStart, kEnd } kind;
  CpRanges set;
  std::vector<int> kids;
  int32_t min = 0, max = 0;
};

struct Flags {
  bool i = false, s = false, m = false, x = false;
};

// The pattern as error text quotes it: long ones cut (a 200 kB pattern is no message).
std::string quoted(std::string_view p) {
  return p.size() <= 200 ? std::string(p) : std::string(p.substr(0, 200)) + "...";
}

class Parser {
 public:
  Parser(std::string_view p, const RegexOptions& o) : p_(p) {
    flags_.i = o.case_insensitive;
    flags_.s = o.dot_all;
    flags_.m = o.multi_line;
    flags_.x = o.verbose;
  }
  int parse() {
    int n = parse_alt();
    if (pos_ < p_.size()) fail(p_[pos_] == ')' ? "unmatched ')'" : "unexpected character");
    return n;
  }
  std::vector<Node> nodes;
  static constexpr int kMaxGroupDepth = 1000;

 private:
  int group_depth_ = 0;
  [[noreturn]] void fail(const std::string& what) const {
    DI_THROW(GrammarError, "regex /", quoted(p_), "/: ", what, " at offset ", pos_);
  }
  int add(Node n) { nodes.push_back(std::move(n)); return static_cast<int>(nodes.size() - 1); }
  bool eof() const { return pos_ >= p_.size(); }
  uint32_t peek_cp(size_t* len) const;
  uint32_t next_cp() { size_t l; uint32_t c = peek_cp(&l); pos_ += l; return c; }
  void skip_verbose() {
    if (!flags_.x) return;
    while (!eof()) {
      char c = p_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') { ++pos_; continue; }
      if (c == '#') { while (!eof() && p_[pos_] != '\n') ++pos_; continue; }
      break;
    }
  }
  int set_node(CpRanges r) {
    if (flags_.i) add_case_variants(r);
    return add(Node{.kind = Node::kSet, .set = normalize(std::move(r))});
  }
  int parse_alt();
  int parse_seq();
  int parse_atom();
  int parse_group();
  bool parse_quant(int32_t* min, int32_t* max);
  CpRanges parse_class();
  bool parse_class_escape(CpRanges* out);  // \d \w \s etc.; false if not a class escape
  uint32_t parse_escape_cp();              // single-character escape after the backslash
  uint32_t parse_hex(size_t digits, bool braced);

  std::string_view p_;
  size_t pos_ = 0;
  Flags flags_;
};

uint32_t Parser::peek_cp(size_t* len) const {
  auto u = [&](size_t k) { return static_cast<uint8_t>(p_[pos_ + k]); };
  uint8_t c = u(0);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || pos_ + n > p_.size()) fail("invalid UTF-8 in pattern");
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    if ((u(k) & 0xC0) != 0x80) fail("invalid UTF-8 in pattern");
    cp = (cp << 6) | (u(k) & 0x3F);
  }
  *len = n;
  return cp;
}

int Parser::parse_alt() {
  std::vector<int> alts{parse_seq()};
  while (!eof() && p_[pos_] == '|') {
    ++pos_;
    alts.push_back(parse_seq());
  }
  if (alts.size() == 1) return alts[0];
  return add(Node{.kind = Node::kAlt, .kids = std::move(alts)});
}

int Parser::parse_seq() {
  std::vector<int> items;
  Flags saved = flags_;
  for (;;) {
    skip_verbose();
    if (eof() || p_[pos_] == '|' || p_[pos_] == ')') break;
    int atom = parse_atom();
    if (atom < 0) {  // a flag group: affects the rest of this group
      skip_verbose();
      if (!eof() && (p_[pos_] == '*' || p_[pos_] == '+' || p_[pos_] == '?' || p_[pos_] == '{'))
        fail("quantifier with nothing to repeat");
      continue;
    }
    for (;;) {
      skip_verbose();
      int32_t mn, mx;
      size_t qpos = pos_;
      if (!parse_quant(&mn, &mx)) break;
      Node::Kind k = nodes[atom].kind;
      if (k == Node::kStart || k == Node::kEnd) { pos_ = qpos; fail("quantifier after an anchor"); }
      if (!eof() && p_[pos_] == '?') ++pos_;  // lazy: same language
      else if (!eof() && p_[pos_] == '+') fail("possessive quantifiers are not supported");
      atom = add(Node{.kind = Node::kRepeat, .kids = {atom}, .min = mn, .max = mx});
    }
    items.push_back(atom);
  }
  (void)saved;
  if (items.size() == 1) return items[0];
  return add(Node{.kind = Node::kSeq, .kids = std::move(items)});
}

bool Parser::parse_quant(int32_t* min, int32_t* max) {
  if (eof()) return false;
  char c = p_[pos_];
  if (c == '*') { ++pos_; *min = 0; *max = kUnbounded; return true; }
  if (c == '+') { ++pos_; *min = 1; *max = kUnbounded; return true; }
  if (c == '?') { ++pos_; *min = 0; *max = 1; return true; }
  if (c != '{') return false;
  // {n}, {n,}, {n,m} (and Rust's {,m}); anything else is a literal '{' (ECMAScript).
  size_t q = pos_ + 1;
  auto num = [&](int64_t* v) {
    size_t s = q;
    *v = 0;
    while (q < p_.size() && p_[q] >= '0' && p_[q] <= '9') {
      *v = *v * 10 + (p_[q] - '0');
      if (*v > 1'000'000) *v = 1'000'000;
      ++q;
    }
    return q > s;
  };
  int64_t lo = 0, hi = 0;
  bool has_lo = num(&lo);
  bool comma = q < p_.size() && p_[q] == ',';
  if (comma) ++q;
  bool has_hi = comma && num(&hi);
  if (q >= p_.size() || p_[q] != '}' || (!has_lo && !has_hi)) return false;
  if (!comma) hi = lo, has_hi = true;
  if (has_hi && hi < lo) fail("repetition range {" + std::to_string(lo) + "," + std::to_string(hi) + "} is reversed");
  if (lo > kMaxRepeat || (has_hi && hi > kMaxRepeat))
    fail("repetition count above " + std::to_string(kMaxRepeat));
  pos_ = q + 1;
  *min = static_cast<int32_t>(lo);
  *max = has_hi ? static_cast<int32_t>(hi) : kUnbounded;
  return true;
}

uint32_t Parser::parse_hex(size_t digits, bool braced) {
  uint32_t v = 0;
  size_t n = 0;
  while (!eof() && (braced || n < digits)) {
    char c = p_[pos_];
    if (braced && c == '}') break;
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) fail("invalid hex digit in escape");
    v = v * 16 + d;
    if (v > kMaxCp) fail("code point above U+10FFFF");
    ++pos_;
    ++n;
  }
  if (braced) {
    if (eof() || n == 0) fail("unterminated \\x{...} escape");
    ++pos_;
  } else if (n != digits) {
    fail("truncated hex escape");
  }
  if (v >= 0xD800 && v <= 0xDFFF) fail("escape names a surrogate code point");
  return v;
}

bool Parser::parse_class_escape(CpRanges* out) {
  char c = p_[pos_];
  CpRanges r;
  switch (c) {
    case 'd': case 'D': r = {{'0', '9'}}; break;
    case 'w': case 'W': r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; break;
    case 's': case 'S': r = {{'\t', '\r'}, {' ', ' '}}; break;
    case 'p': case 'P': {
      // \pL or \p{Name} / \p{^Name}; \P negates.
      size_t at = pos_++;
      std::string name;
      bool neg = c == 'P';
      if (eof()) { pos_ = at; fail("malformed \\p escape"); }
      if (p_[pos_] == '{') {
        size_t close = p_.find('}', pos_);
        if (close == std::string_view::npos) { pos_ = at; fail("unterminated \\p{...}"); }
        name = std::string(p_.substr(pos_ + 1, close - pos_ - 1));
        pos_ = close + 1;
        if (!name.empty() && name[0] == '^') neg = !neg, name = name.substr(1);
      } else {
        name = std::string(1, p_[pos_++]);
      }
      if (!unicode_class(name, &r)) {
        pos_ = at;
        fail("unknown Unicode property \\p{" + name + "} (general categories only; scripts are not supported)");
      }
      *out = neg ? negate(r) : r;
      return true;
    }
    default: return false;
  }
  ++pos_;
  *out = (c >= 'A' && c <= 'Z') ? negate(r) : r;
  return true;
}

uint32_t Parser::parse_escape_cp() {
  if (eof()) fail("pattern ends with a backslash");
  char c = p_[pos_++];
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return 7;
    case 'e': return 27;
    case '0': return 0;
    case 'x':
      if (!eof() && p_[pos_] == '{') { ++pos_; return parse_hex(0, true); }
      return parse_hex(2, false);
    case 'u':
      if (!eof() && p_[pos_] == '{') { ++pos_; return parse_hex(0, true); }
      return parse_hex(4, false);
    case 'U': return parse_hex(8, false);
    default: break;
  }
  --pos_;
  if (c >= '1' && c <= '9') fail("back-references are not supported");
  if (c == 'b' || c == 'B') fail("word boundaries (\\b, \\B) are not supported");
  if (c == 'k') fail("named back-references are not supported");
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(std::string("unknown escape \\") + c);
  size_t l;
  uint32_t cp = peek_cp(&l);
  pos_ += l;
  return cp;
}

CpRanges Parser::parse_class() {
  // At '['.
  ++pos_;
  bool neg = false;
  if (!eof() && p_[pos_] == '^') { neg = true; ++pos_; }
  CpRanges r;
  bool first = true;
  for (;;) {
    if (eof()) fail("unterminated character class");
    char c = p_[pos_];
    if (c == ']' && !first) { ++pos_; break; }
    first = false;
    if (c == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
      size_t close = p_.find(":]", pos_ + 2);
      if (close == std::string_view::npos) fail("unterminated POSIX class");
      std::string name(p_.substr(pos_ + 2, close - pos_ - 2));
      bool pneg = !name.empty() && name[0] == '^';
      if (pneg) name = name.substr(1);
      CpRanges pr;
      if (name == "alpha") pr = {{'A', 'Z'}, {'a', 'z'}};
      else if (name == "digit") pr = {{'0', '9'}};
      else if (name == "alnum") pr = {{'0', '9'}, {'A', 'Z'}, {'a', 'z'}};
      else if (name == "upper") pr = {{'A', 'Z'}};
      else if (name == "lower") pr = {{'a', 'z'}};
      else if (name == "space") pr = {{'\t', '\r'}, {' ', ' '}};
      else if (name == "xdigit") pr = {{'0', '9'}, {'A', 'F'}, {'a', 'f'}};
      else if (name == "punct") pr = {{'!', '/'}, {':', '@'}, {'[', '`'}, {'{', '~'}};
      else if (name == "word") pr = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      else if (name == "blank") pr = {{'\t', '\t'}, {' ', ' '}};
      else if (name == "cntrl") pr = {{0, 31}, {127, 127}};
      else if (name == "print") pr = {{32, 126}};
      else if (name == "graph") pr = {{33, 126}};
      else if (name == "ascii") pr = {{0, 127}};
      else fail("unknown POSIX class [:" + name + ":]");
      if (pneg) pr = negate(pr);
      r.insert(r.end(), pr.begin(), pr.end());
      pos_ = close + 2;
      continue;
    }
    if (c == '[') fail("nested character classes are not supported");
    if ((c == '&' || c == '-' || c == '~') && pos_ + 1 < p_.size() && p_[pos_ + 1] == c && c != '-')
      fail("character class set operations are not supported");
    uint32_t lo;
    if (c == '\\') {
      ++pos_;
      if (eof()) fail("unterminated character class");
      CpRanges cls;
      if (parse_class_escape(&cls)) {
        r.insert(r.end(), cls.begin(), cls.end());
        continue;
      }
      if (p_[pos_] == 'b') { ++pos_; lo = 8; }  // [\b] is backspace
      else lo = parse_escape_cp();
    } else {
      lo = next_cp();
    }
    uint32_t hi = lo;
    if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
      ++pos_;
      if (p_[pos_] == '\\') {
        ++pos_;
        CpRanges cls;
        if (!eof() && parse_class_escape(&cls)) fail("class escape as a range bound");
        hi = parse_escape_cp();
      } else {
        hi = next_cp();
      }
      if (hi < lo) fail("character class range is out of order");
    }
    r.push_back({lo, hi});
  }
  if (flags_.i) add_case_variants(r);
  return neg ? negate(r) : r;
}

int Parser::parse_group() {
  // At '('.
  size_t start = pos_++;
  Flags saved = flags_;
  if (!eof() && p_[pos_] == '?') {
    ++pos_;
    if (eof()) fail("unterminated group");
    char c = p_[pos_];
    if (c == '=' || c == '!') fail("look-ahead is not supported");
    if (c == '<' && pos_ + 1 < p_.size() && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!'))
      fail("look-behind is not supported");
    if (c == 'P' || c == '<' || c == '\'') {  // named group
      if (c == 'P') ++pos_;
      if (eof() || (p_[pos_] != '<' && p_[pos_] != '\'')) fail("malformed named group");
      char close = p_[pos_] == '<' ? '>' : '\'';
      size_t e = p_.find(close, pos_ + 1);
      if (e == std::string_view::npos || e == pos_ + 1) fail("malformed group name");
      pos_ = e + 1;
    } else if (c == ':') {
      ++pos_;
    } else {
      // Flags: (?imsx-imsx) or (?imsx-imsx:...)
      bool on = true, any = false;
      Flags f = flags_;
      while (!eof() && p_[pos_] != ')' && p_[pos_] != ':') {
        char fc = p_[pos_];
        if (fc == '-') { if (!on) fail("repeated '-' in flags"); on = false; }
        else if (fc == 'i') f.i = on;
        else if (fc == 's') f.s = on;
        else if (fc == 'm') f.m = on;
        else if (fc == 'x') f.x = on;
        else if (fc == 'U' || fc == 'u' || fc == 'R') {}  // greed swap / unicode / CRLF: no effect here
        else fail(std::string("unknown flag '") + fc + "'");
        any = true;
        ++pos_;
      }
      if (eof()) fail("unterminated flag group");
      if (!any && p_[pos_] == ')') fail("empty flag group");
      if (p_[pos_] == ')') {  // applies to the rest of the enclosing group
        ++pos_;
        flags_ = f;
        return -1;
      }
      ++pos_;
      flags_ = f;
    }
  }
  // The parser, the analysis and the lowering all recurse per group level: bound it.
  if (++group_depth_ > kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
  int inner = parse_alt();
  --group_depth_;
  if (eof() || p_[pos_] != ')') { pos_ = start; fail("unclosed group"); }
  ++pos_;
  flags_ = saved;
  return inner;
}

int Parser::parse_atom() {
  char c = p_[pos_];
  switch (c) {
    case '(': {
      size_t at = pos_;
      int g = parse_group();
      if (g < 0) {
        // flag group with no body: it changes flags_ for what follows in this sequence;
        // the caller restores flags at the group's end (parse_group saves them).
        (void)at;
      }
      return g;
    }
    case '[': return set_node(parse_class());
    case '.':
      ++pos_;
      return add(Node{.kind = Node::kSet, .set = flags_.s ? CpRanges{{0, kMaxCp}} : negate({{'\n', '\n'}})});
    case '^': ++pos_; return add(Node{.kind = flags_.m ? Node::kSeq : Node::kStart, .min = 1});
    case '$': ++pos_; return add(Node{.kind = flags_.m ? Node::kSeq : Node::kEnd, .min = 1});
    case '*': case '+': case '?': fail("quantifier with nothing to repeat");
    case '\\': {
      ++pos_;
      if (eof()) fail("pattern ends with a backslash");
      char e = p_[pos_];
      if (e == 'A') { ++pos_; return add(Node{.kind = Node::kStart}); }
      if (e == 'z') { ++pos_; return add(Node{.kind = Node::kEnd}); }
      if (e == 'Z') fail("\\Z is not supported");
      CpRanges cls;
      if (parse_class_escape(&cls)) return set_node(cls);
      uint32_t cp = parse_escape_cp();
      return set_node({{cp, cp}});
    }
    default: {
      uint32_t cp = next_cp();
      return set_node({{cp, cp}});
    }
  }
}

// Lowering. Anchor context: whether this point is the start (end) of the match on every path
// (kYes), on none (kNo) or only some (kMaybe: an anchor there is rejected as unsupported).
enum class At { kYes, kNo, kMaybe };

class Lowerer {
 public:
  Lowerer(GrammarBuilder& b, const std::vector<Node>& n, const RegexOptions& o, std::string_view p)
      : b_(b), n_(n), opt_(o), p_(p) {
    analyze();
  }
  ExprId lower(int id, At start, At end);
  bool has_anchor(int id) const { return anchor_[id]; }

 private:
  void analyze();
  ExprId set_expr(const CpRanges& r);
  [[noreturn]] void fail(const char* what) const {
    DI_THROW(GrammarError, "regex /", quoted(p_), "/: ", what);
  }
  GrammarBuilder& b_;
  const std::vector<Node>& n_;
  const RegexOptions& opt_;
  std::string_view p_;
  std::vector<bool> anchor_, empty_only_, never_empty_;  // per node
};

void Lowerer::analyze() {
  size_t k = n_.size();
  anchor_.assign(k, false);
  empty_only_.assign(k, false);
  never_empty_.assign(k, false);
  for (size_t i = 0; i < k; ++i) {  // children precede parents in the arena
    const Node& x = n_[i];
    switch (x.kind) {
      case Node::kSet: never_empty_[i] = true; break;
      case Node::kStart: case Node::kEnd: anchor_[i] = true; empty_only_[i] = true; break;
      case Node::kSeq:
        if (x.min == 1 && x.kids.empty()) fail("multi-line anchors are not supported");
        empty_only_[i] = true;
        for (int c : x.kids) {
          anchor_[i] = anchor_[i] || anchor_[c];
          empty_only_[i] = empty_only_[i] && empty_only_[c];
          never_empty_[i] = never_empty_[i] || never_empty_[c];
        }
        break;
      case Node::kAlt:
        empty_only_[i] = never_empty_[i] = true;
        for (int c : x.kids) {
          anchor_[i] = anchor_[i] || anchor_[c];
          empty_only_[i] = empty_only_[i] && empty_only_[c];
          never_empty_[i] = never_empty_[i] && never_empty_[c];
        }
        break;
      case Node::kRepeat:
        anchor_[i] = anchor_[x.kids[0]];
        empty_only_[i] = empty_only_[x.kids[0]] || x.max == 0;
        never_empty_[i] = x.min > 0 && never_empty_[x.kids[0]];
        break;
    }
  }
}

ExprId Lowerer::set_expr(const CpRanges& r) {
  if (!opt_.json_string) return b_.codepoints(r);
  // Inside a JSON string: '"', '\' and control characters appear escaped.
  CpRanges plain;
  std::vector<ExprId> alts;
  static const char* kShort[32] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   "b", "t", "n", nullptr, "f", "r"};
  for (auto [lo, hi] : r) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) {
      if (kShort[c]) {
        alts.push_back(b_.literal(std::string("\\") + kShort[c]));
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "%04x", c);
        std::vector<ExprId> hex;
        for (int k = 0; k < 4; ++k) {
          char ch = buf[k];
          hex.push_back(ch >= 'a' ? b_.bytes({{static_cast<uint8_t>(ch), static_cast<uint8_t>(ch)},
                                              {static_cast<uint8_t>(ch - 32), static_cast<uint8_t>(ch - 32)}})
                                  : b_.byte(static_cast<uint8_t>(ch)));
        }
        alts.push_back(b_.seq({b_.literal("\\u"), b_.seq(hex)}));
      }
    }
    uint32_t l = std::max<uint32_t>(lo, 0x20);
    if (l > hi) continue;
    for (uint32_t special : {uint32_t('"'), uint32_t('\\')}) {
      if (special >= l && special <= hi) alts.push_back(b_.literal(special == '"' ? "\\\"" : "\\\\"));
    }
    // plain = [l, hi] minus '"' and '\'
    uint32_t cur = l;
    for (uint32_t special : {uint32_t('"'), uint32_t('\\')}) {
      if (special >= cur && special <= hi) {
        if (special > cur) plain.push_back({cur, special - 1});
        cur = special + 1;
      }
    }
    if (cur <= hi) plain.push_back({cur, hi});
  }
  if (!plain.empty()) alts.push_back(b_.codepoints(plain));
  return b_.alt(std::move(alts));
}

ExprId Lowerer::lower(int id, At start, At end) {
  const Node& x = n_[id];
  switch (x.kind) {
    case Node::kSet: return set_expr(x.set);
    case Node::kStart:
    case Node::kEnd: {
      At at = x.kind == Node::kStart ? start : end;
      if (at == At::kYes) return b_.empty();
      if (at == At::kNo) return b_.nothing();
      fail(x.kind == Node::kStart ? "'^' in a position that is the start of only some matches is not supported"
                                  : "'$' in a position that is the end of only some matches is not supported");
    }
    case Node::kAlt: {
      std::vector<ExprId> alts;
      for (int c : x.kids) alts.push_back(lower(c, start, end));
      return b_.alt(std::move(alts));
    }
    case Node::kSeq: {
      std::vector<ExprId> parts;
      const size_t k = x.kids.size();
      std::vector<At> ends(k);
      At e = end;
      for (size_t i = k; i-- > 0;) {
        ends[i] = e;
        int c = x.kids[i];
        if (never_empty_[c]) e = At::kNo;
        else if (!empty_only_[c] && e != At::kNo) e = At::kMaybe;
      }
      At s = start;
      for (size_t i = 0; i < k; ++i) {
        int c = x.kids[i];
        parts.push_back(anchor_[c] ? lower(c, s, ends[i]) : lower(c, At::kNo, At::kNo));
        if (never_empty_[c]) s = At::kNo;
        else if (!empty_only_[c] && s != At::kNo) s = At::kMaybe;
      }
      return b_.seq(std::move(parts));
    }
    case Node::kRepeat: {
      const int c = x.kids[0];
      if (!anchor_[c]) return b_.repeat(lower(c, At::kNo, At::kNo), x.min, x.max);
      if (empty_only_[c]) return x.min == 0 ? b_.alt({b_.empty(), lower(c, start, end)}) : lower(c, start, end);
      if (x.max == 1) return x.min == 0 ? b_.alt({b_.empty(), lower(c, start, end)}) : lower(c, start, end);
      fail("anchors inside a repetition are not supported");
    }
  }
  return b_.nothing();
}

}  // namespace

ExprId json_string_char(GrammarBuilder& b) {
  ExprId plain = b.codepoints({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}});
  ExprId hex = b.bytes({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
  ExprId esc = b.seq({b.byte('\\'), b.alt({b.bytes({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'},
                                                     {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                            b.seq({b.byte('u'), hex, hex, hex, hex})})});
  return b.alt({plain, esc});
}

ExprId regex_to_expr(GrammarBuilder& b, std::string_view pattern, const RegexOptions& opt) {
  Parser parser(pattern, opt);
  int root = parser.parse();
  Lowerer low(b, parser.nodes, opt, pattern);
  if (!opt.search) return low.lower(root, At::kYes, At::kYes);
  // Unanchored search: any prefix and suffix. Where the pattern has anchors, split on whether
  // the prefix (suffix) is empty, so '^' ('$') is decidable in each branch.
  ExprId any_char = opt.json_string ? json_string_char(b) : b.codepoint_range(0, kMaxCp);
  ExprId any = b.star(any_char), some = b.plus(any_char);
  if (!low.has_anchor(root)) return b.seq({any, low.lower(root, At::kNo, At::kNo), any});
  std::vector<ExprId> alts;
  for (bool pre : {false, true})
    for (bool suf : {false, true})
      alts.push_back(b.seq({pre ? some : b.empty(), low.lower(root, pre ? At::kNo : At::kYes, suf ? At::kNo : At::kYes),
                            suf ? some : b.empty()}));
  return b.alt(std::move(alts));
}

}  // namespace deepinfer::structured
