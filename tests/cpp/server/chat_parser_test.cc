// ChatOutputParser: the reply of a V4 / V4.1 chat split into reasoning, content and DSML tool
// calls, the same however the text is split into stream pieces, never a DSML fragment in content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/chat_parser.h"

namespace deepinfer::server {
namespace {

struct Call {
  std::string id, name, args;
};
struct Result {
  std::string reasoning, content;
  std::vector<Call> calls;
  bool malformed = false;
  bool operator==(const Result& o) const {
    if (reasoning != o.reasoning || content != o.content || calls.size() != o.calls.size()) return false;
    for (size_t i = 0; i < calls.size(); ++i)
      if (calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name || calls[i].args != o.calls[i].args) return false;
    return true;
  }
};

void add(Result& r, ChatDelta&& d) {
  r.reasoning += d.reasoning;
  r.content += d.content;
  for (ToolCallDelta& t : d.tool_calls) {
    if (t.index >= int(r.calls.size())) r.calls.resize(size_t(t.index) + 1);
    Call& c = r.calls[size_t(t.index)];
    if (!t.id.empty()) c.id = t.id;
    if (!t.name.empty()) c.name = t.name;
    c.args += t.arguments;
  }
}

Result parse(const ChatParserOptions& o, const std::vector<std::string>& pieces) {
  ChatOutputParser p(o);
  Result r;
  for (const std::string& s : pieces) add(r, p.feed(s));
  add(r, p.finish());
  r.malformed = p.malformed();
  return r;
}

// Every split into two pieces, every split into three pieces at a stride, and byte by byte.
void expect_split_invariant(const ChatParserOptions& o, const std::string& text, const Result& want) {
  const Result whole = parse(o, {text});
  EXPECT_TRUE(whole == want) << "whole: content='" << whole.content << "' reasoning='" << whole.reasoning << "' calls="
                             << whole.calls.size() << (whole.calls.empty() ? "" : " args=" + whole.calls[0].args);
  for (size_t i = 0; i <= text.size(); ++i) {
    const Result r = parse(o, {text.substr(0, i), text.substr(i)});
    ASSERT_TRUE(r == want) << "split at " << i << ": content='" << r.content << "' reasoning='" << r.reasoning << "'";
  }
  for (size_t i = 0; i <= text.size(); i += 3)
    for (size_t j = i; j <= text.size(); j += 5) {
      const Result r = parse(o, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      ASSERT_TRUE(r == want) << "split at " << i << "," << j << ": content='" << r.content << "'";
    }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_TRUE(parse(o, bytes) == want) << "byte by byte";
}

ChatParserOptions v4(bool thinking = false) {
  ChatParserOptions o;
  o.thinking = thinking;
  o.eos_text = "<｜end▁of▁sentence｜>";
  return o;
}

const std::string kD = "｜DSML｜";

TEST(ChatParser, V4ToolCallsSplitAnywhere) {
  const std::string text = "Let me check.\n\n<" + kD + "tool_calls>\n<" + kD + "invoke name=\"get_weather\">\n<" + kD +
                           "parameter name=\"city\" string=\"true\">Paris \"Ville\"\n</" + kD + "parameter>\n<" + kD +
                           "parameter name=\"days\" string=\"false\">3</" + kD + "parameter>\n</" + kD + "invoke>\n<" + kD +
                           "invoke name=\"now\">\n\n</" + kD + "invoke>\n</" + kD + "tool_calls><｜end▁of▁sentence｜>";
  Result want;
  want.content = "Let me check.";
  want.calls = {{"call_0", "get_weather", "{\"city\": \"Paris \\\"Ville\\\"\\n\", \"days\": 3}"}, {"call_1", "now", "{}"}};
  expect_split_invariant(v4(), text, want);
  const Result r = parse(v4(), {text});
  ASSERT_EQ(r.calls.size(), 2u);
  const auto args = nlohmann::json::parse(r.calls[0].args);
  EXPECT_EQ(args["city"], "Paris \"Ville\"\n");
  EXPECT_EQ(args["days"], 3);
  EXPECT_FALSE(r.malformed);
}

TEST(ChatParser, V41Syntax) {
  ChatParserOptions o = v4();
  o.syntax = DsmlSyntax::v41();
  const std::string text = "<" + kD + " calls>\n<" + kD + " invoke name=\"f\">\n<" + kD +
                           " parameter name=\"x\" string=\"false\">{\"a\": [1, 2]}</" + kD + " parameter>\n</" + kD +
                           " invoke>\n</" + kD + " calls>";
  Result want;
  want.calls = {{"call_0", "f", "{\"x\": {\"a\": [1, 2]}}"}};
  expect_split_invariant(o, text, want);
}

TEST(ChatParser, ArgumentsStreamBeforeTheCallEnds) {
  ChatOutputParser p(v4());
  Result r;
  add(r, p.feed("<" + kD + "tool_calls>\n<" + kD + "invoke name=\"f\">\n<" + kD + "parameter name=\"q\" string=\"true\">hello wo"));
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.calls[0].args, "{\"q\": \"hello wo");  // the value so far, before its closing tag
  add(r, p.feed("rld</" + kD + "parameter>\n</" + kD + "invoke>\n</" + kD + "tool_calls>"));
  add(r, p.finish());
  EXPECT_EQ(r.calls[0].args, "{\"q\": \"hello world\"}");
  EXPECT_TRUE(r.content.empty());
}

TEST(ChatParser, ReasoningSplitAndUnclosed) {
  Result want;
  want.reasoning = "Think: 2 < 3.";
  want.content = "Yes.";
  expect_split_invariant(v4(true), "Think: 2 < 3.</think>Yes.<｜end▁of▁sentence｜>", want);
  Result never;
  never.reasoning = "still thinking when the tokens ran out";
  expect_split_invariant(v4(true), "still thinking when the tokens ran out", never);
  Result repeated;  // a reply that repeats the prompt's <think>
  repeated.reasoning = "r";
  repeated.content = "c";
  expect_split_invariant(v4(true), "<think>r</think>c", repeated);
  Result reasoning_then_call;
  reasoning_then_call.reasoning = "use a tool";
  reasoning_then_call.calls = {{"call_0", "f", "{}"}};
  expect_split_invariant(v4(true),
                         "use a tool</think>\n\n<" + kD + "tool_calls>\n<" + kD + "invoke name=\"f\">\n</" + kD +
                             "invoke>\n</" + kD + "tool_calls>",
                         reasoning_then_call);
}

TEST(ChatParser, PlainTextWithAnglesAndNoThinking) {
  Result want;
  want.content = "a < b and <tag> and \n\n<html> fine";
  expect_split_invariant(v4(), "a < b and <tag> and \n\n<html> fine", want);
  Result ws;  // trailing whitespace that could have preceded a calls block, then the end
  ws.content = "done\n\n";
  expect_split_invariant(v4(), "done\n\n", ws);
}

TEST(ChatParser, MalformedBlockLeaksNoMarkup) {
  for (const std::string& text : {"x\n\n<" + kD + "tool_calls>\ngarbage here",
                                  "x <" + kD + "invoke name=\"f\">stray", "x</" + kD + "tool_calls> y",
                                  "<" + kD + "tool_calls>\n<" + kD + "invoke name=\"f\">\n<" + kD +
                                      "parameter name=\"p\" string=\"maybe\">v</" + kD + "parameter>"}) {
    for (size_t i = 0; i <= text.size(); ++i) {
      const Result r = parse(v4(), {text.substr(0, i), text.substr(i)});
      EXPECT_EQ(r.content.find(kD), std::string::npos) << text << " split " << i << ": " << r.content;
      EXPECT_EQ(r.content.find("｜"), std::string::npos) << text;
    }
  }
  EXPECT_TRUE(parse(v4(), {"x\n\n<" + kD + "tool_calls>\ngarbage"}).malformed);
}

TEST(ChatParser, ToolsOffRemovesMarkers) {
  ChatParserOptions o = v4();
  o.parse_tools = false;
  const Result r = parse(o, {"a<" + kD + "tool_calls>b"});
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content.find(kD), std::string::npos) << r.content;
}

TEST(ChatParser, JsonEscape) {
  EXPECT_EQ(json_escape("a\"b\\c\n\t\x01"), "a\\\"b\\\\c\\n\\t\\u0001");
}

}  // namespace
}  // namespace deepinfer::server
