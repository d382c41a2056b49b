// so_args.tool_calls: DSML tool-call blocks (V4 and V4.1 tags) with each function's parameters
// under its JSON schema, in "required" mode (the reply is the block) and "auto" mode (free text
// until the DSML token, a trigger). A byte vocabulary with the DSML token as terminal 257; the
// blocks are the text chat_dsv4.cpp / chat_dsv41.cpp render (tests/cpp/server/tool_grammar_test
// checks the same grammar against the rendered templates through the real tokenizer).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#include "structured/tool_calls.h"
#include "structured/vocab.h"

namespace deepinfer::structured {
namespace {
using json = nlohmann::ordered_json;
const std::string kMarker = "｜DSML｜";

std::shared_ptr<const TokenVocabulary> dsml_vocab(bool with_marker = true) {
  TokenizerInfo info = byte_level_tokenizer_info();
  info.token_bytes.resize(259);
  info.token_bytes[257] = kMarker;
  info.token_bytes[258] = "</think>";
  info.special_ids = {257, 258};
  if (with_marker) info.terminal_ids = {257, 258};
  return make_vocabulary(info);
}

// Feeds `text` (the marker's text as token 257), then, when `end`, the stop token.
bool feed(GrammarMatcher& m, const std::string& text, bool end = true) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t k = text.find(kMarker, i);
    const std::string part = text.substr(i, k == std::string::npos ? std::string::npos : k - i);
    for (unsigned char b : part)  // one token per byte (accept_bytes is grammar input: not before a trigger)
      if (!m.accept_token(b)) return false;
    if (k == std::string::npos) break;
    if (!m.accept_token(257)) return false;
    i = k + kMarker.size();
  }
  return !end || m.accept_token(256);
}

const json kWeather = json::parse(R"({"type": "object", "properties": {
  "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "units": {"enum": ["c", "f"]}},
  "required": ["city", "days"]})");

std::string so_args(const std::string& format, const std::string& mode, json extra = json::object()) {
  json tc = {{"format", format}, {"mode", mode},
             {"tools", json::array({{{"name", "get_weather"}, {"parameters", kWeather}},
                                    {{"type", "function"}, {"function", {{"name", "now"}}}}})}};
  for (auto it = extra.begin(); it != extra.end(); ++it) tc[it.key()] = it.value();
  return json{{"tool_calls", tc}}.dump();
}

// V4's rendering of calls (chat_dsv4.cpp render_tool_calls).
std::string v4_call(const std::string& name, const std::vector<std::pair<std::string, std::string>>& params) {
  std::string s = "<" + kMarker + "invoke name=\"" + name + "\">\n";
  for (const auto& [k, v] : params) {
    const bool str = v.empty() || v[0] != '#';
    s += "<" + kMarker + "parameter name=\"" + k + "\" string=\"" + (str ? "true" : "false") + "\">" +
         (str ? v : v.substr(1)) + "</" + kMarker + "parameter>\n";
  }
  return s + "</" + kMarker + "invoke>";
}
std::string v4_block(const std::vector<std::string>& calls) {
  std::string s = "\n\n<" + kMarker + "tool_calls>\n";
  for (size_t i = 0; i < calls.size(); ++i) s += (i ? "\n" : "") + calls[i];
  return s + "\n</" + kMarker + "tool_calls>";
}

std::string with(const std::string& args, const json& more) {
  json a = json::parse(args);
  a.update(more);
  return a.dump();
}

bool accepts(GrammarCompiler& c, const std::string& args, const std::string& text) {
  GrammarMatcher m(c.compile(args));
  return feed(m, text);
}
}  // namespace

TEST(ToolCalls, RequiredV4FollowsTheSchemas) {
  GrammarCompiler c(dsml_vocab());
  const std::string a = so_args("v4", "required");
  const std::string paris = v4_call("get_weather", {{"city", "Paris <b>"}, {"days", "#3"}, {"units", "c"}});
  EXPECT_TRUE(accepts(c, a, v4_block({paris})));
  EXPECT_TRUE(accepts(c, a, v4_block({paris, v4_call("now", {})})));
  EXPECT_TRUE(accepts(c, a, v4_block({v4_call("now", {{"anything", "#[1, 2]"}, {"more", "#{\"k\": [true]}"}})})))
      << "JSON values as the template writes them (Python's separators)";
  EXPECT_FALSE(accepts(c, a, v4_block({v4_call("get_weather", {{"city", "Rome"}})}))) << "days is required";
  EXPECT_FALSE(accepts(c, a, v4_block({v4_call("get_weather", {{"city", "Rome"}, {"days", "3"}})}))) << "a string";
  EXPECT_FALSE(accepts(c, a, v4_block({v4_call("get_weather", {{"city", "Rome"}, {"days", "#0"}})}))) << "minimum 1";
  EXPECT_FALSE(accepts(c, a, v4_block({v4_call("get_weather", {{"city", "R"}, {"days", "#2"}, {"units", "k"}})})));
  EXPECT_FALSE(accepts(c, a, v4_block({v4_call("other", {})})));
  EXPECT_FALSE(accepts(c, a, "Sure. " + v4_block({paris}))) << "required: no free text first";
  EXPECT_FALSE(accepts(c, a, "\n\n<|DSML|tool_calls>")) << "the marker spelled as text";
  // V4.1's spaced tags are another format.
  std::string v41 = v4_block({paris});
  for (const char* t : {"tool_calls", "invoke", "parameter"})
    for (size_t p; (p = v41.find(std::string(kMarker) + t)) != std::string::npos;)
      v41.replace(p, kMarker.size() + strlen(t), kMarker + " " + (std::string(t) == "tool_calls" ? "calls" : t));
  EXPECT_FALSE(accepts(c, a, v41));
  EXPECT_TRUE(accepts(c, so_args("v41", "required"), v41)) << v41;
  EXPECT_FALSE(accepts(c, so_args("v41", "required"), v4_block({paris})));
}

TEST(ToolCalls, NamedFunctionAndSingleCall) {
  GrammarCompiler c(dsml_vocab());
  const std::string one = so_args("v4", "required", {{"function", "get_weather"}});
  const std::string call = v4_call("get_weather", {{"city", "Oslo"}, {"days", "#1"}});
  EXPECT_TRUE(accepts(c, one, v4_block({call})));
  EXPECT_FALSE(accepts(c, one, v4_block({call, call})));
  EXPECT_FALSE(accepts(c, one, v4_block({v4_call("now", {})})));
  const std::string serial = so_args("v4", "required", {{"parallel", false}});
  EXPECT_FALSE(accepts(c, serial, v4_block({call, call})));
  EXPECT_TRUE(accepts(c, serial, v4_block({v4_call("now", {})})));
}

TEST(ToolCalls, AutoModeIsFreeUntilTheMarker) {
  GrammarCompiler c(dsml_vocab());
  const std::string a = so_args("v4", "auto");
  const std::string call = v4_call("get_weather", {{"city", "Lima"}, {"days", "#2"}});
  EXPECT_TRUE(accepts(c, a, "Let me look that up." + v4_block({call})));
  EXPECT_TRUE(accepts(c, a, "No tool needed: it is sunny.")) << "free text alone may end";
  EXPECT_TRUE(accepts(c, a, v4_block({call})));
  EXPECT_FALSE(accepts(c, a, "Checking." + v4_block({v4_call("get_weather", {{"city", "Lima"}})})));
  // After the marker only the block: its tags, not text.
  GrammarMatcher m(c.compile(a));
  ASSERT_TRUE(feed(m, "ok <" + kMarker, false));
  EXPECT_FALSE(m.accept_bytes("hello"));
  EXPECT_TRUE(m.accept_bytes("tool_calls>\n"));
  // The block closed: only the end.
  GrammarMatcher done(c.compile(a));
  ASSERT_TRUE(feed(done, "x" + v4_block({call}), false));
  EXPECT_FALSE(done.accept_bytes(" more"));
  EXPECT_TRUE(done.accept_token(256));
}

TEST(ToolCalls, NamedErrors) {
  GrammarCompiler c(dsml_vocab());
  auto fails = [&](const std::string& args, const std::string& needle) {
    try {
      c.compile(args);
      ADD_FAILURE() << "compiled: " << args;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails(so_args("v5", "required"), "format");
  fails(so_args("v4", "sometimes"), "mode");
  fails(so_args("v4", "required", {{"function", "nope"}}), "'nope' is not one of the tools");
  fails(so_args("v4", "required", {{"tool_choice", "x"}}), "tool_calls.tool_choice is not a field");
  fails(so_args("v4", "required", {{"parallel", 1}}), "parallel");
  fails(json{{"tool_calls", {{"format", "v4"}, {"tools", json::array()}}}}.dump(), "non-empty array");
  fails(json{{"tool_calls", {{"format", "v4"}, {"tools", {{{"name", "a\"b"}}}}}}}.dump(), "cannot be written in DSML");
  fails(json{{"tool_calls", {{"format", "v4"}, {"tools", {{{"parameters", {}}}}}}}}.dump(), "tools[0] needs a string");
  fails(with(so_args("v4", "auto"), {{"trigger_token_ids", {258}}}), "sets its own trigger");
  fails(with(so_args("v4", "auto"), {{"regex", "a"}}), "both tool_calls and regex");
  GrammarCompiler bare(dsml_vocab(false));
  EXPECT_THROW(bare.compile(so_args("v4", "required")), InvalidArgument);
  // required + a trigger of the caller's (think first, then the block).
  GrammarMatcher m(c.compile(with(so_args("v4", "required"), {{"trigger_token_ids", {258}}})));
  ASSERT_TRUE(feed(m, "thinking freely", false));
  ASSERT_TRUE(m.accept_token(258));
  EXPECT_TRUE(feed(m, v4_block({v4_call("now", {})})));
}

}  // namespace deepinfer::structured
