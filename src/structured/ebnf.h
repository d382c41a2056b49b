// GBNF (llama.cpp) grammar text -> grammar. Errors: GrammarError "ebnf LINE:COL: what".
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {
Grammar ebnf_to_grammar(std::string_view src);
}  // namespace deepinfer::structured
