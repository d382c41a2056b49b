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

  // `<[id]>` at pos_ (checked by the caller: s_[pos_] == '<'): special token `id` as a terminal.
  ExprId special_token_ref() {
    const size_t at = pos_;
    if (s_.substr(pos_, 2) != "<[") fail(at, "expected a special token <[id]>");
    pos_ += 2;
    int64_t id = 0;
    const size_t digits = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9' && id <= kMaxTerminalId) id = id * 10 + (s_[pos_++] - '0');
    if (pos_ == digits || s_.substr(pos_, 2) != "]>") fail(at, "expected a special token <[id]> with a decimal id");
    if (id > kMaxTerminalId) fail(at, "special token id above " + std::to_string(kMaxTerminalId));
    pos_ += 2;
    return b_.special_token(static_cast<int32_t>(id));
  }

  std::string_view s_;
  GrammarBuilder& b_;
  size_t pos_ = 0;
  std::map<RuleId, size_t> first_use_;  // where each rule was first referenced

 private:
  const char* dialect_;  // "ebnf", "lark"
};

}  // namespace deepinfer::structured
