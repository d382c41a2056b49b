#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/check.h"

namespace deepinfer::tok {

namespace {
// Code points Oniguruma (Unicode 16) classifies that PCRE2 10.42 (Unicode 14) does not.
const char* unicode_delta(char cls) {
#define DI_UNICODE_DELTA(C, RANGES) \
  if (cls == #C[0]) return RANGES;
#include "tokenizer/unicode_delta.inc"
#undef DI_UNICODE_DELTA
  return nullptr;
}
}  // namespace

std::string translate_onig(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if ((n == 'p' || n == 'P') && i + 4 < p.size() + 1 && p.compare(i + 2, 1, "{") == 0 &&
                 i + 4 < p.size() && p[i + 4] == '}' && unicode_delta(p[i + 3]) &&
                 (n == 'p' || !in_class)) {
        // \p{L} and friends: add the newer code points so classes agree with HF.
        std::string cls = std::string("\\p{") + p[i + 3] + "}" + unicode_delta(p[i + 3]);
        out += in_class ? cls : (n == 'p' ? "[" : "[^") + cls + "]";
        i += 3;
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

static void* compile(const std::string& pat, const std::string& where, bool* jit) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    DI_THROW(TokenizerError, where, ": regex does not compile at offset ", off, ": ",
             reinterpret_cast<const char*>(buf), " (pattern ", pat, ")");
  }
  *jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return code;
}

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern), where_(where) {
  code_ = compile(translate_onig(pattern), where, &jit_);
}

Regex Regex::literal(const std::string& text, const std::string& where) {
  std::string quoted = "\\Q";
  // \Q..\E cannot contain \E; split it out.
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "\\E") == 0) {
      quoted += "\\E\\\\E\\Q";
      ++i;
    } else {
      quoted += text[i];
    }
  }
  quoted += "\\E";
  return Regex(quoted, where);
}

Regex::Regex(Regex&& o) noexcept : pattern_(std::move(o.pattern_)), where_(std::move(o.where_)), code_(o.code_), jit_(o.jit_) {
  o.code_ = nullptr;
}
Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
    pattern_ = std::move(o.pattern_);
    where_ = std::move(o.where_);
    code_ = o.code_;
    jit_ = o.jit_;
    o.code_ = nullptr;
  }
  return *this;
}
Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}
Regex Regex::clone() const { return Regex(pattern_, where_); }

namespace {
// One match-data block per thread serves every pattern: we only read group 0.
struct ThreadMatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(md); }
};
}  // namespace

void Regex::find_all(std::string_view s, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
  thread_local ThreadMatchData tmd;
  auto* code = static_cast<pcre2_code*>(code_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  PCRE2_SIZE pos = 0;
  while (pos <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), pos, 0, tmd.md, nullptr)
                  : pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, tmd.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0 && rc != 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      DI_THROW(TokenizerError, where_, ": regex match failed: ", reinterpret_cast<const char*>(buf));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tmd.md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(uint32_t(b), uint32_t(e));
      pos = e;
    } else {
      // Empty match: skip one code point, as Oniguruma's iterator does.
      pos = b;
      if (pos >= s.size()) return;
      ++pos;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace deepinfer::tok
