// GBNF (llama.cpp) grammar text -> grammar. Errors: GrammarError "ebnf LINE:COL: what".
// Text that reads as Lark (rules `name: ...`) goes to lark_to_grammar (lark.h).
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {
struct JsonGrammarOptions;
Grammar ebnf_to_grammar(std::string_view src);
// `json`: options of the JSON schemas a Lark grammar embeds with %json.
Grammar ebnf_to_grammar(std::string_view src, const JsonGrammarOptions& json);
}  // namespace deepinfer::structured
