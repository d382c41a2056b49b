// What the text grammar front ends share (GBNF: ebnf.cpp, Lark: lark.cpp): the source, the
// builder, the cursor, errors as "<dialect> LINE:COL: what", and rule references that may come
// before the rule's definition, remembered by first use so that an undefined rule is reported
// where it was first named.
#pragma once
#include <map>
#include <string>
#include <string_view>

#include "core/check.h"
#include "structured/grammar.h"

namespace deepinfer::structured {

class GrammarTextParser {
 protected:
  GrammarTextParser(std::string_view src, GrammarBuilder& b, const char* dialect)
      : s_(src), b_(b), dialect_(dialect) {}

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    DI_THROW(GrammarError, dialect_, " ", line, ":", col, ": ", what);
  }
  RuleId rule_ref(const std::string& name, size_t at) {
    RuleId r = b_.find_rule(name);
    if (r < 0) {
      r = b_.declare_rule(name);
      first_use_[r] = at;
    }
    return r;
  }

  std::string_view s_;
  GrammarBuilder& b_;
  size_t pos_ = 0;
  std::map<RuleId, size_t> first_use_;  // where each rule was first referenced

 private:
  const char* dialect_;  // "ebnf", "lark"
};

}  // namespace deepinfer::structured
