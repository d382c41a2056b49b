// The forced tool-call grammar accepts exactly what the chat template renders for an
// assistant's tool calls (tokenized by the bundled model's tokenizer, the DSML marker as the
// special token), follows the function's schema, and the parser reads back the arguments.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#include "deepinfer/tokenizer.h"
#include "server/chat_parser.h"
#include "server/tool_grammar.h"

namespace deepinfer::server {
namespace {
using nlohmann::json;

std::string source_dir() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return s ? s : ".";
}

struct Fixture {
  Tokenizer tok = Tokenizer::from_file(source_dir() + "/assets/default-model/tokenizer.json");
  int32_t marker = *tok.token_to_id("｜DSML｜");
  structured::GrammarCompiler compiler{[&] {
    structured::TokenizerInfo info = structured::tokenizer_info_from(tok);
    info.terminal_ids = {marker};
    return structured::make_vocabulary(info);
  }()};
  // The DSML block the V4 template renders for these calls (what a model trained on it writes).
  std::string rendered_block(const std::vector<ToolCall>& calls) {
    Message u, a;
    u.role = "user";
    u.content = "hi";
    a.role = "assistant";
    a.tool_calls = calls;
    std::vector<Message> m = {u, a};
    ChatOptions o;
    o.add_generation_prompt = false;
    const std::string p = tok.apply_chat_template(m, o);
    const size_t s = p.find("\n\n<｜DSML｜tool_calls>");
    const std::string end = "</｜DSML｜tool_calls>";
    const size_t e = p.find(end);
    EXPECT_NE(s, std::string::npos) << p;
    return p.substr(s, e + end.size() - s);
  }
  bool accepts(const std::string& grammar, const std::string& text) {
    auto g = compiler.compile(json{{"ebnf", grammar}}.dump());
    structured::GrammarMatcher m(g);
    for (int32_t id : tok.encode(text))
      if (!m.accept_token(id)) return false;
    return m.can_terminate();
  }
};

const json kWeather = json::parse(R"({"type": "object", "properties": {
  "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "units": {"enum": ["c", "f"]}},
  "required": ["city", "days"]})");

TEST(ToolGrammar, AcceptsTheTemplatesBlockAndFollowsTheSchema) {
  Fixture f;
  const std::vector<ToolSpec> tools = {{"get_weather", kWeather}, {"now", json()}};
  const std::string g = dsml_tool_grammar(tools, true, DsmlSyntax::v4(), f.marker);
  const std::string block = f.rendered_block({{"", "get_weather", R"({"city": "Paris <b>", "days": 3, "units": "c"})"},
                                              {"", "now", "{}"}});
  EXPECT_TRUE(f.accepts(g, block)) << block;
  EXPECT_TRUE(f.accepts(g, f.rendered_block({{"", "get_weather", R"({"city": "Rome", "days": 10})"}})));
  // Schema violations: a missing required parameter, a string where an integer goes, a value
  // outside the enum, an unknown function.
  EXPECT_FALSE(f.accepts(g, f.rendered_block({{"", "get_weather", R"({"city": "Rome"})"}})));
  EXPECT_FALSE(f.accepts(g, f.rendered_block({{"", "get_weather", R"({"city": "Rome", "days": "3"})"}})));
  EXPECT_FALSE(f.accepts(g, f.rendered_block({{"", "get_weather", R"({"city": "Rome", "days": 0})"}})));
  EXPECT_FALSE(f.accepts(g, f.rendered_block({{"", "get_weather", R"({"city": "R", "days": 2, "units": "k"})"}})));
  EXPECT_FALSE(f.accepts(g, f.rendered_block({{"", "other", "{}"}})));
  // The marker spelled as text (no special token) is not the block.
  EXPECT_FALSE(f.accepts(g, "\n\n<|DSML|tool_calls>"));
}

TEST(ToolGrammar, NamedAndSingleCall) {
  Fixture f;
  const std::string one = dsml_tool_grammar({{"get_weather", kWeather}}, false, DsmlSyntax::v4(), f.marker);
  const std::string call = R"({"city": "Oslo", "days": 1})";
  EXPECT_TRUE(f.accepts(one, f.rendered_block({{"", "get_weather", call}})));
  EXPECT_FALSE(f.accepts(one, f.rendered_block({{"", "get_weather", call}, {"", "get_weather", call}})));
}

TEST(ToolGrammar, ParserReadsTheArgumentsBack) {
  Fixture f;
  const std::string block = f.rendered_block({{"", "get_weather", R"({"city": "Paris", "days": 3, "units": "f"})"}});
  ChatOutputParser p(ChatParserOptions{});
  ChatDelta d = p.feed(block);
  d.append(p.finish());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.content.empty()) << d.content;
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(d.tool_calls[0].arguments), json::parse(R"({"city": "Paris", "days": 3, "units": "f"})"));
}

TEST(ToolGrammar, V41Block) {
  Fixture f;
  Message u, a;
  u.role = "user";
  u.content = "hi";
  a.role = "assistant";
  a.tool_calls = {{"", "get_weather", R"({"city": "Lima", "days": 2})"}};
  std::vector<Message> m = {u, a};
  ChatOptionsV41 o;
  o.add_generation_prompt = false;
  const std::string p = f.tok.apply_chat_template_v41(m, o);
  const size_t s = p.find("\n\n<｜DSML｜ calls>"), e = p.find("</｜DSML｜ calls>");
  ASSERT_NE(s, std::string::npos) << p;
  const std::string block = p.substr(s, e + std::string("</｜DSML｜ calls>").size() - s);
  const std::string g41 = dsml_tool_grammar({{"get_weather", kWeather}}, true, DsmlSyntax::v41(), f.marker);
  EXPECT_TRUE(f.accepts(g41, block)) << block;
  // The formats reject each other.
  const std::string g4 = dsml_tool_grammar({{"get_weather", kWeather}}, true, DsmlSyntax::v4(), f.marker);
  EXPECT_FALSE(f.accepts(g4, block));
  ChatParserOptions po;
  po.syntax = DsmlSyntax::v41();
  ChatOutputParser parser(po);
  ChatDelta d = parser.feed(block);
  d.append(parser.finish());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(json::parse(d.tool_calls[0].arguments), json::parse(R"({"city": "Lima", "days": 2})"));
}

TEST(ToolGrammar, RefusesNamesDsmlCannotCarry) {
  EXPECT_THROW(dsml_tool_grammar({{"bad\"name", json()}}, true, DsmlSyntax::v4(), 7), InvalidArgument);
  json schema = {{"type", "object"}, {"properties", {{"a<b", {{"type", "string"}}}}}};
  EXPECT_THROW(dsml_tool_grammar({{"f", schema}}, true, DsmlSyntax::v4(), 7), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::server
