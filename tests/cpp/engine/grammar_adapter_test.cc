// The engine's grammar adapter over the structured module, on the toy codec (0 BOS, 1 EOS,
// 2 + b = byte b, then two-letter pieces): so_args mapping, vocabulary and bitmask layout,
// the compiled-grammar cache, typed errors, and constrained greedy generation end to end.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "deepinfer/error.h"
#include "deepinfer/llm.h"
#include "engine/adapters.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
constexpr int64_t kVocab = 320;  // the toy model's

std::unique_ptr<GrammarCompiler> toy_compiler(const TextCodec& codec) {
  auto c = make_grammar_compiler(&codec, kVocab, /*eos_token_id=*/1);
  return c;
}

StructuredOutputsParams regex(std::string r) {
  StructuredOutputsParams s;
  s.regex = std::move(r);
  return s;
}

bool bit(const std::vector<uint32_t>& m, int64_t t) { return (m[size_t(t / 32)] >> (t % 32)) & 1u; }
}  // namespace

TEST(GrammarAdapter, RegexMaskCacheAndTermination) {
  auto codec = make_toy_codec(kVocab);
  auto compiler = toy_compiler(*codec);
  if (!compiler) GTEST_SKIP() << "structured module not in this build";
  auto m = compiler->compile(regex("[0-9]{3}-[a-z]{2}"));
  std::vector<uint32_t> mask(size_t((kVocab + 31) / 32), 0);
  m->fill_bitmask(mask);
  for (int64_t t = 0; t < kVocab; ++t)
    EXPECT_EQ(bit(mask, t), t >= 2 + '0' && t <= 2 + '9') << "token " << t;
  for (char c : std::string("123-a")) ASSERT_TRUE(m->accept_token(2 + c));
  m->fill_bitmask(mask);
  EXPECT_TRUE(bit(mask, 2 + 'z'));
  EXPECT_FALSE(bit(mask, 1)) << "EOS before the regex can end";
  EXPECT_FALSE(m->accept_token(2 + '7'));
  ASSERT_TRUE(m->accept_token(2 + 'b'));
  m->fill_bitmask(mask);
  for (int64_t t = 0; t < kVocab; ++t) EXPECT_EQ(bit(mask, t), t == 1) << "only EOS after a full match; token " << t;
  EXPECT_FALSE(m->is_terminated());
  EXPECT_TRUE(m->accept_token(1));
  EXPECT_TRUE(m->is_terminated());

  // Identical so_args share one compiled grammar; a different one compiles anew.
  EXPECT_EQ(compiler->num_distinct_grammars(), 1);
  compiler->compile(regex("[0-9]{3}-[a-z]{2}"));
  compiler->compile(regex("[0-9]{3}-[a-z]{2}"));
  EXPECT_EQ(compiler->num_distinct_grammars(), 1);
  compiler->compile(regex("x+"));
  EXPECT_EQ(compiler->num_distinct_grammars(), 2);
}

TEST(GrammarAdapter, BadSpecsThrowTypedErrors) {
  auto codec = make_toy_codec(kVocab);
  auto compiler = toy_compiler(*codec);
  if (!compiler) GTEST_SKIP() << "structured module not in this build";
  EXPECT_THROW(compiler->compile(regex("[0-9")), GrammarError);
  StructuredOutputsParams two = regex("a");
  two.json_object = true;
  EXPECT_THROW(compiler->compile(two), InvalidArgument);
  StructuredOutputsParams bad_schema;
  bad_schema.json = "{\"type\": \"no-such-type\"}";
  EXPECT_THROW(compiler->compile(bad_schema), Error);
  EXPECT_EQ(make_grammar_compiler(nullptr, kVocab, 1), nullptr) << "no tokenizer: structured outputs off";
}

TEST(GrammarAdapter, ConstrainedGreedyOnToyModel) {
  LLMConfig c;
  c.model = "builtin:toy";
  LLM llm(c);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 32;
  p.structured_outputs = regex("[0-9]{3}-[a-z]{2}");
  SamplingParams bad = p;
  bad.structured_outputs = regex("(unclosed");
  SamplingParams choice = p;
  choice.structured_outputs.emplace();
  choice.structured_outputs->choice = std::vector<std::string>{"yes", "no", "maybe"};
  auto outs = llm.generate({PromptInput::from_text("abc"), PromptInput::from_text("abc"), PromptInput::from_text("xy")},
                           {p, bad, choice});
  if (outs[0].error.find("grammar module") != std::string::npos) GTEST_SKIP() << outs[0].error;
  ASSERT_EQ(outs[0].error, "");
  EXPECT_TRUE(std::regex_match(outs[0].outputs[0].text, std::regex("[0-9]{3}-[a-z]{2}"))) << outs[0].outputs[0].text;
  EXPECT_EQ(outs[0].outputs[0].finish_reason, "stop");
  EXPECT_NE(outs[1].error.find("regex"), std::string::npos) << outs[1].error;
  ASSERT_EQ(outs[2].error, "");
  const std::string& t = outs[2].outputs[0].text;
  EXPECT_TRUE(t == "yes" || t == "no" || t == "maybe") << t;
}

// DeepInfer's trigger through LLM.generate: logit_bias forces the free-phase tokens (the toy
// model's own choices are arbitrary), the grammar takes over once the trigger has appeared;
// with a bound token the rest of the trigger is forced first.
TEST(GrammarAdapter, TriggerAndBoundEndToEnd) {
  LLMConfig c;
  c.model = "builtin:toy";
  LLM llm(c);
  auto tok = [](char ch) { return int32_t(2 + static_cast<unsigned char>(ch)); };
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 16;
  p.structured_outputs = regex("[0-9]{3}");
  p.structured_outputs->trigger_token_ids = {tok('#')};
  p.logit_bias = {{tok('#'), 100.0f}};
  SamplingParams bound = p;
  bound.structured_outputs->trigger_token_ids = {tok('#'), tok('!')};
  bound.structured_outputs->bound_token_id = tok('@');
  bound.logit_bias = {{tok('@'), 100.0f}};
  SamplingParams bad = p;
  bad.structured_outputs->trigger_token_ids.clear();
  bad.structured_outputs->bound_token_id = tok('@');
  auto outs = llm.generate({PromptInput::from_text("abc"), PromptInput::from_text("abc"), PromptInput::from_text("abc")},
                           {p, bound, bad});
  if (outs[0].error.find("grammar module") != std::string::npos) GTEST_SKIP() << outs[0].error;
  ASSERT_EQ(outs[0].error, "");
  EXPECT_TRUE(std::regex_match(outs[0].outputs[0].text, std::regex("#[0-9]{3}"))) << outs[0].outputs[0].text;
  ASSERT_EQ(outs[1].error, "");
  EXPECT_TRUE(std::regex_match(outs[1].outputs[0].text, std::regex("@#![0-9]{3}"))) << outs[1].outputs[0].text;
  EXPECT_NE(outs[2].error.find("bound_token_id"), std::string::npos) << outs[2].error;
}

// so_args.tool_calls end to end on the bundled default model (a real tokenizer with the DSML
// token), greedy: the named function's block in V4 and V4.1 tags with its parameters under the
// schema (an enum and a boolean: the tiny model was never trained on DSML, so free text values
// would run to max_tokens); "auto" with logit_bias forcing the DSML token first: the rest of the
// block follows.
TEST(GrammarAdapter, DsmlToolCallsEndToEnd) {
  const char* src = std::getenv("DEEPINFER_SOURCE_DIR");
  const std::string model = std::string(src ? src : ".") + "/assets/default-model";
  if (!std::filesystem::exists(model + "/config.json")) GTEST_SKIP() << "default model absent";
  LLMConfig c;
  c.model = model;
  LLM llm(c);
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"enum": ["Paris", "Oslo"]}, "hourly": {"type": "boolean"}}, "required": ["city", "hourly"]}}},
      {"name": "now", "parameters": {"type": "object", "properties": {}}}])";
  auto params = [&](const std::string& format, const std::string& mode) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 600;  // greedy under the mask may split the tags into short tokens
    p.skip_special_tokens = false;
    p.structured_outputs.emplace();
    p.structured_outputs->tool_calls = R"({"format": ")" + format + R"(", "mode": ")" + mode + R"(", "tools": )" + tools +
                                       (mode == "required" ? R"(, "function": "get_weather"})" : R"(, "parallel": false})");
    return p;
  };
  SamplingParams autop = params("v4", "auto");
  // The marker is one special token (encode may put BOS first).
  const std::vector<int32_t> dsml = llm.encode("｜DSML｜"), bos = llm.encode("");
  ASSERT_EQ(dsml.size(), bos.size() + 1) << "the DSML marker is one special token";
  autop.logit_bias = {{dsml.back(), 100.0f}};
  SamplingParams bad = params("v4", "required");
  bad.structured_outputs->tool_calls = R"({"format": "v9", "tools": [{"name": "f"}]})";
  const PromptInput prompt = PromptInput::from_text("<｜User｜>Weather in Paris?<｜Assistant｜></think>");
  auto outs = llm.generate({prompt, prompt, prompt, prompt}, {params("v4", "required"), params("v41", "required"), autop, bad});
  if (outs[0].error.find("grammar module") != std::string::npos) GTEST_SKIP() << outs[0].error;
  const std::string m = "｜DSML｜";
  auto block = [&](const std::string& calls, const std::string& invoke, const std::string& param) {
    return "<" + m + calls + ">\n<" + m + invoke + " name=\"get_weather\">\n<" + m + param +
           " name=\"city\" string=\"true\">(Paris|Oslo)</" + m + param + ">\n<" + m + param +
           " name=\"hourly\" string=\"false\">\\s*(true|false)\\s*</" + m + param + ">\n\n?</" + m + invoke + ">\n</" + m +
           calls + ">";
  };
  for (int i = 0; i < 3; ++i) ASSERT_EQ(outs[size_t(i)].error, "") << i;
  const std::string v4 = outs[0].outputs[0].text, v41 = outs[1].outputs[0].text, au = outs[2].outputs[0].text;
  const std::string eos = "(<｜end▁of▁sentence｜>)?";
  EXPECT_TRUE(std::regex_match(v4, std::regex("\n{0,2}" + block("tool_calls", "invoke", "parameter") + eos))) << v4;
  EXPECT_TRUE(std::regex_match(v41, std::regex("\n{0,2}" + block(" calls", " invoke", " parameter") + eos))) << v41;
  EXPECT_EQ(outs[0].outputs[0].finish_reason, "stop");
  // auto: the forced marker opened the block (no '<' before it: free text), the grammar the rest.
  // (The end-of-sentence token may show: skip_special_tokens is off.)
  EXPECT_TRUE(std::regex_match(au, std::regex("(" + block("tool_calls", "invoke", "parameter").substr(1) + "|" +
                                              "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n\n?</｜DSML｜invoke>\n</｜DSML｜tool_calls>)"
                                              "(<｜end▁of▁sentence｜>)?")))
      << au;
  EXPECT_NE(outs[3].error.find("so_args.tool_calls.format"), std::string::npos) << outs[3].error;
}
