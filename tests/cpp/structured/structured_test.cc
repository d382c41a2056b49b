// Unit tests: regex, EBNF, choice, matcher API (masks, rollback, forced bytes, stop tokens),
// error messages, and mask/accept consistency on a multi-byte synthetic vocabulary.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

#include "structured/compiled.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

std::shared_ptr<const CompiledGrammar> compile(const std::string& args) {
  GrammarCompiler c(byte_vocab());
  return c.compile_uncached(args);
}
std::string regex_args(const std::string& re) { return nlohmann::json{{"regex", re}}.dump(); }
bool re_match(const std::string& re, const std::string& s) { return matches(compile(regex_args(re)), s); }

TEST(Regex, Basics) {
  EXPECT_TRUE(re_match("a+b", "aaab"));
  EXPECT_FALSE(re_match("a+b", "b"));
  EXPECT_TRUE(re_match("(ab|cd){2,3}", "abcdab"));
  EXPECT_FALSE(re_match("(ab|cd){2,3}", "ab"));
  EXPECT_TRUE(re_match("[^a-c]x", "dx"));
  EXPECT_TRUE(re_match("\\d{3}-\\w+", "123-ab_c"));
  EXPECT_TRUE(re_match("(?i)hello", "HeLLo"));
  EXPECT_TRUE(re_match("^abc$", "abc"));
  EXPECT_TRUE(re_match(".", "\xC3\xA9"));       // one code point, two bytes
  EXPECT_FALSE(re_match(".", "\xC3"));           // half a character
  EXPECT_TRUE(re_match("[α-ω]+", "αβγ"));
  EXPECT_FALSE(re_match("a|^b", "cb"));
}

TEST(Regex, ErrorsNameTheOffset) {
  for (const char* bad : {"(ab", "a{3,2}", "[b-a]", "(?=x)", "\\1", "a**b)", "\\p{Greek}"}) {
    try {
      compile(regex_args(bad));
      ADD_FAILURE() << "compiled: " << bad;
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find("regex"), std::string::npos) << e.what();
    }
  }
  try {
    compile(regex_args("ab(c"));
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
  }
}

TEST(Ebnf, GbnfGrammar) {
  const char* g = R"(root ::= "[" item ("," item)* "]"
item ::= [0-9]+ | "\"" [a-z]* "\""   # comment
)";
  auto cg = compile(nlohmann::json{{"ebnf", g}}.dump());
  EXPECT_TRUE(matches(cg, "[1,\"ab\",22]"));
  EXPECT_FALSE(matches(cg, "[1,]"));
}

TEST(Ebnf, RecursionAndErrors) {
  auto cg = compile(nlohmann::json{{"ebnf", "root ::= \"(\" root \")\" | \"x\""}}.dump());
  EXPECT_TRUE(matches(cg, "((x))"));
  EXPECT_FALSE(matches(cg, "((x)"));
  auto expect_err = [](const std::string& g, const std::string& needle) {
    try {
      compile(nlohmann::json{{"ebnf", g}}.dump());
      ADD_FAILURE() << "compiled: " << g;
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_err("root ::= foo", "1:10: undefined rule 'foo'");
  expect_err("root ::= \"a", "unterminated string");
  expect_err("root ::= root \"a\" | \"b\"", "left recursion");
  expect_err("start ::= \"a\"", "no 'root' rule");
  expect_err("root ::= \"a\"\nroot ::= \"b\"", "2:1: rule 'root' defined twice");
}

TEST(JsonSchema, NumberBoundsDatesAndDrafts) {
  auto g = compile(R"({"json_schema": {"type": "number", "minimum": 0, "maximum": 1}})");
  for (const char* ok : {"0", "0.5", "1", "1.0", "0.999"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"-0.5", "--0.5", "1.5", "2", "-1"}) EXPECT_FALSE(matches(g, bad)) << bad;
  auto neg = compile(R"({"json_schema": {"type": "number", "minimum": -2, "exclusiveMaximum": 0}})");
  for (const char* ok : {"-2", "-1.5", "-0.1", "-1"}) EXPECT_TRUE(matches(neg, ok)) << ok;
  for (const char* bad : {"0", "-2.5", "0.1", "--1"}) EXPECT_FALSE(matches(neg, bad)) << bad;
  auto date = compile(R"({"json_schema": {"type": "string", "format": "date"}})");
  EXPECT_TRUE(matches(date, "\"2024-02-29\""));
  EXPECT_FALSE(matches(date, "\"2023-02-29\""));
  EXPECT_FALSE(matches(date, "\"2022-04-31\""));
  auto d4 = compile(R"({"json_schema": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}})");
  EXPECT_FALSE(matches(d4, "1.0"));
  EXPECT_TRUE(matches(compile(R"({"json_schema": {"type": "integer"}})"), "1.0"));
}

std::shared_ptr<const CompiledGrammar> schema(const std::string& s) { return compile("{\"json_schema\": " + s + "}"); }
void expect_lang(const std::shared_ptr<const CompiledGrammar>& g, std::initializer_list<const char*> ok,
                 std::initializer_list<const char*> bad) {
  for (const char* x : ok) EXPECT_TRUE(matches(g, x)) << x;
  for (const char* x : bad) EXPECT_FALSE(matches(g, x)) << x;
}

TEST(JsonSchema, PatternPropertiesAndPropertyNames) {
  expect_lang(schema(R"({"type": "object", "properties": {"id": {"type": "integer"}},
                        "patternProperties": {"^x-": {"type": "string"}, "[0-9]": {"type": "boolean"}},
                        "additionalProperties": false})"),
              {R"({})", R"({"id":1,"x-a":"s"})", R"({"a1":true})"},  // "x-1" needs string and boolean
              {R"({"other":1})", R"({"x-a":1})", R"({"a1":"s"})", R"({"x-1":true})", R"({"x-1":"s"})"});
  // A declared name matching a pattern must satisfy both schemas.
  expect_lang(schema(R"({"properties": {"ab": {"type": "integer"}}, "patternProperties": {"^a": {"minimum": 5}}})"),
              {R"({"ab":7})", R"({"ac":"s"})", R"({"b":1})"}, {R"({"ab":3})", R"({"ac":2})"});
  expect_lang(schema(R"({"type": "object", "propertyNames": {"maxLength": 2}})"),
              {R"({"ab":1})", R"({})"}, {R"({"abc":1})"});
}

TEST(JsonSchema, StringIntersections) {
  expect_lang(schema(R"({"type": "string", "pattern": "^a", "maxLength": 3, "minLength": 2})"),
              {R"("ab")", R"("abc")", R"("a\"")"}, {R"("a")", R"("abcd")", R"("ba")"});
  expect_lang(schema(R"({"type": "string", "format": "uri", "pattern": "^https?://"})"),
              {R"("https://x.org")"}, {R"("ftp://x.org")", R"("https://a b")"});
}

TEST(JsonSchema, PropertyCounts) {
  expect_lang(schema(R"({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1, "maxProperties": 2})"),
              {R"({"a":1})", R"({"b":1,"a":2})", R"({"c":1,"a":2})"}, {R"({})", R"({"a":1,"b":2,"c":3})"});
  expect_lang(schema(R"({"required": ["n"], "additionalProperties": {"type": "string"}, "minProperties": 3})"),
              {R"({"n":"x","a":"y","b":"z"})", R"({"a":"y","n":"x","b":"z","c":"w"})"}, {R"({"n":"x","a":"y"})"});
}

// A small object (<= 3 properties, any order) with a heavy member (a 254-character string)
// keeps its members as rules: one copy of the string, not one per order of the keys.
TEST(JsonSchema, HeavyMembersOfSmallObjectsStayRules) {
  const std::string heavy =
      R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9a-f]{4}$"},
          "n": {"type": "integer"}, "msg": {"type": "string", "maxLength": 254}}, "required": ["id", "msg"]})";
  const std::string light =
      R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9a-f]{4}$"},
          "n": {"type": "integer"}, "msg": {"type": "string", "maxLength": 25}}, "required": ["id", "msg"]})";
  const auto g = schema(heavy);
  const std::string m254(254, 'x'), m255(255, 'x');
  for (const std::string& msg : {m254, std::string("a\\\"b")}) {
    EXPECT_TRUE(matches(g, R"({"id":"0a9f","msg":")" + msg + R"("})")) << msg.size();
    EXPECT_TRUE(matches(g, R"({"msg":")" + msg + R"(","n":-3,"id":"beef"})")) << msg.size();
    EXPECT_TRUE(matches(g, R"({"n":7,"msg":")" + msg + R"(","id":"0000"})")) << msg.size();
  }
  EXPECT_FALSE(matches(g, R"({"id":"0a9f","msg":")" + m255 + R"("})"));
  EXPECT_FALSE(matches(g, R"({"msg":"x","n":1})"));
  EXPECT_FALSE(matches(g, R"({"id":"0a9f","msg":"x","id":"0a9f"})"));
  EXPECT_FALSE(matches(g, R"({"id":"0A9F","msg":"x"})"));
  // Members as rules: the heavy object's automaton holds the string once (inlined it was one
  // copy per order context, over 4x the light one's states).
  const size_t heavy_states = g->impl().pda.num_states(), light_states = schema(light)->impl().pda.num_states();
  EXPECT_LT(heavy_states, 2 * light_states + 2 * 254 * 4) << heavy_states << " vs " << light_states;
  EXPECT_GT(g->impl().pda.rule_start.size(), schema(light)->impl().pda.rule_start.size());
}

TEST(JsonSchema, OneOfNotAndFilteredEnums) {
  // Overlapping regular branches: exactly one must match ({} matches both).
  expect_lang(schema(R"({"type": "object", "oneOf": [
                          {"properties": {"a": {"type": "string"}}, "additionalProperties": false},
                          {"properties": {"b": {"type": "string"}}, "additionalProperties": false}]})"),
              {R"({"a":"x"})", R"({"b":"y"})"}, {R"({})", R"({"a":"x","b":"y"})"});
  expect_lang(schema(R"({"oneOf": [{"type": "integer", "multipleOf": 2}, {"type": "integer", "multipleOf": 3}]})"),
              {"2", "3", "4", "9"}, {"6", "12", "1"});
  expect_lang(schema(R"({"not": {"type": ["string", "object"]}})"), {"1", "null", "[]"}, {R"("s")", "{}"});
  expect_lang(schema(R"({"enum": [1, "a", {"k": 2}, 7], "not": {"type": "string"}, "maximum": 5})"),
              {"1", R"({"k":2})"}, {R"("a")", "7"});
  expect_lang(schema(R"({"allOf": [{"enum": [{"bar": {}, "foo": 1}]}, {"not": {"properties": {"foo": {"type": "integer"}}}}]})"),
              {}, {R"({"bar":{},"foo":1})"});
  EXPECT_THROW(schema(R"({"oneOf": [{"type": "object"}, {"minProperties": 1}]})"), GrammarError);
  EXPECT_THROW(schema(R"({"not": {"uniqueItems": true}})"), GrammarError);
}

TEST(Choice, Exact) {
  auto cg = compile(R"({"choice": ["yes", "no", "maybe"]})");
  EXPECT_TRUE(matches(cg, "no"));
  EXPECT_FALSE(matches(cg, "n"));
}

TEST(SoArgs, BadInput) {
  EXPECT_THROW(compile("{"), InvalidArgument);
  EXPECT_THROW(compile(R"({"regex": "a", "ebnf": "b"})"), InvalidArgument);
  EXPECT_THROW(compile(R"({"json_schema": "{not json"})"), GrammarError);
  try {
    compile(R"({"json_schema": {"properties": {"a": {"not": {"uniqueItems": true}}}}})");
    ADD_FAILURE();
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("#/properties/a/not"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'not'"), std::string::npos) << e.what();
  }
}

TEST(Compile, PathologicalGrammarIsBounded) {
  // (a|b)*a(a|b){n}: the DFA has 2^n states; must fail fast instead of hanging.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(compile(regex_args("(a|b)*a(a|b){40}")), GrammarError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// A vocabulary with multi-byte tokens, so masks exercise the trie and the uncertain walk.
std::shared_ptr<const TokenVocabulary> multi_vocab() {
  static auto v = [] {
    TokenizerInfo info;
    for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",\"", "\"}", "true", "false", "null", "12", "3.5", "\":\"", "ab", "abc",
                          "\"a", "a\"", "},{", "[{", "}]", "\\n", "\\\"", "é", "\xC3", "1,", "\"b\":", " {", "{}", "[]"})
      info.token_bytes.push_back(t);
    info.token_bytes.push_back("<eos>");
    info.stop_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
    info.token_bytes.push_back("<special>");
    info.special_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
    return make_vocabulary(info);
  }();
  return v;
}

// Walks random allowed tokens to termination: every allowed token must be accepted, must not
// lead to a dead state, and the final text must match the grammar.
void random_walks(const std::string& args, int walks, int max_steps) {
  GrammarCompiler c(multi_vocab());
  auto g = c.compile_uncached(args);
  const auto& v = *multi_vocab();
  std::mt19937 rng(7);
  std::vector<int32_t> words((v.vocab_size() + 31) / 32);
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(g);
    std::string text;
    for (int step = 0; step < max_steps && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(words);
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v.vocab_size(); ++t)
        if (words[t >> 5] >> (t & 31) & 1) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty()) << "dead state after " << text;
      // Prefer stopping late in the walk so texts stay short.
      int32_t pick = allowed[rng() % allowed.size()];
      if (step > max_steps / 2 && m.can_terminate()) pick = v.stop_ids()[0];
      for (int32_t t : allowed) {  // every allowed token is accepted (then undone)
        ASSERT_TRUE(m.accept_token(t)) << "mask allowed " << t << " after " << text;
        m.rollback(1);
      }
      ASSERT_TRUE(m.accept_token(pick));
      if (!v.is_stop(pick)) text += v.bytes(pick);
    }
    if (m.is_terminated()) { EXPECT_TRUE(matches(compile(args), text)) << text; }
  }
}

TEST(Matcher, RandomWalksStayInLanguage) {
  random_walks(regex_args("(ab|abc)+\"?[0-9]{1,3}"), 20, 30);
  random_walks(R"({"json_schema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]}})", 20, 40);
  random_walks(R"({"json_object": true})", 20, 40);
  random_walks(R"({"json_schema": {"type": "array", "items": {"type": "boolean"}}, "whitespace": "flexible"})", 10, 40);
}

TEST(Matcher, RollbackStopAndForced) {
  GrammarCompiler c(multi_vocab());
  auto g = c.compile_uncached(R"({"json_schema": {"type": "object", "properties": {"name": {"const": "bob"}}, "required": ["name"], "additionalProperties": false}})");
  GrammarMatcher m(g);
  EXPECT_EQ(m.forced_bytes(), "{\"name\":\"bob\"}");
  const auto& v = *multi_vocab();
  int32_t eos = v.stop_ids()[0];
  EXPECT_FALSE(m.accept_token(eos));
  EXPECT_FALSE(m.accept_token(eos + 1));  // special token
  ASSERT_TRUE(m.accept_bytes("{\"name\""));
  EXPECT_EQ(m.forced_bytes(), ":\"bob\"}");
  ASSERT_TRUE(m.accept_bytes(":\"bob\"}"));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_TRUE(m.accept_token(eos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token('a'));
  m.rollback(2);
  EXPECT_EQ(m.num_accepted(), 1);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_EQ(m.forced_bytes(), ":\"bob\"}");
  auto forced = m.forced_tokens(8);
  std::string joined;
  for (int32_t t : forced) joined += v.bytes(t);
  EXPECT_EQ(std::string(":\"bob\"}").substr(0, joined.size()), joined);
}

}  // namespace
}  // namespace deepinfer::structured::test

namespace deepinfer::structured::test {
namespace {

// Long and multi-byte tokens: subtrees that stay inside one DFA state (string bodies, digit
// runs), tokens crossing rule ends, and UTF-8 split across tokens.
std::shared_ptr<const TokenVocabulary> walk_vocab() {
  static auto v = [] {
    TokenizerInfo info;
    for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"hello", "hello world", "name", "names", "na", "nam\"", "name\":", "\":\"", "\",\"", "abc",
                          "abcabc", "aaaa", "12", "123", "1234", "12.5", "1e5", "\"}", "}}", "]}", "\"a\":1,", "é",
                          "éé", "\xC3", "\xA9x", "\\n", "\\u00e9", "true,", "null}", "{\"", "[{\"", "  ", "    "})
      info.token_bytes.push_back(t);
    info.token_bytes.push_back("<eos>");
    info.stop_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
    return make_vocabulary(info);
  }();
  return v;
}

// utf8_below_ bit 0: every path below the node is valid UTF-8 from a character boundary (a
// truncated last character allowed); a stray continuation byte or a surrogate spoils it.
TEST(MaskWalk, Utf8BelowFlags) {
  TokenizerInfo info;
  for (const char* t : {"a", "a\xC3\xA9", "a\xE4\xB8", "b", "b\xA9", "c", "c\xED\xA0\x80", "d", "d\xED\x9F\xBF"})
    info.token_bytes.push_back(t);
  auto v = make_vocabulary(info);
  auto ok = [&](int32_t id) { return v->utf8_below_[v->node_of_[id]] & 1; };
  EXPECT_TRUE(ok(0));   // a: é, and a truncated 3-byte character
  EXPECT_FALSE(ok(3));  // b: a lone continuation byte
  EXPECT_FALSE(ok(5));  // c: a surrogate (ED A0 80)
  EXPECT_TRUE(ok(7));   // d: U+D7FF
}

std::vector<int32_t> accepted_set(const StateMaskCache& c) {
  std::vector<int32_t> out = c.accepted_ids;
  for (size_t w = 0; w < c.accepted_bits.size(); ++w)
    for (int b = 0; b < 32; ++b)
      if (c.accepted_bits[w] >> b & 1) out.push_back(static_cast<int32_t>(w * 32 + b));
  std::sort(out.begin(), out.end());
  return out;
}

// The fast mask walk (single-state steps, whole-subtree acceptance) equals its plain twin on
// every state of grammars with calls, escapes, string bodies and numbers.
TEST(MaskWalk, FastEqualsReference) {
  GrammarCompiler c(walk_vocab());
  for (const char* args :
       {R"({"json_object": true})",
        R"({"json_schema": {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "number"}}, "required": ["name"]}})",
        R"({"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}})",
        R"({"json_schema": {"type": "array", "items": {"enum": ["abc", "hello", 12]}}, "whitespace": "flexible"})",
        R"({"regex": "(ab|abc)+\"?[0-9]{1,3}"})", R"({"regex": "[a-z ]*(é|x)+"})",
        R"({"ebnf": "root ::= \"[\" v (\",\" v)* \"]\"\nv ::= [0-9]+ | \"\\\"\" [a-z]* \"\\\"\" | root"})"}) {
    auto g = c.compile_uncached(args);
    const CompiledGrammarImpl& impl = g->impl();
    for (int32_t s = 0; s < static_cast<int32_t>(impl.pda.num_states()); ++s) {
      auto fast = impl.compute_state_cache(s);
      auto ref = impl.compute_state_cache_reference(s);
      ASSERT_EQ(accepted_set(*fast), accepted_set(*ref)) << args << " state " << s;
      ASSERT_EQ(fast->uncertain, ref->uncertain) << args << " state " << s;
    }
  }
}

}  // namespace
}  // namespace deepinfer::structured::test
