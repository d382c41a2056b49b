// Keys under additionalProperties (json_schema_obj.cpp, key_not_in: any quoted string minus the
// quoted declared keys, one product automaton): a key is declared exactly when its bytes are
// the declared key's, whatever its prefixes share with other keys (ASCII, escapes, UTF-8).
#include <gtest/gtest.h>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

TEST(AdditionalKeys, DeclaredExactlyWhenSpelledSo) {
  const char* schema = R"({"json_schema":{"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"integer"},
      "é":{"type":"integer"},"a\"b":{"type":"integer"},"x\\y":{"type":"integer"}},"additionalProperties":{"type":"string"}}})";
  struct Case {
    const char* instance;
    bool valid;
  };
  const Case cases[] = {
      {R"({"a":1})", true},         {R"({"a":"s"})", false},      {R"({"ab":1})", true},       {R"({"ab":"s"})", false},
      {R"({"abc":"s"})", true},     {R"({"abc":1})", false},      {R"({"":"s"})", true},        {R"({"b":"s"})", true},
      {R"({"é":1})", true},         {R"({"é":"s"})", false},      {R"({"éa":"s"})", true},      {R"({"è":"s"})", true},
      {R"({"e":"s"})", true},       {R"({"a\"b":1})", true},      {R"({"a\"b":"s"})", false},   {R"({"a\"":"s"})", true},
      {R"({"a\"bc":"s"})", true},   {R"({"x\\y":1})", true},      {R"({"x\\y":"s"})", false},   {R"({"x\\":"s"})", true},
      {R"({"a\n":"s"})", true},     {R"({"a\u0062c":"s"})", true}, {R"({"中":"s"})", true},      {R"({"a":1,"q":"s","ab":2})", true},
      {R"({"a":1,"q":2})", false},
  };
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(schema);
  for (const Case& k : cases) EXPECT_EQ(matches(g, k.instance), k.valid) << k.instance;
}

}  // namespace
}  // namespace deepinfer::structured::test
