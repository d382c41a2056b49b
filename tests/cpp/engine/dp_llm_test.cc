// The data-parallel LLM end to end on CPU ranks: rank 0 in this process, workers started as
// `deepinfer rank-worker` processes, the experts sharded across them. Every request's tokens
// must equal the same request on a one-rank LLM (greedy and seeded), whatever rank it landed
// on and whatever else ran beside it; a bad request fails alone; a worker that cannot start
// fails the constructor naming it; a bad layout is refused before anything starts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <tuple>

#include "deepinfer/error.h"
#include "deepinfer/llm.h"

namespace deepinfer {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
std::string tiny_model() { return env_or("DEEPINFER_SOURCE_DIR", ".") + "/tests/data/golden/tiny"; }
std::string default_model() { return env_or("DEEPINFER_SOURCE_DIR", ".") + "/assets/default-model"; }
// The CLI built with this test (CMake passes its path); DEEPINFER_CLI overrides it.
std::vector<std::string> worker() { return {env_or("DEEPINFER_CLI", DEEPINFER_CLI_PATH), "rank-worker"}; }

LLMConfig config(const std::string& model, int dp, int ep) {
  LLMConfig c;
  c.model = model;
  // DEEPINFER_TEST_ACCELERATOR=nvidia runs the same checks with GPU ranks (sharing the GPUs there
  // are; run with DEEPINFER_BATCH_INVARIANT=1, since a request's batch differs between layouts).
  c.accelerator = env_or("DEEPINFER_TEST_ACCELERATOR", "cpu");
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 48;  // several chunked-prefill steps per prompt
  c.max_model_len = 256;
  c.skip_tokenizer_init = model == tiny_model();
  c.data_parallel_size = dp;
  c.expert_parallel_size = ep;
  if (dp > 1) c.worker_command = worker();
  return c;
}

std::vector<PromptInput> token_prompts(int64_t vocab, int count) {
  std::mt19937 rng(7);
  std::vector<PromptInput> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> ids(size_t(3 + (i * 13) % 57));
    for (int32_t& t : ids) t = int32_t(rng() % uint32_t(vocab));
    out.push_back(PromptInput::from_token_ids(ids));
  }
  return out;
}

std::vector<SamplingParams> params_for(int count) {
  std::vector<SamplingParams> ps;
  for (int i = 0; i < count; ++i) {
    SamplingParams p;
    p.max_tokens = 6 + i % 5;
    p.ignore_eos = true;
    if (i % 2) p.temperature = 0.f;
    else p.temperature = 0.9f, p.seed = uint64_t(100 + i);
    ps.push_back(p);
  }
  return ps;
}

void expect_same_tokens(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].error, b[i].error) << "request " << i;
    ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size()) << "request " << i;
    for (size_t k = 0; k < a[i].outputs.size(); ++k)
      EXPECT_EQ(a[i].outputs[k].token_ids, b[i].outputs[k].token_ids) << "request " << i << " sample " << k;
  }
}

struct Layout {
  int dp, ep;
  bool eplb = false;  // runtime EPLB every 2 steps, one redundant slot per rank
};
class DataParallelLLM : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallelLLM, MatchesOneRank) {
  if (!std::filesystem::exists(tiny_model() + "/config.json")) GTEST_SKIP() << "fixture " << tiny_model() << " absent";
  const auto [dp, ep, eplb] = GetParam();
  std::vector<RequestOutput> ref;
  int64_t vocab = 0;
  const int count = 9;
  {
    LLM one(config(tiny_model(), 1, 0));
    vocab = one.vocab_size();
    ref = one.generate(token_prompts(vocab, count), params_for(count));
  }
  LLMConfig pc = config(tiny_model(), dp, ep);
  if (eplb) pc.enable_eplb = true, pc.eplb_window_size = 4, pc.eplb_step_interval = 2, pc.num_redundant_experts = dp;
  LLM par(pc);
  EXPECT_NE(par.describe().find("data-parallel " + std::to_string(dp) + " ranks"), std::string::npos) << par.describe();
  if (ep != 1) {
    EXPECT_NE(par.describe().find("experts sharded"), std::string::npos) << par.describe();
  }
  std::vector<RequestOutput> got = par.generate(token_prompts(vocab, count), params_for(count));
  expect_same_tokens(ref, got);
  // The same LLM again, one request at a time through the incremental API (other ranks idle).
  const std::string id = par.add_request(token_prompts(vocab, 1)[0], params_for(1)[0]);
  std::vector<int32_t> streamed;
  bool finished = false;
  for (int guard = 0; par.has_unfinished() && guard < 1000; ++guard)
    for (const RequestOutput& o : par.step())
      if (o.request_id == id) streamed = o.outputs.at(0).token_ids, finished = o.finished;
  EXPECT_TRUE(finished);
  EXPECT_EQ(streamed, ref[0].outputs[0].token_ids);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelLLM, ::testing::Values(Layout{2, 0}, Layout{3, 3}, Layout{2, 1}, Layout{3, 0, true},
                                           Layout{4, 2}, Layout{4, 0, true}),
                         [](const auto& info) {
                           return "dp" + std::to_string(info.param.dp) + "_ep" + std::to_string(info.param.ep) +
                                  (info.param.eplb ? "_eplb" : "");
                         });

TEST(DataParallelLLM, BadRequestFailsAlone) {
  if (!std::filesystem::exists(tiny_model() + "/config.json")) GTEST_SKIP() << "fixture absent";
  LLM par(config(tiny_model(), 2, 0));
  const int64_t vocab = par.vocab_size();
  std::vector<PromptInput> prompts = token_prompts(vocab, 4);
  prompts[2].token_ids[1] = int32_t(vocab + 5);  // refused by the rank that gets it
  std::vector<RequestOutput> got = par.generate(prompts, params_for(4));
  ASSERT_EQ(got.size(), 4u);
  EXPECT_NE(got[2].error.find("outside [0, " + std::to_string(vocab) + ")"), std::string::npos) << got[2].error;
  for (int i : {0, 1, 3}) {
    EXPECT_TRUE(got[size_t(i)].error.empty()) << got[size_t(i)].error;
    ASSERT_EQ(got[size_t(i)].outputs.size(), 1u);
    EXPECT_FALSE(got[size_t(i)].outputs[0].token_ids.empty());
  }
  // Cheap checks fail at once on rank 0.
  SamplingParams bad;
  bad.top_p = 2.f;
  EXPECT_THROW(par.add_request(prompts[0], bad), InvalidArgument);
}

TEST(DataParallelLLM, TextPromptsOnTheDefaultModel) {
  if (!std::filesystem::exists(default_model() + "/config.json")) GTEST_SKIP() << "default model absent";
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = 8;
  const std::vector<PromptInput> prompts{PromptInput::from_text("The capital of France is"),
                                         PromptInput::from_text("Once upon a time"),
                                         PromptInput::from_text("1, 2, 3,")};
  std::vector<RequestOutput> ref = LLM(config(default_model(), 1, 0)).generate(prompts, {p});
  std::vector<RequestOutput> got = LLM(config(default_model(), 2, 2)).generate(prompts, {p});
  expect_same_tokens(ref, got);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].outputs.at(0).text, ref[i].outputs.at(0).text);
}

TEST(DataParallelLLM, WorkerThatCannotStartNamesIt) {
  if (!std::filesystem::exists(tiny_model() + "/config.json")) GTEST_SKIP() << "fixture absent";
  LLMConfig c = config(tiny_model(), 2, 0);
  c.worker_command = {"/bin/false"};  // starts, exits with status 1 before it is ready
  try {
    LLM par(c);
    FAIL() << "constructed with a worker that exited";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

// DEEPINFER_EP_EXCHANGE=device where the group cannot have a device exchange (here: CPU ranks) is
// refused by name at construction, on every rank, rather than falling back to host staging.
TEST(DataParallelLLM, DeviceExchangeRefusedWhereItCannotRun) {
  if (!std::filesystem::exists(tiny_model() + "/config.json")) GTEST_SKIP() << "fixture absent";
  LLMConfig c = config(tiny_model(), 2, 2);
  c.accelerator = "cpu";
  setenv("DEEPINFER_EP_EXCHANGE", "device", 1);
  try {
    LLM par(c);
    unsetenv("DEEPINFER_EP_EXCHANGE");
    FAIL() << "accepted DEEPINFER_EP_EXCHANGE=device on CPU ranks";
  } catch (const Error& e) {
    unsetenv("DEEPINFER_EP_EXCHANGE");
    EXPECT_NE(std::string(e.what()).find("DEEPINFER_EP_EXCHANGE=device"), std::string::npos) << e.what();
  }
}

TEST(DataParallelLLM, BadLayoutRefused) {
  LLMConfig c = config(tiny_model(), 2, 3);
  try {
    LLM par(c);
    FAIL() << "accepted expert_parallel_size=3 with data_parallel_size=2";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expert_parallel_size"), std::string::npos) << e.what();
  }
  c.expert_parallel_size = 0;
  c.data_parallel_size = 0;
  EXPECT_THROW(LLM{c}, InvalidArgument);
  LLMConfig one_rank = config(tiny_model(), 1, 2);  // experts sharded over ranks that do not exist
  EXPECT_THROW(LLM{one_rank}, InvalidArgument);
  LLMConfig single = config(tiny_model(), 1, 0);
  single.enable_eplb = true;  // nothing to balance on one rank: refused, not ignored
  try {
    LLM one(single);
    FAIL() << "accepted enable_eplb on one rank";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("enable_eplb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {
// Context parallelism (docs/PARALLEL.md): rank 0 runs the engine, `cp - 1` helper processes join
// every step of at least 16 tokens (chunked prefill of 48-token steps, several sequences per step,
// decode rows beside prefill rows, a repeated long prompt that hits the prefix cache); tokens must
// equal one rank's, greedy and seeded. With expert_parallel_size = cp the experts are sharded over
// the same ranks (each loads only its slots'): split steps run each rank's experts on every token,
// and the helpers join every other step's MoE exchanges with an empty step; with EPLB re-placing
// (and moving) experts every 2 steps. With data_parallel_size > 1 every data-parallel rank is such
// a group: requests go to the least loaded group leader, each leader's split steps run on its group.
struct CpLayout {
  int cp, ep;
  bool eplb = false;
  int dp = 1;  // > 1: that many CP groups, each a data-parallel rank (cp x dp processes)
};
void PrintTo(const CpLayout& l, std::ostream* os) {
  *os << "dp " << l.dp << " cp " << l.cp << " ep " << l.ep << (l.eplb ? " eplb" : "");
}
// Context parallelism with experts sharded over its group runs on the CPU backend only (a GPU
// accelerator is refused), so those layouts pin the CPU, also under
// DEEPINFER_TEST_ACCELERATOR=nvidia, and so does their one-rank reference; the others run on the
// test accelerator (GPU ranks sharing the GPU there; run with DEEPINFER_BATCH_INVARIANT=1 as the
// data-parallel checks are).
LLMConfig cp_config(const std::string& model, int dp, int ep, bool sharded) {
  LLMConfig c = config(model, dp, ep);
  if (sharded) c.accelerator = "cpu";
  return c;
}
LLMConfig cpu_config(const std::string& model, int dp, int ep) { return cp_config(model, dp, ep, true); }
class ContextParallelLLM : public ::testing::TestWithParam<CpLayout> {};

TEST_P(ContextParallelLLM, MatchesOneRank) {
  if (!std::filesystem::exists(tiny_model() + "/config.json")) GTEST_SKIP() << "fixture " << tiny_model() << " absent";
  const auto [cp, ep, eplb, dp] = GetParam();
  std::vector<RequestOutput> ref;
  int64_t vocab = 0;
  const int count = 6;
  std::vector<PromptInput> prompts;
  std::vector<SamplingParams> params = params_for(count + 3);
  auto make_prompts = [&] {
    prompts = token_prompts(vocab, count);
    std::mt19937 rng(11);
    for (int64_t len : {151, 201}) {
      std::vector<int32_t> ids(static_cast<size_t>(len));
      for (int32_t& t : ids) t = int32_t(rng() % uint32_t(vocab));
      prompts.push_back(PromptInput::from_token_ids(ids));
    }
    prompts.push_back(prompts.back());  // its prefix comes from the cache
  };
  const bool sharded = ep == cp;
  {
    LLM one(cp_config(tiny_model(), 1, 0, sharded));
    vocab = one.vocab_size();
    make_prompts();
    ref = one.generate(prompts, params);
  }
  LLMConfig c = cp_config(tiny_model(), dp, ep, sharded);
  c.context_parallel_size = cp;
  c.context_parallel_min_tokens = 16;
  c.worker_command = worker();
  if (eplb) c.enable_eplb = true, c.eplb_window_size = 4, c.eplb_step_interval = 2, c.num_redundant_experts = cp;
  LLM par(c);
  const std::string d = par.describe();
  const std::string layout = (dp > 1 ? "data-parallel " + std::to_string(dp) + " x " : std::string()) +
                             "context-parallel " + std::to_string(cp) + " ranks";
  EXPECT_NE(d.find(layout), std::string::npos) << d;
  EXPECT_EQ(d.find("experts sharded") != std::string::npos, ep == cp) << d;
  std::vector<RequestOutput> got = par.generate(prompts, params);
  expect_same_tokens(ref, got);
  if (ep != cp) return;
  // One request at a time through the incremental API: its decode steps run on rank 0 while the
  // helpers join their MoE exchanges.
  const std::string id = par.add_request(prompts[count], params[size_t(count)]);
  std::vector<int32_t> streamed;
  for (int guard = 0; par.has_unfinished() && guard < 1000; ++guard)
    for (const RequestOutput& o : par.step())
      if (o.request_id == id) streamed = o.outputs.at(0).token_ids;
  EXPECT_EQ(streamed, ref[size_t(count)].outputs.at(0).token_ids);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ContextParallelLLM,
                         ::testing::Values(CpLayout{2, 0}, CpLayout{3, 0}, CpLayout{2, 2}, CpLayout{3, 3},
                                           CpLayout{3, 3, true}, CpLayout{2, 0, false, 2}, CpLayout{2, 2, false, 2},
                                           CpLayout{2, 2, true, 3}),
                         [](const auto& info) {
                           return (info.param.dp > 1 ? "dp" + std::to_string(info.param.dp) + "_" : std::string()) +
                                  "cp" + std::to_string(info.param.cp) + "_ep" + std::to_string(info.param.ep) +
                                  (info.param.eplb ? "_eplb" : "");
                         });

// On GPU ranks the experts cannot be sharded over the CP group yet: refused before any rank starts,
// naming both fields (checked without a GPU too: the layout is validated first).
TEST(ContextParallelLLM, GpuRanksRefuseExpertsShardedOverTheGroup) {
  LLMConfig c = config(tiny_model(), 1, 2);
  c.accelerator = "nvidia";
  c.context_parallel_size = 2, c.context_parallel_min_tokens = 16, c.worker_command = worker();
  try {
    LLM par(c);
    FAIL() << "accepted cp 2 ep 2 on GPU ranks";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("context_parallel_size=2 with expert_parallel_size=2"), std::string::npos) << m;
    EXPECT_NE(m.find("CPU backend only"), std::string::npos) << m;
  }
}

// A request the engine refuses (a token id outside the vocabulary) fails alone under context and
// expert parallelism (one CP group; two as data-parallel ranks): the others run to the end.
TEST(ContextParallelLLM, BadRequestFailsAlone) {
  if (!std::filesystem::exists(tiny_model() + "/config.json")) GTEST_SKIP() << "fixture absent";
  for (int dp : {1, 2}) {
    LLMConfig c = cpu_config(tiny_model(), dp, 2);
    c.context_parallel_size = 2, c.context_parallel_min_tokens = 16, c.worker_command = worker();
    LLM par(c);
    const int64_t vocab = par.vocab_size();
    std::vector<PromptInput> prompts = token_prompts(vocab, 5);
    prompts[3].token_ids[2] = int32_t(vocab + 9);
    std::vector<RequestOutput> got = par.generate(prompts, params_for(5));
    ASSERT_EQ(got.size(), 5u);
    EXPECT_NE(got[3].error.find("outside [0, " + std::to_string(vocab) + ")"), std::string::npos) << got[3].error;
    for (int i : {0, 1, 2, 4}) {
      EXPECT_TRUE(got[size_t(i)].error.empty()) << "dp " << dp << ": " << got[size_t(i)].error;
      ASSERT_EQ(got[size_t(i)].outputs.size(), 1u);
      EXPECT_EQ(got[size_t(i)].outputs[0].token_ids.size(), size_t(params_for(5)[size_t(i)].max_tokens.value())) << "dp " << dp;
    }
  }
}

TEST(ContextParallelLLM, BadLayoutsRefused) {
  LLMConfig c;
  // Experts sharded over another group than each CP group's ranks (also across the data-parallel
  // groups): refused, naming both fields.
  for (auto [dp, cp, ep] : {std::tuple{1, 2, 3}, std::tuple{1, 3, 2}, std::tuple{1, 4, 2}, std::tuple{2, 2, 4}}) {
    c = cpu_config(tiny_model(), dp, ep);
    c.context_parallel_size = cp, c.context_parallel_min_tokens = 16;
    try {
      LLM bad(c);
      ADD_FAILURE() << "dp " << dp << " cp " << cp << " with ep " << ep << " accepted";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("context_parallel_size=" + std::to_string(cp)), std::string::npos) << msg;
      EXPECT_NE(msg.find("expert_parallel_size=" + std::to_string(ep)), std::string::npos) << msg;
    }
  }
  c = cpu_config(tiny_model(), 1, 0);
  c.context_parallel_size = 2, c.context_parallel_min_tokens = 1;
  EXPECT_THROW(LLM{c}, InvalidArgument);
  c.context_parallel_min_tokens = 16, c.enable_eplb = true;  // nothing sharded: EPLB refused, not ignored
  EXPECT_THROW(LLM{c}, InvalidArgument);
  c.enable_eplb = false;
  c.context_parallel_size = 0;
  EXPECT_THROW(LLM{c}, InvalidArgument);
}
}  // namespace
}  // namespace deepinfer
