// Environment knobs: one table parses every DEEPINFER_* variable once; a knob whose feature is
// not built is refused, naming it, when an engine is built (never silently ignored); values
// that do what they say pass; the limits reach the model.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "core/env.h"
#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
EnvConfig parse(const std::map<std::string, std::string>& vars) {
  return EnvConfig::parse([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// The message check_env_knobs gives for `vars` on a model with/without a drafter ("" = accepted).
std::string refusal(const std::map<std::string, std::string>& vars, bool has_drafter = false, bool replays = false) {
  try {
    check_env_knobs(parse(vars), {.model_has_drafter = has_drafter, .model_replays = replays, .model = "TestModel"});
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// Sets one variable for the scope of a test (the LLM reads the real environment once).
struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~EnvVar() {
    if (had_) setenv(name_, saved_.c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  std::string saved_;
  bool had_ = false;
};
}  // namespace

TEST(EnvKnobs, TableParsesEveryKnobOnce) {
  std::set<std::string> names;
  for (const EnvKnob& k : env_knobs()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name << " twice";
    EXPECT_EQ(std::string(k.name).rfind("DEEPINFER_", 0), 0u) << k.name;
    EXPECT_FALSE(std::string(k.meaning).empty()) << k.name;
  }
  for (const char* n : {"DEEPINFER_ACCELERATOR", "DEEPINFER_CUDA_GRAPHS", "DEEPINFER_DEVICE_SAMPLING",
                        "DEEPINFER_USE_NEXTN_DECODE", "DEEPINFER_ENABLE_MTP_VARLEN", "DEEPINFER_BATCH_INVARIANT",
                        "DEEPINFER_ASYNC_SCHEDULING", "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE",
                        "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "DEEPINFER_HF_MODEL_DIR", "DEEPINFER_LOG_LEVEL"})
    EXPECT_TRUE(names.count(n)) << n << " missing from the table";

  const EnvConfig d = parse({});
  EXPECT_TRUE(d.cuda_graphs);
  EXPECT_TRUE(d.device_sampling);
  EXPECT_FALSE(d.use_nextn_decode.has_value());
  EXPECT_EQ(d.max_rollback(), kDefaultNextnDecode + 1);
  EXPECT_EQ(refusal({}), "") << "the defaults are all honoured";

  const EnvConfig e = parse({{"DEEPINFER_CUDA_GRAPHS", "0"}, {"DEEPINFER_DEVICE_SAMPLING", "off"},
                             {"DEEPINFER_USE_NEXTN_DECODE", "3"}, {"DEEPINFER_ACCELERATOR", "cpu"},
                             {"DEEPINFER_LOG_LEVEL", "debug"}, {"DEEPINFER_HF_MODEL_DIR", "/x"}});
  EXPECT_FALSE(e.cuda_graphs);
  EXPECT_FALSE(e.device_sampling);
  EXPECT_EQ(e.use_nextn_decode, 3);
  EXPECT_EQ(e.max_rollback(), 4);
  EXPECT_EQ(e.accelerator, Accelerator::kCPU);
  EXPECT_EQ(e.log_level, "debug");
  EXPECT_EQ(e.hf_model_dir, "/x");
  EXPECT_EQ(d.ep_exchange, EpExchange::kAuto);
  EXPECT_EQ(parse({{"DEEPINFER_EP_EXCHANGE", "host"}}).ep_exchange, EpExchange::kHost);
  EXPECT_EQ(parse({{"DEEPINFER_EP_EXCHANGE", "device"}}).ep_exchange, EpExchange::kDevice);
}

TEST(EnvKnobs, BadValuesNameTheVariable) {
  for (auto [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"DEEPINFER_CUDA_GRAPHS", "2"}, {"DEEPINFER_DEVICE_SAMPLING", "maybe"}, {"DEEPINFER_USE_NEXTN_DECODE", "-1"},
           {"DEEPINFER_USE_NEXTN_DECODE", "99"}, {"DEEPINFER_ACCELERATOR", "tpu"}, {"DEEPINFER_LOG_LEVEL", "loud"},
           {"DEEPINFER_BATCH_INVARIANT", "yes please"}, {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "x"},
           {"DEEPINFER_EP_EXCHANGE", "nccl"}, {"DEEPINFER_EP_EXCHANGE", "Device"}}) {
    try {
      parse({{name, value}});
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// Every knob whose feature has not landed is refused for the values that ask for it, with a
// message naming it; the values that ask for nothing new pass.
TEST(EnvKnobs, UnbuiltFeaturesAreRefusedNamingTheKnob) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"DEEPINFER_USE_NEXTN_DECODE", "2"},
      {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "compact"}, {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "140"},
      {"DEEPINFER_ACCELERATOR", "ascend"}};
  for (const auto& [name, value] : refused) {
    const std::string msg = refusal({{name, value}});
    EXPECT_NE(msg.find(name), std::string::npos) << name << "=" << value << ": " << msg;
  }
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"DEEPINFER_ENABLE_MTP_VARLEN", "0"}, {"DEEPINFER_ENABLE_MTP_VARLEN", "1"},
           {"DEEPINFER_BATCH_INVARIANT", "0"}, {"DEEPINFER_BATCH_INVARIANT", "1"},
           {"DEEPINFER_ASYNC_SCHEDULING", "0"}, {"DEEPINFER_ASYNC_SCHEDULING", "1"},
           {"DEEPINFER_USE_NEXTN_DECODE", "0"}, {"DEEPINFER_CUDA_GRAPHS", "0"}, {"DEEPINFER_DEVICE_SAMPLING", "0"}})
    EXPECT_EQ(refusal({{name, value}}), "") << name << "=" << value;
  // Batch invariance cannot hold with batch-dependent draft lengths: the pair is refused.
  const std::string pair = refusal({{"DEEPINFER_BATCH_INVARIANT", "1"}, {"DEEPINFER_ENABLE_MTP_VARLEN", "1"}});
  EXPECT_NE(pair.find("DEEPINFER_BATCH_INVARIANT: cannot be deterministic"), std::string::npos) << pair;
  // Drafting is honoured for a model with a drafter; two refusals are both named.
  EXPECT_EQ(refusal({{"DEEPINFER_USE_NEXTN_DECODE", "2"}}, /*has_drafter=*/true), "");
  // Bounded replay is honoured by a model that runs it (V4.1 with a candidate source); the keep
  // length alone does nothing and is refused, as is a mode that is not one.
  EXPECT_EQ(refusal({{"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "compact"}}, false, /*replays=*/true), "");
  EXPECT_EQ(refusal({{"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "compact"}, {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "140"}},
                    false, /*replays=*/true),
            "");
  EXPECT_EQ(refusal({{"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "full"}}), "");
  const std::string alone = refusal({{"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "140"}}, false, /*replays=*/true);
  EXPECT_NE(alone.find("only with DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact"), std::string::npos) << alone;
  EXPECT_THROW(parse({{"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "bounded"}}), InvalidArgument);
  const std::string two = refusal({{"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "140"}, {"DEEPINFER_ACCELERATOR", "ascend"}});
  EXPECT_NE(two.find("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS"), std::string::npos) << two;
  EXPECT_NE(two.find("DEEPINFER_ACCELERATOR"), std::string::npos) << two;
}

// The check runs when an engine is built: through EngineConfig.env, and through LLM from the
// process environment (which it reads once).
TEST(EnvKnobs, EngineAndLLMRefuseAtConstruction) {
  EngineConfig ec;
  ec.env = parse({{"DEEPINFER_BATCH_INVARIANT", "1"}, {"DEEPINFER_ENABLE_MTP_VARLEN", "1"}});
  EXPECT_THROW(Engine(ec, std::make_unique<ToyModel>(), nullptr), InvalidArgument);
  ec.env = parse({{"DEEPINFER_USE_NEXTN_DECODE", "3"}});
  EXPECT_THROW(Engine(ec, std::make_unique<ToyModel>(), nullptr), InvalidArgument);
  {  // with a drafter, DEEPINFER_USE_NEXTN_DECODE sets the draft length
    ToyModelConfig tc;
    tc.max_rollback = 8;
    auto m = std::make_unique<ToyModel>(tc);
    m->set_drafter(std::make_unique<ToyDrafter>(tc, 8, [](int64_t) { return 1; }));
    Engine eng(ec, std::move(m), nullptr);
    EXPECT_EQ(eng.scheduler().config().num_speculative_tokens, 3);
  }
  {  // above the drafts one drafter round proposes (DSpark: its block): refused with both numbers
    ToyModelConfig tc;
    tc.max_rollback = 8;
    auto m = std::make_unique<ToyModel>(tc);
    m->set_drafter(std::make_unique<ToyDrafter>(tc, 2, [](int64_t) { return 1; }));
    try {
      Engine eng(ec, std::move(m), nullptr);
      ADD_FAILURE() << "3 drafts accepted from a drafter of 2";
    } catch (const InvalidArgument& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("DEEPINFER_USE_NEXTN_DECODE=3"), std::string::npos) << w;
      EXPECT_NE(w.find("the 2 drafts"), std::string::npos) << w;
    }
  }
  LLMConfig c;
  c.model = "builtin:toy";
  for (auto [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "compact"}, {"DEEPINFER_USE_NEXTN_DECODE", "4"},
           {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "10"}, {"DEEPINFER_DEVICE_SAMPLING", "maybe"}}) {
    EnvVar v(name, value);
    try {
      LLM llm(c);
      ADD_FAILURE() << name << "=" << value << " accepted by LLM";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  EnvVar off("DEEPINFER_ASYNC_SCHEDULING", "0");
  LLM llm(c);  // asks for what the engine does
  EXPECT_GT(llm.vocab_size(), 0);
}

// LLMConfig limits and the rollback the knobs need reach the model (ModelLoadOptions.limits).
TEST(EnvKnobs, LimitsReachTheModel) {
  LLMConfig c;
  c.model = "builtin:toy";
  c.max_num_seqs = 7;
  c.max_num_batched_tokens = 99;
  c.max_model_len = 300;
  const model::ModelLimits l = model_limits_for(c, parse({{"DEEPINFER_USE_NEXTN_DECODE", "2"}}));
  EXPECT_EQ(l.max_num_seqs, 7);
  EXPECT_EQ(l.max_num_batched_tokens, 99);
  EXPECT_EQ(l.max_model_len, 300);
  EXPECT_EQ(l.max_rollback, 3);
  EnvVar v("DEEPINFER_USE_NEXTN_DECODE", "0");
  LLM llm(c);
  EXPECT_NE(llm.describe().find("max_rollback 1"), std::string::npos) << llm.describe();
}
