// Lark grammars through {"ebnf": ...}: rules, terminals, regex terminals, ranges, repetition,
// optional, aliases, %import common, %ignore, and errors with line:column positions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

std::shared_ptr<const CompiledGrammar> lark(const std::string& g) {
  GrammarCompiler c(byte_vocab());
  return c.compile_uncached(nlohmann::json{{"ebnf", g}}.dump());
}
std::string lark_error(const std::string& g) {
  try {
    lark(g);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(Lark, RulesTerminalsAndRepetition) {
  auto g = lark(R"(
// a tiny list language
start: "[" [items] "]"
?items: item ("," item)*
item: NUMBER -> num
    | WORD
    | "x"i ~ 2..3
NUMBER: /-?[0-9]+/
WORD: LETTER+
LETTER: "a".."z"
)");
  for (const char* ok : {"[]", "[1]", "[-12,abc]", "[xX,XXx]", "[a,b,c]"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"[", "[1,]", "[A]", "[X]", "[XxXx]", "[1 ,2]"}) EXPECT_FALSE(matches(g, bad)) << bad;
}

TEST(Lark, ImportCommonAndIgnore) {
  auto g = lark(R"(
start: pair ("," pair)*
pair: CNAME "=" value
value: SIGNED_NUMBER | ESCAPED_STRING
%import common.CNAME
%import common (SIGNED_NUMBER, ESCAPED_STRING, WS)
%ignore WS
)");
  for (const char* ok : {"a=1", "a = -1.5e3 , b_2=\"x\\\"y\"", " k=\"\" "}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"a=", "1=2", "a=\"x", "a=1,"}) EXPECT_FALSE(matches(g, bad)) << bad;
  auto h = lark("start: INT+\n%import common.INT -> INT\n");
  EXPECT_TRUE(matches(h, "123"));
  EXPECT_FALSE(matches(h, "12a"));
}

TEST(Lark, ErrorsHavePositions) {
  EXPECT_NE(lark_error("start: a\n").find("lark 1:8: undefined 'a'"), std::string::npos) << lark_error("start: a\n");
  EXPECT_NE(lark_error("start: \"x\"\nA: b\nb: \"y\"\n").find("lark 2:4"), std::string::npos);
  EXPECT_NE(lark_error("start: (\"x\"\n").find("lark 1:8"), std::string::npos) << lark_error("start: (\"x\"\n");
  EXPECT_NE(lark_error("start: x\n%declare X\n").find("%declare"), std::string::npos);
  EXPECT_NE(lark_error("start: \"a\" @\n").find("lark 1:12"), std::string::npos) << lark_error("start: \"a\" @\n");
  EXPECT_NE(lark_error("x: \"a\"\n").find("no 'start'"), std::string::npos);
  // GBNF text still goes to the GBNF parser.
  EXPECT_TRUE(matches(lark("root ::= \"a\" [0-9]+"), "a12"));
}

}  // namespace
}  // namespace deepinfer::structured::test
