// server/request.h: the generation endpoints' bodies parsed and validated without an engine —
// best_of (the candidates generated, the n returned), suffix refused, return_token_ids, numbers
// past double's range named, and the chat prompt each format renders, checked as token ids
// against hand-written prompts (V4 and V4.1; V4.1 with a V4.1-vocabulary tokenizer).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "deepinfer/tokenizer.h"
#include "server/request.h"

namespace deepinfer::server {
namespace {
using nlohmann::json;
namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* s = std::getenv(name);
  return s ? s : fallback;
}

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::from_file(env_or("DEEPINFER_SOURCE_DIR", ".") + "/assets/default-model/tokenizer.json");
  return t;
}

// A V4.1-vocabulary tokenizer: DeepSeek's 129,280-id BPE (shared/data, the V3 packaging) plus the
// special tokens V4 / V4.1 add at their ids (MODEL-DEEPSEEK-V4.md §8.2: <think> 128821,
// </think> 128822, ｜DSML｜ 128825; V41 §8: <｜deepseek_image｜> 129264). <｜System｜>'s id is not in
// the spec: an unused id (128830) stands in. Null when the shared data is absent.
const Tokenizer* v41() {
  static const std::unique_ptr<Tokenizer> t = []() -> std::unique_ptr<Tokenizer> {
    const fs::path src = fs::path(env_or("DEEPINFER_SHARED_DIR", env_or("DEEPINFER_SOURCE_DIR", ".") + "/../shared")) /
                         "data/tokenizers/deepseek-v3/tokenizer.json";
    if (!fs::exists(src)) return nullptr;
    json j = json::parse(std::ifstream(src));
    for (auto [id, text] : std::vector<std::pair<int, const char*>>{
             {128821, "<think>"}, {128822, "</think>"}, {128825, "｜DSML｜"}, {128830, "<｜System｜>"}, {129264, "<｜deepseek_image｜>"}})
      j["added_tokens"].push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
    const fs::path out = fs::temp_directory_path() / ("di_v41_tok_" + std::to_string(::getpid()) + ".json");
    std::ofstream(out) << j.dump();
    auto tok = std::make_unique<Tokenizer>(Tokenizer::from_file(out.string()));
    fs::remove(out);
    return tok;
  }();
  return t.get();
}

RequestContext context(const Tokenizer& tok, ChatFormat fmt, int64_t vocab) {
  RequestContext c;
  c.vocab_size = vocab;
  c.model_name = "tiny";
  c.chat_format = fmt;
  c.tokenizer = &tok;
  c.encode = [&tok](std::string_view t) { return tok.encode(t); };
  c.decode = [&tok](const std::vector<int32_t>& ids) { return tok.decode(ids); };
  return c;
}

// The 400's param, or "accepted".
template <typename F>
std::string refused_param(F&& parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    return e.param.empty() ? std::string("(no param) ") + e.what() : e.param;
  }
  return "accepted";
}

const std::string kBos = "<｜begin▁of▁sentence｜>";
const json kMsgs = json::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Hi"}}});

TEST(ServerRequest, BestOfGeneratesCandidatesAndReturnsN) {
  const RequestContext c = context(tiny(), ChatFormat::kV4, 8192);
  CompletionRequest r = parse_completion_request(c, R"({"prompt": "Hello", "n": 2, "best_of": 5})");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.params.n, 5);
  ASSERT_TRUE(r.params.logprobs.has_value());  // the engine sums the candidates' logprobs
  EXPECT_EQ(*r.params.logprobs, 0);
  EXPECT_FALSE(r.logprobs.has_value());  // the client did not ask for them
  r = parse_completion_request(c, R"({"prompt": "Hello", "n": 2, "best_of": 2, "logprobs": 3})");
  EXPECT_EQ(r.params.n, 2);
  EXPECT_EQ(*r.params.logprobs, 3);
  EXPECT_EQ(refused_param([&] { parse_completion_request(c, R"({"prompt": "x", "n": 3, "best_of": 2})"); }), "best_of");
  EXPECT_EQ(refused_param([&] { parse_completion_request(c, R"({"prompt": "x", "best_of": 2, "stream": true})"); }), "best_of");
  EXPECT_EQ(refused_param([&] { parse_completion_request(c, R"({"prompt": "x", "best_of": 2.5})"); }), "best_of");
}

TEST(ServerRequest, SuffixIsRefusedNamingTheField) {
  const RequestContext c = context(tiny(), ChatFormat::kV4, 8192);
  EXPECT_EQ(refused_param([&] { parse_completion_request(c, R"({"prompt": "def f(", "suffix": "return 1"})"); }), "suffix");
  EXPECT_EQ(refused_param([&] { parse_completion_request(c, R"({"prompt": "def f(", "suffix": ""})"); }), "accepted");
}

TEST(ServerRequest, NumberPastDoubleRangeNamesTheField) {
  const RequestContext c = context(tiny(), ChatFormat::kV4, 8192);
  try {
    parse_completion_request(c, R"({"prompt": "x", "so_args": {"json_schema": {"type": "number", "minimum": 1e999}}})");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("field 'so_args.json_schema.minimum'"), std::string::npos) << e.what();
  }
}

TEST(ServerRequest, ReturnTokenIdsNotWithStreaming) {
  const RequestContext c = context(tiny(), ChatFormat::kV4, 8192);
  EXPECT_TRUE(parse_completion_request(c, R"({"prompt": "x", "return_token_ids": true})").return_token_ids);
  EXPECT_EQ(refused_param([&] { parse_chat_request(c, json{{"messages", kMsgs}, {"return_token_ids", true}, {"stream", true}}.dump()); }),
            "return_token_ids");
}

TEST(ServerRequest, V4ChatPromptIsTheHandWrittenOne) {
  const RequestContext c = context(tiny(), ChatFormat::kV4, 8192);
  ChatRequest r = parse_chat_request(c, json{{"messages", kMsgs}}.dump());
  EXPECT_EQ(r.prompt, tiny().encode(kBos + "You are terse.<｜User｜>Hi<｜Assistant｜></think>"));
  EXPECT_FALSE(r.thinking);
  r = parse_chat_request(c, json{{"messages", kMsgs}, {"reasoning_effort", "high"}}.dump());
  EXPECT_EQ(r.prompt, tiny().encode(kBos + "You are terse.<｜User｜>Hi<｜Assistant｜><think>"));
  EXPECT_TRUE(r.thinking);
}

TEST(ServerRequest, V41ChatThroughAV41Tokenizer) {
  const Tokenizer* tok = v41();
  if (!tok) GTEST_SKIP() << "shared/data/tokenizers/deepseek-v3 absent";
  const RequestContext c = context(*tok, ChatFormat::kV41, 129280);
  const std::string effort = " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  ChatRequest r = parse_chat_request(c, json{{"messages", kMsgs}}.dump());
  EXPECT_EQ(r.prompt, tok->encode(kBos + "<｜System｜>You are terse.<｜User｜>Hi<｜Assistant｜></think>"));
  // The role and thinking markers are single special tokens of the V4.1 vocabulary.
  EXPECT_EQ(r.prompt.size(), 1 + 1 + tok->encode("You are terse.").size() + 1 + tok->encode("Hi").size() + 1 + 1);
  EXPECT_NE(std::find(r.prompt.begin(), r.prompt.end(), 128830), r.prompt.end());
  EXPECT_EQ(r.prompt.back(), 128822);
  // Effort: V4.1's numeric line; medium maps to high (75), the default.
  for (const char* e : {"high", "medium"}) {
    r = parse_chat_request(c, json{{"messages", kMsgs}, {"reasoning_effort", e}}.dump());
    EXPECT_EQ(r.prompt, tok->encode(kBos + "<｜System｜>Reasoning Effort: 75" + effort + "You are terse.<｜User｜>Hi<｜Assistant｜><think>")) << e;
  }
  r = parse_chat_request(c, json{{"messages", kMsgs}, {"reasoning_effort", "37"}}.dump());
  EXPECT_EQ(r.prompt, tok->encode(kBos + "<｜System｜>Reasoning Effort: 37" + effort + "You are terse.<｜User｜>Hi<｜Assistant｜><think>"));
  // A forced call uses V4.1's DSML (" calls", " invoke") with the marker token, and the reply
  // parser is told so.
  const json tool = json::parse(R"({"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})");
  r = parse_chat_request(c, json{{"messages", kMsgs}, {"tools", json::array({tool})}, {"tool_choice", "required"}}.dump());
  ASSERT_TRUE(r.params.structured_outputs && r.params.structured_outputs->grammar);
  EXPECT_NE(r.params.structured_outputs->grammar->find(" calls"), std::string::npos);
  EXPECT_NE(r.params.structured_outputs->grammar->find("<[128825]>"), std::string::npos) << *r.params.structured_outputs->grammar;
  EXPECT_TRUE(r.parse_tools);
  EXPECT_EQ(r.syntax.calls, DsmlSyntax::v41().calls);
  // The tools are rendered into the system turn.
  const std::string text = tok->decode(r.prompt);
  EXPECT_NE(text.find("get_weather"), std::string::npos);
  EXPECT_EQ(text.rfind(kBos + "<｜System｜>You are terse.", 0), 0u) << text.substr(0, 200);
}

}  // namespace
}  // namespace deepinfer::server
