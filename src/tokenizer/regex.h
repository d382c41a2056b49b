// A compiled PCRE2 pattern (UTF + UCP, JIT when available) that lists all non-overlapping
// matches in a subject, the way HF tokenizers' Split does with Oniguruma.
// Thread-safe: the compiled code is shared, match data is per thread.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::tok {

class Regex {
 public:
  // Throws TokenizerError naming `where` (e.g. "pre_tokenizer.pretokenizers[2].pattern") when the
  // pattern does not compile. Oniguruma-only syntax is translated first (see translate_onig).
  Regex(const std::string& pattern, const std::string& where);
  static Regex literal(const std::string& text, const std::string& where);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  ~Regex();
  Regex clone() const;

  // Appends [begin, end) byte offsets (relative to subject) of all non-empty matches, in order.
  // The subject must be valid UTF-8 (checked by the caller once per text).
  void find_all(std::string_view subject, std::vector<std::pair<uint32_t, uint32_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;  // as given (before translation)
  std::string where_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Rewrites constructs whose meaning differs between Oniguruma (HF) and PCRE2: `\s` also matches
// U+0085 in Oniguruma. Exposed for tests.
std::string translate_onig(const std::string& pattern);

}  // namespace deepinfer::tok
