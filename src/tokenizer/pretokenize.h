// Normalizers and pre-tokenizers of a byte-level tokenizer.json, applied the way HF tokenizers
// does: each step splits every current piece independently (a regex never sees past its piece).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace deepinfer::tok {

// A piece of the (normalized) text: bytes [begin, end); prefix_space means a ' ' is prepended
// (ByteLevel add_prefix_space).
struct Piece {
  uint32_t begin, end;
  bool prefix_space;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  Regex regex;             // what a match is
  SplitBehavior behavior;  // what happens to matches
  bool invert;             // matches are the pieces to keep apart from (HF `invert`)
};

struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = true;  // split with the GPT-2 pattern first
};

// A chain of Split steps followed by at most one ByteLevel step (which must come last).
class PreTokenizer {
 public:
  std::vector<SplitStep> splits;
  std::optional<ByteLevelStep> byte_level;
  std::unique_ptr<Regex> gpt2_regex;  // used when byte_level->use_regex

  // Splits text[0..n) into pieces, appended to `out` (offsets relative to `text`).
  void run(std::string_view text, std::vector<Piece>& out) const;
  PreTokenizer clone() const;
};

// Normalizer chain (the subset byte-level tokenizers use). Applied to text between added tokens.
struct NormalizerStep {
  enum Kind { kPrepend, kReplace, kStripLeft, kStripRight } kind;
  std::string text;                // Prepend: prefix; Replace: replacement
  std::unique_ptr<Regex> pattern;  // Replace: what to replace
};
struct Normalizer {
  std::vector<NormalizerStep> steps;
  bool empty() const { return steps.empty(); }
  std::string run(std::string_view text) const;
  Normalizer clone() const;
};

extern const char* const kGpt2Pattern;

}  // namespace deepinfer::tok
