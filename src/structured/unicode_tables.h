// Unicode general categories as code point ranges (generated: unicode_tables.cpp, by
// gen_unicode_tables.py from Python's unicodedata). Cn (unassigned) and Cs (surrogates) are
// not listed; regex \p{C} / \p{Cn} derive Cn as the complement of every listed category.
#pragma once
#include <cstddef>
#include <cstdint>

namespace deepinfer::structured {

struct UnicodeCategoryTable {
  const char* name;         // two-letter category, e.g. "Lu"
  const uint32_t* ranges;   // [2 * num_ranges] inclusive (lo, hi) pairs, ascending
  size_t num_ranges;
};

extern const UnicodeCategoryTable kUnicodeCategories[];
extern const size_t kNumUnicodeCategories;
extern const char* const kUnicodeVersion;

}  // namespace deepinfer::structured
