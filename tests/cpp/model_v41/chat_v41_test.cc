// The DeepSeek-V4.1 chat format (Tokenizer::apply_chat_template_v41, src/tokenizer/chat_dsv41.cpp)
// against expectations written out by hand from encoding/encoding.py's rules (and, for the mid-
// conversation system case and the DSML shapes, the strings public ports of it test against).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "deepinfer/error.h"
#include "deepinfer/tokenizer.h"
#include "test_util.h"

namespace deepinfer {
namespace {

const std::string kBos = "<｜begin▁of▁sentence｜>", kEos = "<｜end▁of▁sentence｜>";
const std::string kEffort = " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

const Tokenizer* tok() {
  static std::unique_ptr<Tokenizer> t = [] {
    const char* s = std::getenv("DEEPINFER_SHARED_DIR");
    const std::filesystem::path p = std::filesystem::path(s ? s : (v41_test::source_dir() / ".." / "shared").string()) /
                                    "data" / "tokenizers" / "deepseek-v3" / "tokenizer.json";
    return std::filesystem::exists(p) ? std::make_unique<Tokenizer>(Tokenizer::from_file(p.string())) : nullptr;
  }();
  return t.get();
}
#define REQUIRE_TOKENIZER() \
  if (!tok()) GTEST_SKIP() << "shared/data/tokenizers/deepseek-v3 absent"

Message msg(const std::string& role, const std::string& content) {
  Message m;
  m.role = role;
  m.content = content;
  return m;
}
ChatOptionsV41 thinking(const std::string& effort = "") {
  ChatOptionsV41 o;
  o.thinking = true;
  o.reasoning_effort = effort;
  return o;
}

TEST(V41Chat, SystemTokenAndEffort) {
  REQUIRE_TOKENIZER();
  std::vector<Message> m = {msg("user", "Hello")};
  EXPECT_EQ(tok()->apply_chat_template_v41(m), kBos + "<｜User｜>Hello<｜Assistant｜></think>");
  EXPECT_EQ(tok()->apply_chat_template_v41(m, thinking()),
            kBos + "<｜System｜>Reasoning Effort: 75" + kEffort + "<｜User｜>Hello<｜Assistant｜><think>");
  m.insert(m.begin(), msg("system", "Be exact."));
  EXPECT_EQ(tok()->apply_chat_template_v41(m), kBos + "<｜System｜>Be exact.<｜User｜>Hello<｜Assistant｜></think>");
  EXPECT_EQ(tok()->apply_chat_template_v41(m, thinking("max")),
            kBos + "<｜System｜>Reasoning Effort: 100" + kEffort + "Be exact.<｜User｜>Hello<｜Assistant｜><think>");
  EXPECT_EQ(tok()->apply_chat_template_v41(m, thinking("low")).rfind(kBos + "<｜System｜>Reasoning Effort: 50 (", 0), 0u);
  EXPECT_NE(tok()->apply_chat_template_v41(m, thinking("37")).find("Reasoning Effort: 37 ("), std::string::npos);
  ChatOptionsV41 no_gen;
  no_gen.add_generation_prompt = false;
  no_gen.add_bos = false;
  EXPECT_EQ(tok()->apply_chat_template_v41(m, no_gen), "<｜System｜>Be exact.<｜User｜>Hello");
}

TEST(V41Chat, EarlierReasoningIsDropped) {
  REQUIRE_TOKENIZER();
  Message a = msg("assistant", "a1");
  a.reasoning_content = "r1";
  std::vector<Message> m = {msg("user", "first"), a, msg("user", "second")};
  EXPECT_EQ(tok()->apply_chat_template_v41(m, thinking()),
            kBos + "<｜System｜>Reasoning Effort: 75" + kEffort + "<｜User｜>first<｜Assistant｜></think>a1" + kEos +
                "<｜User｜>second<｜Assistant｜><think>");
  ChatOptionsV41 keep = thinking();
  keep.drop_thinking = false;
  EXPECT_EQ(tok()->apply_chat_template_v41(m, keep),
            kBos + "<｜System｜>Reasoning Effort: 75" + kEffort + "<｜User｜>first<｜Assistant｜><think>r1</think>a1" + kEos +
                "<｜User｜>second<｜Assistant｜><think>");
  EXPECT_EQ(tok()->apply_chat_template_v41(m),
            kBos + "<｜User｜>first<｜Assistant｜></think>a1" + kEos + "<｜User｜>second<｜Assistant｜></think>");
}

TEST(V41Chat, MidConversationSystemIsAUserTurn) {
  REQUIRE_TOKENIZER();
  Message a = msg("assistant", "answer");
  a.reasoning_content = "prior reasoning";
  std::vector<Message> m = {msg("user", "first"), msg("user", "second"), a, msg("system", "new instruction")};
  ChatOptionsV41 keep = thinking("low");
  keep.drop_thinking = false;
  EXPECT_EQ(tok()->apply_chat_template_v41(m, keep),
            kBos + "<｜System｜>Reasoning Effort: 50" + kEffort + "<｜User｜>first\n\nsecond<｜Assistant｜><think>prior reasoning"
                   "</think>answer" + kEos + "<｜System｜>new instruction<｜Assistant｜><think>");
  // With dropping on, the system turn is the last user turn: the reasoning before it goes.
  EXPECT_EQ(tok()->apply_chat_template_v41(m, thinking("low")),
            kBos + "<｜System｜>Reasoning Effort: 50" + kEffort + "<｜User｜>first\n\nsecond<｜Assistant｜></think>answer" + kEos +
                "<｜System｜>new instruction<｜Assistant｜><think>");
  // A developer turn is a user turn; before the last user turn it vanishes when dropping.
  std::vector<Message> d = {msg("developer", "dev rules"), msg("assistant", "ok"), msg("user", "go")};
  EXPECT_EQ(tok()->apply_chat_template_v41(d), kBos + "<｜User｜>dev rules<｜Assistant｜></think>ok" + kEos +
                                                   "<｜User｜>go<｜Assistant｜></think>");
  EXPECT_EQ(tok()->apply_chat_template_v41(d, thinking()),
            kBos + "<｜System｜>Reasoning Effort: 75" + kEffort + "ok" + kEos + "<｜User｜>go<｜Assistant｜><think>");
}

const std::string kTools =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n"
    "</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled "
    "(triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls "
    "or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}"
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

TEST(V41Chat, ToolsCallsAndResults) {
  REQUIRE_TOKENIZER();
  Message sys = msg("system", "You are helpful.");
  sys.tools_json = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                     "properties": {"city": {"type": "string"}}}}}])";
  Message a = msg("assistant", "");
  a.reasoning_content = "Need both.";
  a.tool_calls = {{"c1", "get_weather", R"({"city": "Paris"})"}, {"c2", "get_weather", R"({"city": "Rome", "days": [1, 2]})"}};
  Message r2 = msg("tool", "sunny"), r1 = msg("tool", "rain");
  r2.tool_call_id = "c2";
  r1.tool_call_id = "c1";
  std::vector<Message> m = {sys, msg("user", "Paris and Rome?"), a, r2, r1};
  const std::string calls =
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
      "<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Rome</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"days\" string=\"false\">[1, 2]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  // Tools present: nothing is dropped; results follow the call order (c1 before c2).
  EXPECT_EQ(tok()->apply_chat_template_v41(m, thinking()),
            kBos + "<｜System｜>Reasoning Effort: 75" + kEffort + "You are helpful.\n\n" + kTools +
                "<｜User｜>Paris and Rome?<｜Assistant｜><think>Need both.</think>" + calls + kEos +
                "<｜User｜><tool_result>rain</tool_result>\n\n<tool_result>sunny</tool_result><｜Assistant｜><think>");
  // No arguments: an empty parameter list between the invoke lines.
  Message ping = msg("assistant", "");
  ping.tool_calls = {{"", "ping", "{}"}};
  std::vector<Message> p = {msg("user", "ping?"), ping};
  EXPECT_EQ(tok()->apply_chat_template_v41(p), kBos + "<｜User｜>ping?<｜Assistant｜></think>\n\n<｜DSML｜ calls>\n"
                                                   "<｜DSML｜ invoke name=\"ping\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>" + kEos);
  // The V4 encoder writes the other wire format (no space, tool_calls block).
  EXPECT_NE(tok()->apply_chat_template(p).find("<｜DSML｜tool_calls>"), std::string::npos);
}

TEST(V41Chat, Errors) {
  REQUIRE_TOKENIZER();
  std::vector<Message> m = {msg("user", "x")};
  for (const char* e : {"xhigh", "0", "101", "-5", "7.5", "medium", "1000"})
    EXPECT_THROW(tok()->apply_chat_template_v41(m, thinking(e)), InvalidArgument) << e;
  ChatOptionsV41 chat;
  chat.reasoning_effort = "101";  // checked in chat mode too, as the reference does
  EXPECT_THROW(tok()->apply_chat_template_v41(m, chat), InvalidArgument);
  Message a = msg("assistant", "");
  a.tool_calls = {{"", "f", "not json"}};
  std::vector<Message> bad = {msg("user", "x"), a};
  V41_EXPECT_HAS(v41_test::error_of<InvalidArgument>([&] { tok()->apply_chat_template_v41(bad); }),
                 "messages[1].tool_calls[0].arguments");
  a.tool_calls = {{"", "f", "[1, 2]"}};
  bad = {msg("user", "x"), a};
  V41_EXPECT_HAS(v41_test::error_of<InvalidArgument>([&] { tok()->apply_chat_template_v41(bad); }), "must be a JSON object");
  std::vector<Message> img = {msg("user", "look <｜deepseek_image｜>")};
  EXPECT_THROW(tok()->apply_chat_template_v41(img), InvalidArgument);
  std::vector<Message> role = {msg("wizard", "x")};
  EXPECT_THROW(tok()->apply_chat_template_v41(role), InvalidArgument);
  std::vector<Message> dev = {msg("developer", "")};
  EXPECT_THROW(tok()->apply_chat_template_v41(dev), InvalidArgument);
  Message sys = msg("system", "s");
  sys.tools_json = R"([{"name": "no_function_key"}])";
  std::vector<Message> t = {sys, msg("user", "x")};
  V41_EXPECT_HAS(v41_test::error_of<InvalidArgument>([&] { tok()->apply_chat_template_v41(t); }), "has no 'function'");
}

}  // namespace
}  // namespace deepinfer
