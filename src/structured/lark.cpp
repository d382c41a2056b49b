// Lark grammar text -> grammar (the subset that describes a language; see lark.h).
//
// Definitions run to the end of the line; a following line starting with '|' continues the
// alternatives, and newlines inside () and [] are plain whitespace. Rules (lowercase names,
// optional ?/! prefix, optional .priority) may use rules and terminals; terminals (uppercase
// names) only terminals. `start` is the start rule.
#include "structured/lark.h"

#include <cctype>
#include <map>
#include <set>
#include <string>

#include "core/check.h"
#include "core/json.h"
#include "structured/grammar_text.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

namespace deepinfer::structured {
namespace {

// The terminals of Lark's common.lark that `%import common.NAME` may name, in Lark syntax
// (written here for this parser; lazy regexes and look-behind replaced by plain forms).
const std::map<std::string, std::string> kCommon = {
    {"DIGIT", R"("0".."9")"},
    {"HEXDIGIT", R"("a".."f" | "A".."F" | "0".."9")"},
    {"INT", R"(DIGIT+)"},
    {"SIGNED_INT", R"(["+" | "-"] INT)"},
    {"DECIMAL", R"(INT "." INT? | "." INT)"},
    {"_EXP", R"(("e" | "E") SIGNED_INT)"},
    {"FLOAT", R"(INT _EXP | DECIMAL _EXP?)"},
    {"SIGNED_FLOAT", R"(["+" | "-"] FLOAT)"},
    {"NUMBER", R"(FLOAT | INT)"},
    {"SIGNED_NUMBER", R"(["+" | "-"] NUMBER)"},
    {"ESCAPED_STRING", R"(/"([^"\\\n]|\\.)*"/)"},
    {"LCASE_LETTER", R"("a".."z")"},
    {"UCASE_LETTER", R"("A".."Z")"},
    {"LETTER", R"(UCASE_LETTER | LCASE_LETTER)"},
    {"WORD", R"(LETTER+)"},
    {"CNAME", R"(("_" | LETTER) ("_" | LETTER | DIGIT)*)"},
    {"WS_INLINE", R"((" " | /\t/)+)"},
    {"WS", R"(/[ \t\f\r\n]/+)"},
    {"CR", R"(/\r/)"},
    {"LF", R"(/\n/)"},
    {"NEWLINE", R"((CR? LF)+)"},
    {"SH_COMMENT", R"(/#[^\n]*/)"},
    {"CPP_COMMENT", R"(/\/\/[^\n]*/)"},
    {"C_COMMENT", R"(/\/\*([^*]|\*+[^*\/])*\*+\//)"},
    {"SQL_COMMENT", R"(/--[^\n]*/)"},
};

bool is_terminal_name(const std::string& n) {
  size_t i = n[0] == '_' ? 1 : 0;
  return i < n.size() && n[i] >= 'A' && n[i] <= 'Z';
}

class LarkParser : GrammarTextParser {
 public:
  LarkParser(std::string_view src, GrammarBuilder& b, const JsonGrammarOptions& json)
      : GrammarTextParser(src, b, "lark"), json_(json) {}
  Grammar parse();

 private:
  bool eof() const { return pos_ >= s_.size(); }
  // Skips blanks and // comments; newlines too when `nl` (inside brackets) is set.
  void skip(bool nl) {
    while (!eof()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) { ++pos_; continue; }
      if (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/') {
        while (!eof() && s_[pos_] != '\n') ++pos_;
        continue;
      }
      break;
    }
  }
  // At a newline: true (and past it) when the next non-blank line continues with '|'.
  bool continues() {
    size_t save = pos_;
    skip(true);
    if (!eof() && s_[pos_] == '|') return true;
    pos_ = save;
    return false;
  }
  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }
  std::string name() {
    size_t st = pos_;
    while (!eof() && name_char(s_[pos_])) ++pos_;
    if (st == pos_) fail(pos_, "expected a name");
    return std::string(s_.substr(st, pos_ - st));
  }
  void definition();
  void directive();
  void import_common(const std::string& n, const std::string& as, size_t at);
  ExprId expansions(int depth, bool nested);
  ExprId sequence(int depth, bool nested);
  ExprId item(int depth, bool nested);
  ExprId atom(int depth, bool nested);
  ExprId string_literal(size_t at, std::string* raw);
  ExprId regexp(size_t at);
  ExprId json_schema(size_t at);
  ExprId token(ExprId e) { return in_rule_ ? b_.seq({ignore_ref(), e}) : e; }
  ExprId ignore_ref() {
    if (ignore_rule_ < 0) ignore_rule_ = b_.declare_rule("%ignore");
    return b_.ref(ignore_rule_);
  }

  const JsonGrammarOptions& json_;
  bool in_rule_ = false;  // lowering a rule (tokens may be preceded by ignored text)
  RuleId ignore_rule_ = -1;
  std::vector<ExprId> ignored_;
  std::set<RuleId> defined_;
};

uint32_t utf8_cp(std::string_view s, size_t* pos) {
  unsigned char c = static_cast<unsigned char>(s[*pos]);
  size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n && *pos + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  *pos += n;
  return cp;
}

// "text" (Python string escapes), optionally followed by the i flag. *raw gets the code points
// of a one-character literal for ranges ("a".."z").
ExprId LarkParser::string_literal(size_t at, std::string* raw) {
  ++pos_;
  std::vector<uint32_t> cps;
  while (!eof() && s_[pos_] != '"') {
    if (s_[pos_] == '\n') fail(at, "unterminated string literal");
    if (s_[pos_] != '\\') {
      cps.push_back(utf8_cp(s_, &pos_));
      continue;
    }
    if (++pos_ >= s_.size()) fail(at, "unterminated string literal");
    char e = s_[pos_++];
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int i = 0; i < n; ++i) {
        char c = pos_ < s_.size() ? s_[pos_++] : '?';
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) fail(pos_ - 1, "invalid hex digit in escape");
        v = v * 16 + d;
      }
      return v;
    };
    switch (e) {
      case 'n': cps.push_back('\n'); break;
      case 't': cps.push_back('\t'); break;
      case 'r': cps.push_back('\r'); break;
      case 'f': cps.push_back('\f'); break;
      case 'v': cps.push_back('\v'); break;
      case '0': cps.push_back(0); break;
      case 'x': cps.push_back(hex(2)); break;
      case 'u': cps.push_back(hex(4)); break;
      case 'U': cps.push_back(hex(8)); break;
      case '"': case '\\': case '\'': cps.push_back(static_cast<uint32_t>(e)); break;
      default: cps.push_back('\\'); cps.push_back(static_cast<uint32_t>(static_cast<unsigned char>(e)));  // Python keeps unknown escapes
    }
  }
  if (eof()) fail(at, "unterminated string literal");
  ++pos_;
  bool fold = !eof() && s_[pos_] == 'i' && (pos_ + 1 >= s_.size() || !name_char(s_[pos_ + 1]));
  if (fold) ++pos_;
  if (raw) *raw = cps.size() == 1 ? std::to_string(cps[0]) : "";
  std::vector<ExprId> parts;
  for (uint32_t cp : cps) {
    std::vector<std::pair<uint32_t, uint32_t>> r{{cp, cp}};
    if (fold && cp < 128 && std::isalpha(static_cast<int>(cp))) r.push_back({cp ^ 0x20, cp ^ 0x20});
    parts.push_back(b_.codepoints(r));
  }
  return b_.seq(std::move(parts));
}

// /pattern/flags, Python re syntax as far as the regex module supports it.
ExprId LarkParser::regexp(size_t at) {
  ++pos_;
  std::string pat;
  while (!eof() && s_[pos_] != '/') {
    if (s_[pos_] == '\n') fail(at, "unterminated regular expression");
    if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) {
      if (s_[pos_ + 1] != '/') pat += '\\';
      pat += s_[pos_ + 1];
      pos_ += 2;
      continue;
    }
    pat += s_[pos_++];
  }
  if (eof()) fail(at, "unterminated regular expression");
  ++pos_;
  RegexOptions o;
  while (!eof() && std::string_view("imsxlu").find(s_[pos_]) != std::string_view::npos) {
    char f = s_[pos_++];
    if (f == 'i') o.case_insensitive = true;
    if (f == 's') o.dot_all = true;
    if (f == 'm') o.multi_line = true;
    if (f == 'x') o.verbose = true;
  }
  try {
    return regex_to_expr(b_, pat, o);
  } catch (const GrammarError& e) {
    fail(at, e.what());
  }
}

// %json { schema }: the braces' extent is found by a scan that skips strings, then the text is
// parsed (depth-bounded) and lowered as a JSON schema into this grammar.
ExprId LarkParser::json_schema(size_t at) {
  pos_ += 5;
  skip(true);
  if (eof() || s_[pos_] != '{') fail(at, "%json needs a JSON schema object: %json { ... }");
  const size_t start = pos_;
  int depth = 0;
  bool in_string = false;
  for (; pos_ < s_.size(); ++pos_) {
    const char c = s_[pos_];
    if (in_string) {
      if (c == '\\') ++pos_;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      ++pos_;
      break;
    }
  }
  if (depth != 0) fail(at, "%json: unterminated JSON schema");
  nlohmann::ordered_json schema;
  std::string why;
  if (!parse_json_bounded(s_.substr(start, pos_ - start), schema, &why)) fail(at, "%json: the schema is not valid JSON: " + why);
  // llguidance's per-schema options: {"x-guidance": {"whitespace_flexible": true}}.
  JsonGrammarOptions opt = json_;
  if (schema.is_object() && schema.contains("x-guidance")) {
    const nlohmann::ordered_json& g = schema["x-guidance"];
    if (!g.is_object()) fail(at, "%json: x-guidance must be an object");
    for (auto it = g.begin(); it != g.end(); ++it) {
      if (it.key() != "whitespace_flexible" || !it.value().is_boolean())
        fail(at, "%json: x-guidance supports only whitespace_flexible (a boolean), got '" + it.key() + "'");
      opt.flexible_whitespace = it.value().get<bool>();
    }
    schema.erase("x-guidance");
  }
  try {
    Grammar g = json_schema_to_grammar(schema, opt);
    const RuleId first = b_.num_rules();
    const ExprId e = b_.embed(g);
    for (RuleId r = first; r < b_.num_rules(); ++r) defined_.insert(r);  // complete: not the Lark text's to define
    return e;
  } catch (const GrammarError& e) {
    fail(at, std::string("%json: ") + e.what());
  }
}

ExprId LarkParser::atom(int depth, bool nested) {
  if (depth > 200) fail(pos_, "nesting too deep");
  size_t at = pos_;
  char c = s_[pos_];
  if (c == '(' || c == '[') {
    ++pos_;
    ExprId e = expansions(depth + 1, true);
    skip(true);
    char close = c == '(' ? ')' : ']';
    if (eof() || s_[pos_] != close) fail(at, std::string("unclosed '") + c + "'");
    ++pos_;
    return c == '[' ? b_.opt(e) : e;
  }
  if (c == '"') {
    std::string lo;
    ExprId e = string_literal(at, &lo);
    size_t save = pos_;
    skip(nested);
    if (s_.substr(pos_, 2) == "..") {  // "a".."z"
      pos_ += 2;
      skip(nested);
      std::string hi;
      if (eof() || s_[pos_] != '"') fail(pos_, "expected a string after '..'");
      size_t hat = pos_;
      string_literal(hat, &hi);
      if (lo.empty() || hi.empty()) fail(at, "a range needs one-character strings");
      uint32_t a = static_cast<uint32_t>(std::stoul(lo)), z = static_cast<uint32_t>(std::stoul(hi));
      if (z < a) fail(at, "range out of order");
      return token(b_.codepoint_range(a, z));
    }
    pos_ = save;
    return token(e);
  }
  if (c == '/') return token(regexp(at));
  if (c == '<') return token(special_token_ref());
  if (c == '%' && s_.substr(pos_, 5) == "%json") return token(json_schema(at));
  if (name_char(c)) {
    std::string n = name();
    if (!eof() && s_[pos_] == '{') fail(at, "templates are not supported");
    if (!in_rule_ && !is_terminal_name(n)) fail(at, "terminal refers to rule '" + n + "'");
    ExprId r = b_.ref(rule_ref(n, at));
    return is_terminal_name(n) ? token(r) : r;
  }
  fail(at, std::string("unexpected '") + c + "'");
}

ExprId LarkParser::item(int depth, bool nested) {
  ExprId a = atom(depth, nested);
  for (;;) {
    size_t save = pos_;
    skip(nested);
    if (eof() || s_[pos_] != '~') pos_ = save;
    if (eof()) break;
    char q = s_[pos_];
    if (q == '*') { ++pos_; a = b_.star(a); }
    else if (q == '+') { ++pos_; a = b_.plus(a); }
    else if (q == '?') { ++pos_; a = b_.opt(a); }
    else if (q == '~') {
      size_t at = pos_++;
      skip(nested);
      auto num = [&]() {
        size_t st = pos_;
        int64_t v = 0;
        while (!eof() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) v = std::min<int64_t>(v * 10 + (s_[pos_++] - '0'), 1 << 20);
        if (st == pos_) fail(pos_, "expected a number after '~'");
        return v;
      };
      int64_t lo = num(), hi = lo;
      if (s_.substr(pos_, 2) == "..") { pos_ += 2; hi = num(); }
      if (hi < lo) fail(at, "repetition range out of order");
      if (hi > 10000) fail(at, "repetition count above 10000");
      a = b_.repeat(a, static_cast<int32_t>(lo), static_cast<int32_t>(hi));
    } else {
      break;
    }
  }
  return a;
}

ExprId LarkParser::sequence(int depth, bool nested) {
  std::vector<ExprId> items;
  for (;;) {
    skip(nested);
    if (eof() || s_[pos_] == '|' || s_[pos_] == ')' || s_[pos_] == ']' || s_[pos_] == '\n') break;
    if (s_.substr(pos_, 2) == "->") {  // alias: names the tree node, not part of the language
      pos_ += 2;
      skip(false);
      name();
      continue;
    }
    items.push_back(item(depth, nested));
  }
  return b_.seq(std::move(items));
}

ExprId LarkParser::expansions(int depth, bool nested) {
  std::vector<ExprId> alts{sequence(depth, nested)};
  for (;;) {
    if (!eof() && s_[pos_] == '\n' && !nested && !continues()) break;
    if (eof() || s_[pos_] != '|') break;
    ++pos_;
    alts.push_back(sequence(depth, nested));
  }
  return b_.alt(std::move(alts));
}

void LarkParser::import_common(const std::string& n, const std::string& as, size_t at) {
  auto it = kCommon.find(n);
  if (it == kCommon.end()) fail(at, "unknown terminal common." + n);
  RuleId r = rule_ref(as, at);
  if (defined_.count(r)) return;
  defined_.insert(r);
  // Parse the library text in place: a sub-parser sharing the builder and rule table.
  LarkParser sub(it->second, b_, json_);
  sub.first_use_ = first_use_;
  sub.defined_ = defined_;
  ExprId body = sub.expansions(0, true);
  if (!sub.eof()) fail(at, "internal: bad common." + n);
  for (const auto& [rr, p] : sub.first_use_)
    if (!first_use_.count(rr)) first_use_[rr] = at;
  b_.define_rule(r, body);
  // Terminals the definition names come from common too.
  const std::string& text = it->second;
  for (const auto& [dep, unused] : kCommon) {
    RuleId d = b_.find_rule(dep);
    if (d < 0 || defined_.count(d)) continue;
    for (size_t k = text.find(dep); k != std::string::npos; k = text.find(dep, k + 1)) {
      bool word = (k == 0 || !name_char(text[k - 1])) && (k + dep.size() == text.size() || !name_char(text[k + dep.size()]));
      if (word) {
        import_common(dep, dep, at);
        break;
      }
    }
  }
}

void LarkParser::directive() {
  size_t at = pos_++;
  std::string d = name();
  skip(false);
  if (d == "ignore") {
    bool saved = in_rule_;
    in_rule_ = false;
    ignored_.push_back(expansions(0, false));
    in_rule_ = saved;
    return;
  }
  if (d != "import") fail(at, "directive %" + d + " is not supported");
  size_t mat = pos_;
  std::string mod = name();
  if (mod != "common") fail(mat, "only %import common.* is supported");
  if (!eof() && s_[pos_] == '.') {
    ++pos_;
    size_t nat = pos_;
    std::string n = name();
    skip(false);
    std::string as = n;
    if (s_.substr(pos_, 2) == "->") {
      pos_ += 2;
      skip(false);
      as = name();
    }
    import_common(n, as, nat);
    return;
  }
  skip(false);
  if (eof() || s_[pos_] != '(') fail(pos_, "expected '.' or '(' after %import common");
  ++pos_;
  for (;;) {
    skip(true);
    size_t nat = pos_;
    std::string n = name();
    import_common(n, n, nat);
    skip(true);
    if (!eof() && s_[pos_] == ',') { ++pos_; continue; }
    if (!eof() && s_[pos_] == ')') { ++pos_; break; }
    fail(pos_, "expected ',' or ')' in %import list");
  }
}

void LarkParser::definition() {
  size_t at = pos_;
  if (s_[pos_] == '?' || s_[pos_] == '!') ++pos_;
  std::string n = name();
  if (!eof() && s_[pos_] == '.') {  // priority: affects lexing order only
    ++pos_;
    if (!eof() && s_[pos_] == '-') ++pos_;
    while (!eof() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  if (!eof() && s_[pos_] == '{') fail(at, "templates are not supported");
  skip(false);
  if (eof() || s_[pos_] != ':') fail(pos_, "expected ':' after '" + n + "'");
  ++pos_;
  RuleId r = rule_ref(n, at);
  if (defined_.count(r)) fail(at, "'" + n + "' defined twice");
  defined_.insert(r);
  in_rule_ = !is_terminal_name(n);
  b_.define_rule(r, expansions(0, false));
  in_rule_ = false;
}

Grammar LarkParser::parse() {
  for (;;) {
    skip(true);
    if (eof()) break;
    size_t at = pos_;
    if (s_[pos_] == '%') directive();
    else definition();
    skip(false);
    if (!eof() && s_[pos_] != '\n') fail(pos_, std::string("unexpected '") + s_[pos_] + "'");
    if (pos_ == at) fail(at, "no progress");
  }
  for (RuleId r = 0; r < b_.num_rules(); ++r)
    if (!defined_.count(r) && r != ignore_rule_) fail(first_use_[r], "undefined '" + b_.rule(r).name + "'");
  if (ignore_rule_ >= 0) b_.define_rule(ignore_rule_, b_.star(b_.alt(ignored_)));
  RuleId start = b_.find_rule("start");
  if (start < 0) fail(0, "no 'start' rule");
  RuleId root = b_.declare_rule("root");
  b_.define_rule(root, b_.seq({b_.ref(start), ignore_rule_ >= 0 ? b_.ref(ignore_rule_) : b_.empty()}));
  return std::move(b_).finish(root);
}

}  // namespace

Grammar lark_to_grammar(std::string_view src, const JsonGrammarOptions& json) {
  GrammarBuilder b;
  LarkParser p(src, b, json);
  return p.parse();
}

Grammar lark_to_grammar(std::string_view src) { return lark_to_grammar(src, JsonGrammarOptions{}); }

bool looks_like_lark(std::string_view src) {
  // GBNF defines rules with '::='; Lark with ':' (or starts with a %directive).
  size_t i = 0;
  while (i < src.size()) {
    char c = src[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') { ++i; continue; }
    if (c == '#') return false;
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') ++i;
      continue;
    }
    if (c == '%') return true;
    size_t j = i;
    if (src[j] == '?' || src[j] == '!') return true;
    while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_' || src[j] == '-' || src[j] == '.')) ++j;
    while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
    return j < src.size() && src[j] == ':' && src.substr(j, 3) != "::=";
  }
  return false;
}

}  // namespace deepinfer::structured
