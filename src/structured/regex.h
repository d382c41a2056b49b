// Regex -> grammar expression. Syntax: the common core of Rust `regex`, PCRE and ECMAScript:
// literals, escapes (\n \t \xHH \x{...} \uHHHH \u{...}), classes with ranges/negation/POSIX
// [:alpha:], \d \w \s (ASCII, as in ECMAScript), \p{..} / \P{..} Unicode general categories
// (unicode_tables.cpp; scripts are errors), ., groups (capturing, named, non-capturing,
// flag groups (?imsx-imsx) and (?i:...)), | and quantifiers * + ? {n} {n,} {n,m} (lazy forms
// accepted: they do not change the language). ^ $ \A \z are supported where their meaning is
// fixed (the start/end of every path); look-around, back-references, \b are compile
// errors naming the offset.
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {

struct RegexOptions {
  bool case_insensitive = false;
  bool dot_all = false;     // . matches \n too
  bool multi_line = false;  // ^ $ at line boundaries (only supported at the pattern's ends)
  bool verbose = false;     // x flag: whitespace and # comments ignored
  // Emit characters as they appear inside a JSON string literal (", \ and control characters
  // escaped the way a compact JSON serializer writes them).
  bool json_string = false;
  bool search = false;  // unanchored: the match may start/end anywhere (JSON Schema `pattern`)
};

// Throws GrammarError("regex ...: <what> at offset N").
ExprId regex_to_expr(GrammarBuilder& b, std::string_view pattern, const RegexOptions& opt);

// Code point set of "any character" for the JSON string mode helper below.
ExprId json_string_char(GrammarBuilder& b);  // one JSON string character (any escape form)

}  // namespace deepinfer::structured
