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
// Extensions (llguidance's spelling): `<[id]>` names special token `id` as a terminal;
// `%json { schema }` in a rule matches a JSON value valid under the schema (JSON Schema as
// structured/json_schema.h lowers it, with `json`'s whitespace and format options; the schema
// may set {"x-guidance": {"whitespace_flexible": true}} for itself, as in llguidance).
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {
struct JsonGrammarOptions;
Grammar lark_to_grammar(std::string_view src);
Grammar lark_to_grammar(std::string_view src, const JsonGrammarOptions& json);
// True when `src` reads as Lark (first definition uses ':' rather than '::=', or a %directive).
bool looks_like_lark(std::string_view src);
}  // namespace deepinfer::structured
