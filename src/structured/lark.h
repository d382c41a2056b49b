// Lark grammar text -> grammar, for {"ebnf": ...} when the text is Lark rather than GBNF
// (rules `name: ...` instead of `name ::= ...`). Errors: GrammarError "lark LINE:COL: what".
//
// Supported: rules and terminals (?rule, !rule, .priority accepted), "literals" (i flag),
// /regex/flags (imsx), "a".."z" ranges, ( ) groups, [ ] optional, ? * + ~n ~n..m, |
// alternatives continued on lines starting with '|', -> aliases (ignored), // comments,
// %import common.NAME [-> NEW] and %import common (A, B), %ignore. `start` is the start rule.
// Semantics are those of the grammar as a language over characters: %ignore'd text may
// appear before every token of a rule and at the end; lexer details (longest match,
// priorities, contextual lexing) do not restrict it. Templates, %declare, %override and
// other modules are errors.
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {
Grammar lark_to_grammar(std::string_view src);
// True when `src` reads as Lark (first definition uses ':' rather than '::=', or a %directive).
bool looks_like_lark(std::string_view src);
}  // namespace deepinfer::structured
