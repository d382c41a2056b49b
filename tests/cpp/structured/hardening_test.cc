// Hostile inputs get a named error within their budget: nesting that a recursive walk would
// follow into a stack overflow (regex groups, JSON values, chained or mutually entered rules,
// matcher stacks), compile time limits that fire, and error text that is valid UTF-8 even
// when it quotes part of a multi-byte character.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

using json = nlohmann::ordered_json;

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// The error's message (and that it is of type E), or "" when nothing was thrown.
template <class E>
std::string error_of(const std::string& args, double time_limit_ms = 5000) {
  CompilerOptions o;
  o.time_limit_ms = time_limit_ms;
  GrammarCompiler c(byte_vocab(), o);
  try {
    c.compile_uncached(args);
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(Hardening, RegexNestedGroups) {
  const std::string re = std::string(100000, '(') + "a" + std::string(100000, ')');
  const std::string m = error_of<GrammarError>(json{{"regex", re}}.dump());
  EXPECT_NE(m.find("nested deeper than 1000"), std::string::npos) << m.substr(0, 200);
  EXPECT_LE(m.size(), 2100u);  // the quoted pattern is cut
  // Within the limit: compiles and matches.
  const std::string ok = std::string(500, '(') + "ab" + std::string(500, ')');
  GrammarCompiler c(byte_vocab());
  EXPECT_TRUE(matches(c.compile_uncached(json{{"regex", ok}}.dump()), "ab"));
}

TEST(Hardening, DeepJsonValues) {
  std::string deep = std::string(100000, '[') + "1" + std::string(100000, ']');
  // An enum value, a const, and so_args nested that deep.
  for (const std::string& args : {R"({"json_schema": {"enum": [)" + deep + "]}}",
                                  R"({"json_schema": {"const": )" + deep + "}}",
                                  R"({"json_schema": {"type": "object", "x": )" + deep + "}}"}) {
    const std::string m = error_of<InvalidArgument>(args);
    EXPECT_NE(m.find("nests deeper than 512 levels"), std::string::npos) << m.substr(0, 200);
  }
  // A json_schema given as a string is measured too.
  const std::string m = error_of<GrammarError>(json{{"json_schema", "{\"enum\": [" + deep + "]}"}}.dump());
  EXPECT_NE(m.find("nests deeper than 512 levels"), std::string::npos) << m.substr(0, 200);
  // Deep but within the limit: an enum value 100 levels deep compiles and matches exactly.
  const std::string v100 = std::string(100, '[') + "1" + std::string(100, ']');
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(R"({"json_schema": {"enum": [)" + v100 + "]}}");
  EXPECT_TRUE(matches(g, v100));
  EXPECT_FALSE(matches(g, std::string(100, '[') + "2" + std::string(100, ']')));
}

TEST(Hardening, ChainedAndMutuallyEnteredRules) {
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 100000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r100000 ::= \"x\"\n";
  std::string m = error_of<GrammarError>(json{{"ebnf", chain}}.dump(), 60000);
  EXPECT_NE(m.find("nesting too deep"), std::string::npos) << m.substr(0, 200);
  // A cycle of 5,000 rules, each entering the next before any byte: recursive, so not inlined.
  std::string cycle = "root ::= r0\n";
  for (int i = 0; i < 5000; ++i) cycle += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  cycle += "r5000 ::= \"x\" r0 | \"y\"\n";
  m = error_of<GrammarError>(json{{"ebnf", cycle}}.dump(), 60000);
  EXPECT_NE(m.find("rules entered one inside another"), std::string::npos) << m.substr(0, 200);
}

TEST(Hardening, MatcherStackDepthIsBounded) {
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(R"({"json_schema": {"type": "array"}})");
  GrammarMatcher m(g);
  int accepted = 0;
  for (int i = 0; i < 20000 && m.accept_bytes("["); ++i) ++accepted;
  EXPECT_GT(accepted, 500);     // ordinary nesting works
  EXPECT_LT(accepted, 20000);   // but not without end: the stack limit rejects
  std::vector<int32_t> words(9);
  m.fill_next_token_bitmask(words);  // still answers at the limit
  EXPECT_FALSE(words[91 >> 5] >> (91 & 31) & 1);  // no deeper '['
  EXPECT_TRUE(words[93 >> 5] >> (93 & 31) & 1);   // ']' closes
}

TEST(Hardening, TimeLimitFires) {
  json s = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 3000; ++i)
    s["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"pattern", "^[a-z]{2,8}[0-9]{1,3}$"}};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = error_of<GrammarError>(json{{"json_schema", s}}.dump(), 5);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(m.find("time limit"), std::string::npos) << m.substr(0, 200);
  EXPECT_LT(ms, 2000);
}

TEST(Hardening, ErrorTextIsValidUtf8) {
  for (const char* args : {R"({"ebnf": "root ::= é"})", R"({"regex": "(?é)a"})", R"({"regex": "[é-a]"})",
                           R"({"json_schema": {"type": "é"}})", R"({"ebnf": "root ::= \"a\" é"})"}) {
    std::string m = error_of<GrammarError>(args);
    if (m.empty()) m = error_of<InvalidArgument>(args);
    ASSERT_FALSE(m.empty()) << args;
    EXPECT_TRUE(valid_utf8(m)) << args << " -> " << m;
  }
  // A malformed so_args whose bytes are not UTF-8 at all.
  const std::string bad = std::string("{\"regex\": \"") + "\xC3" + "\"}";
  const std::string m = error_of<InvalidArgument>(bad);
  ASSERT_FALSE(m.empty());
  EXPECT_TRUE(valid_utf8(m)) << m;
}

// Found by fuzz_so_args (tests/fuzz/regressions/so_args/raw_number_overflow): a number past
// double's range made nlohmann throw out_of_range, which escaped compile() untyped. Now a
// GrammarError naming the field, whether in so_args itself or in a schema given as text.
TEST(Hardening, NumberPastDoubleRangeIsANamedGrammarError) {
  GrammarCompiler c(byte_vocab());
  auto message = [&](const std::string& args) -> std::string {
    try {
      c.compile(args);
    } catch (const GrammarError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("untyped: ") + e.what();
    }
    return "accepted";
  };
  std::string m = message(R"({"json_schema": {"type": "number", "maximum": 1e999}})");
  EXPECT_NE(m.find("field 'json_schema.maximum'"), std::string::npos) << m;
  EXPECT_NE(m.find("outside the range of a double"), std::string::npos) << m;
  m = message(json{{"json_schema", R"({"type": "number", "minimum": -1e999})"}}.dump());
  EXPECT_NE(m.find("json_schema: field 'minimum'"), std::string::npos) << m;
  m = message(json{{"json_schema", "1e999"}}.dump());  // the Python API's so_args={"json": "1e999"}
  EXPECT_NE(m.find("outside the range of a double"), std::string::npos) << m;
  EXPECT_TRUE(valid_utf8(m)) << m;
  // Within range: compiles.
  EXPECT_NO_THROW(c.compile(R"({"json_schema": {"type": "number", "maximum": 1e3}})"));
}

// Fuzz finding 5 (so_args, 2026-12-02): a number where a subschema belongs, under `contains` or
// inside an allOf that the lowering merges, escaped as nlohmann's untyped invalid_iterator.
TEST(Hardening, NonSchemaSubschemaIsANamedGrammarError) {
  for (const char* schema : {R"({"contains": 1.0})", R"({"type": "array", "contains": 1})",
                             R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "contains": 1.0})",
                             R"({"allOf": [{"type": "object"}, 1]})", R"({"allOf": [1, {"type": "object"}]})",
                             R"({"type": "array", "contains": "x"})"}) {
    const std::string m = error_of<GrammarError>(json{{"json_schema", json::parse(schema)}}.dump());
    EXPECT_NE(m.find("a schema must be an object or a boolean"), std::string::npos) << schema << ": " << m;
  }
  // Booleans stay schemas.
  GrammarCompiler c(byte_vocab());
  EXPECT_NO_THROW(c.compile(R"({"json_schema": {"type": "array", "contains": true}})"));
}

// so_args fuzzing, finding 6: a $ref whose percent-escape is not two hex digits ("#/$def%s/item")
// let std::stoi's untyped invalid_argument escape the compile; an array index past 2^64 in a $ref
// pointer did the same through std::stoul's out_of_range. Both are named GrammarErrors now.
TEST(Hardening, BadRefEscapeOrIndexIsANamedGrammarError) {
  const std::string defs = R"("$defs": {"item": {"type": "integer"}}, "prefixItems": [true, {"type": "string"}])";
  for (const char* ref : {"#/$def%s/item", "#/$defs/it%zzem", "#/$defs%/item", "#/prefixItems/99999999999999999999999"}) {
    const std::string schema = "{" + defs + R"(, "type": "array", "items": {"$ref": ")" + ref + "\"}}";
    const std::string m = error_of<GrammarError>(json{{"json_schema", json::parse(schema)}}.dump());
    EXPECT_NE(m.find("$ref"), std::string::npos) << ref << ": " << m;
  }
  // Well-formed escapes and indices still resolve.
  GrammarCompiler c(byte_vocab());
  EXPECT_NO_THROW(c.compile(json{{"json_schema", json::parse("{" + defs + R"(, "type": "array", "items": {"$ref": "#/%24defs/item"}})")}}.dump()));
  EXPECT_NO_THROW(c.compile(json{{"json_schema", json::parse("{" + defs + R"(, "type": "array", "items": {"$ref": "#/prefixItems/1"}})")}}.dump()));
}

}  // namespace
}  // namespace deepinfer::structured::test
