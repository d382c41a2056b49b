// The data-parallel engine's wire formats and placement: every field of the API structs survives
// a round trip; a message cut at any byte, or with a corrupt length, is an InternalError naming
// the field, never a read past the end; placement goes by load, not round-robin.
#include <gtest/gtest.h>

#include <cstring>

#include "deepinfer/error.h"
#include "engine/dp/codec.h"
#include "engine/dp/dp_engine.h"
#include "engine/dp/ranks.h"

namespace deepinfer::engine::dp {
namespace {
using parallel::WireReader;
using parallel::WireWriter;

SamplingParams full_params() {
  SamplingParams p;
  p.n = 3, p.temperature = 0.7f, p.top_p = 0.9f, p.top_k = 17, p.min_p = 0.05f;
  p.presence_penalty = 0.5f, p.frequency_penalty = -0.25f, p.repetition_penalty = 1.1f;
  p.logit_bias = {{5, 1.5f}, {9, -100.f}};
  p.seed = 0xFFFFFFFFFFFFull;
  p.max_tokens = std::nullopt;
  p.min_tokens = 4;
  p.stop = {"\n\n", "END", ""};
  p.stop_token_ids = {1, 2};
  p.include_stop_str_in_output = true, p.ignore_eos = true;
  p.logprobs = 5, p.prompt_logprobs = 0;
  p.skip_special_tokens = false, p.detokenize = false;
  p.output_kind = OutputKind::kDelta;
  StructuredOutputsParams so;
  so.regex = "[a-z]+";
  so.choice = std::vector<std::string>{"yes", "no"};
  so.trigger_token_ids = {7, 8};
  so.bound_token_id = 3;
  p.structured_outputs = so;
  return p;
}

RequestOutput full_output() {
  RequestOutput o;
  o.request_id = "req-7";
  o.prompt = "h\xC3\xA9llo";
  o.prompt_token_ids = {4, 5, 6};
  PositionLogprobs pl{{4, {.logprob = -0.5f, .rank = 1, .decoded_token = "a"}}, {9, {-2.f, 3, ""}}};
  o.prompt_logprobs = std::vector<std::optional<PositionLogprobs>>{std::nullopt, pl, pl};
  CompletionOutput c;
  c.index = 1, c.text = "abc", c.token_ids = {10, 11};
  c.cumulative_logprob = -1.25;
  c.logprobs = std::vector<PositionLogprobs>{pl, {}};
  c.finish_reason = "stop", c.stop_token_id = 2, c.stop_string = "END";
  o.outputs = {CompletionOutput{}, c};
  o.finished = true;
  o.num_cached_tokens = 256;
  o.metrics = {.arrival_time = 1.5, .first_scheduled_time = 2, .first_token_time = 3, .last_token_time = 4,
               .finished_time = 5, .num_generation_tokens = 6, .num_preemptions = 1, .num_verify_steps = 7,
               .num_draft_tokens = 8, .num_accepted_draft_tokens = 9, .draft_verified_per_position = {4, 3},
               .draft_accepted_per_position = {2, 1}};
  o.error = "";
  return o;
}

bool same(const PositionLogprobs& a, const PositionLogprobs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].second.logprob != b[i].second.logprob || a[i].second.rank != b[i].second.rank ||
        a[i].second.decoded_token != b[i].second.decoded_token)
      return false;
  return true;
}

TEST(DpCodec, SamplingParamsRoundTrip) {
  const SamplingParams p = full_params();
  WireWriter w;
  put(w, p);
  WireReader r(w.bytes(), "test");
  const SamplingParams q = get_sampling_params(r);
  r.expect_done();
  EXPECT_EQ(q.n, p.n);
  EXPECT_EQ(q.temperature, p.temperature);
  EXPECT_EQ(q.top_p, p.top_p);
  EXPECT_EQ(q.top_k, p.top_k);
  EXPECT_EQ(q.min_p, p.min_p);
  EXPECT_EQ(q.presence_penalty, p.presence_penalty);
  EXPECT_EQ(q.frequency_penalty, p.frequency_penalty);
  EXPECT_EQ(q.repetition_penalty, p.repetition_penalty);
  EXPECT_EQ(q.logit_bias, p.logit_bias);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_EQ(q.max_tokens, p.max_tokens);
  EXPECT_EQ(q.min_tokens, p.min_tokens);
  EXPECT_EQ(q.stop, p.stop);
  EXPECT_EQ(q.stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(q.include_stop_str_in_output, p.include_stop_str_in_output);
  EXPECT_EQ(q.ignore_eos, p.ignore_eos);
  EXPECT_EQ(q.logprobs, p.logprobs);
  EXPECT_EQ(q.prompt_logprobs, p.prompt_logprobs);
  EXPECT_EQ(q.skip_special_tokens, p.skip_special_tokens);
  EXPECT_EQ(q.detokenize, p.detokenize);
  EXPECT_EQ(q.output_kind, p.output_kind);
  ASSERT_TRUE(q.structured_outputs);
  EXPECT_EQ(q.structured_outputs->regex, p.structured_outputs->regex);
  EXPECT_EQ(q.structured_outputs->choice, p.structured_outputs->choice);
  EXPECT_FALSE(q.structured_outputs->json);
  EXPECT_EQ(q.structured_outputs->trigger_token_ids, p.structured_outputs->trigger_token_ids);
  EXPECT_EQ(q.structured_outputs->bound_token_id, p.structured_outputs->bound_token_id);
}

TEST(DpCodec, RequestOutputRoundTrip) {
  const RequestOutput o = full_output();
  WireWriter w;
  put(w, o);
  WireReader r(w.bytes(), "test");
  const RequestOutput q = get_request_output(r);
  r.expect_done();
  EXPECT_EQ(q.request_id, o.request_id);
  EXPECT_EQ(q.prompt, o.prompt);
  EXPECT_EQ(q.prompt_token_ids, o.prompt_token_ids);
  ASSERT_TRUE(q.prompt_logprobs);
  ASSERT_EQ(q.prompt_logprobs->size(), 3u);
  EXPECT_FALSE((*q.prompt_logprobs)[0]);
  EXPECT_TRUE(same(*(*q.prompt_logprobs)[1], *(*o.prompt_logprobs)[1]));
  ASSERT_EQ(q.outputs.size(), 2u);
  const CompletionOutput &a = q.outputs[1], &b = o.outputs[1];
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.cumulative_logprob, b.cumulative_logprob);
  ASSERT_TRUE(a.logprobs);
  EXPECT_TRUE(same((*a.logprobs)[0], (*b.logprobs)[0]));
  EXPECT_TRUE((*a.logprobs)[1].empty());
  EXPECT_EQ(a.finish_reason, b.finish_reason);
  EXPECT_EQ(a.stop_token_id, b.stop_token_id);
  EXPECT_EQ(a.stop_string, b.stop_string);
  EXPECT_FALSE(q.outputs[0].cumulative_logprob);
  EXPECT_TRUE(q.finished);
  EXPECT_EQ(q.num_cached_tokens, 256);
  EXPECT_EQ(q.metrics.arrival_time, 1.5);
  EXPECT_EQ(q.metrics.finished_time, 5);
  EXPECT_EQ(q.metrics.num_generation_tokens, 6);
  EXPECT_EQ(q.metrics.num_preemptions, 1);
  EXPECT_EQ(q.metrics.num_verify_steps, 7);
  EXPECT_EQ(q.metrics.num_draft_tokens, 8);
  EXPECT_EQ(q.metrics.num_accepted_draft_tokens, 9);
  EXPECT_EQ(q.metrics.draft_verified_per_position, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(q.metrics.draft_accepted_per_position, (std::vector<int64_t>{2, 1}));
}

TEST(DpCodec, LLMConfigAndCommandsRoundTrip) {
  LLMConfig c;
  c.model = "/m", c.tokenizer = "/t", c.skip_tokenizer_init = true, c.max_model_len = 77, c.max_num_seqs = 5;
  c.max_num_batched_tokens = 99, c.enable_chunked_prefill = false, c.kv_cache_memory_bytes = size_t(3) << 33;
  c.seed = 42, c.max_n = 3, c.max_logprobs = 2, c.accelerator = "cpu", c.data_parallel_size = 4;
  c.expert_parallel_size = 2, c.worker_command = {"a b", "c"};
  c.enable_prefix_caching = false, c.prefix_checkpoint_blocks = 5, c.prefix_host_cache_bytes = 12345;
  c.num_redundant_experts = 3, c.enable_eplb = true, c.eplb_window_size = 17, c.eplb_step_interval = 19;
  c.context_parallel_size = 3, c.context_parallel_min_tokens = 77;
  WireWriter w;
  put(w, c);
  Commands cmd;
  cmd.add.push_back({.rank = 2, .id = "x", .arrival = 9.5, .prompt = PromptInput::from_text("hi"), .params = full_params()});
  cmd.abort = {{1, "y"}};
  put(w, cmd);
  WireReader r(w.bytes(), "test");
  const LLMConfig d = get_llm_config(r);
  const Commands e = get_commands(r);
  r.expect_done();
  EXPECT_EQ(d.model, c.model);
  EXPECT_EQ(d.tokenizer, c.tokenizer);
  EXPECT_EQ(d.skip_tokenizer_init, true);
  EXPECT_EQ(d.max_model_len, 77);
  EXPECT_EQ(d.max_num_seqs, 5);
  EXPECT_EQ(d.max_num_batched_tokens, 99);
  EXPECT_FALSE(d.enable_chunked_prefill);
  EXPECT_EQ(d.kv_cache_memory_bytes, c.kv_cache_memory_bytes);
  EXPECT_EQ(d.seed, 42u);
  EXPECT_EQ(d.max_n, 3);
  EXPECT_EQ(d.max_logprobs, 2);
  EXPECT_EQ(d.accelerator, "cpu");
  EXPECT_EQ(d.data_parallel_size, 4);
  EXPECT_EQ(d.expert_parallel_size, 2);
  EXPECT_EQ(d.worker_command, c.worker_command);
  EXPECT_FALSE(d.enable_prefix_caching);
  EXPECT_EQ(d.prefix_checkpoint_blocks, 5);
  EXPECT_EQ(d.prefix_host_cache_bytes, 12345u);
  EXPECT_EQ(d.num_redundant_experts, 3);
  EXPECT_TRUE(d.enable_eplb);
  EXPECT_EQ(d.eplb_window_size, 17);
  EXPECT_EQ(d.eplb_step_interval, 19);
  EXPECT_EQ(d.context_parallel_size, 3);
  EXPECT_EQ(d.context_parallel_min_tokens, 77);
  ASSERT_EQ(e.add.size(), 1u);
  EXPECT_EQ(e.add[0].rank, 2);
  EXPECT_EQ(e.add[0].id, "x");
  EXPECT_EQ(e.add[0].arrival, 9.5);
  EXPECT_EQ(e.add[0].prompt.text, "hi");
  EXPECT_FALSE(e.add[0].prompt.is_token_ids);
  EXPECT_EQ(e.add[0].params.top_k, 17);
  EXPECT_EQ(e.abort, cmd.abort);
  EXPECT_FALSE(e.shutdown);
}

// Every proper prefix of a message is refused with an InternalError (no crash, no over-read:
// run under ASan in the sanitizer job); a huge corrupt length is refused without allocating it.
TEST(DpCodec, TruncatedAndCorruptMessagesRefused) {
  WireWriter w;
  put(w, full_output());
  const std::vector<uint8_t> bytes = w.bytes();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + int64_t(cut));
    WireReader r(part, "cut message");
    EXPECT_THROW(get_request_output(r), InternalError) << "cut at " << cut;
  }
  std::vector<uint8_t> corrupt = bytes;
  const uint64_t huge = uint64_t(1) << 60;
  std::memcpy(corrupt.data(), &huge, sizeof huge);  // the request id's length
  WireReader r(corrupt, "corrupt message");
  try {
    get_request_output(r);
    FAIL() << "accepted a 2^60-byte string";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("request_id"), std::string::npos) << e.what();
  }
  WireWriter extra;
  put(extra, full_output());
  extra.put<int32_t>(1);
  WireReader rx(extra.bytes(), "long message");
  get_request_output(rx);
  EXPECT_THROW(rx.expect_done(), InternalError);
}

// The same codec reads other servers' messages (the KV hand-off) as WireSource::kPeer: the same
// faults are then InvalidArgument (bad input), with the message's name in front.
TEST(DpCodec, PeerMessagesFailAsInvalidArgument) {
  WireWriter w;
  const char magic[4] = {'a', 'b', 'c', 'd'};
  w.put_raw(magic, sizeof magic);
  w.put_vec(std::vector<int32_t>{5, -7, 11});
  w.put_str("tail");
  const std::vector<uint8_t> bytes = w.bytes();
  {
    WireReader r(bytes, "peer hello", parallel::WireSource::kPeer);
    char m[4];
    r.get_raw(m, sizeof m, "magic");
    EXPECT_EQ(std::memcmp(m, magic, 4), 0);
    EXPECT_EQ(r.offset(), 4u);
    EXPECT_EQ(r.get_vec<int32_t>("ids"), (std::vector<int32_t>{5, -7, 11}));
    EXPECT_EQ(r.rest().size(), 8u + 4u);
    EXPECT_EQ(r.get_str("tail"), "tail");
    r.expect_done();
  }
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + int64_t(cut));
    WireReader r(part, "peer hello", parallel::WireSource::kPeer);
    try {
      char m[4];
      r.get_raw(m, sizeof m, "magic");
      r.get_vec<int32_t>("ids");
      r.get_str("tail");
      FAIL() << "cut at " << cut << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("peer hello: ", 0), 0u) << e.what();
    }
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  WireReader r(longer, "peer hello", parallel::WireSource::kPeer);
  r.get_raw(nullptr, 0, "nothing");
  r.get_raw(std::vector<char>(4).data(), 4, "magic");
  r.get_vec<int32_t>("ids");
  r.get_str("tail");
  EXPECT_THROW(r.expect_done(), InvalidArgument);
  EXPECT_THROW(r.fail("by hand"), InvalidArgument);
  WireReader rank(longer, "rank message");
  EXPECT_THROW(rank.fail("by hand"), InternalError);
}

// The device (NCCL) expert exchange only when every rank is capable and has a GPU of its own:
// ranks sharing one GPU on a host (NCCL refuses them; one H200's tests) stay host-staged.
TEST(DpPlacement, DeviceExpertExchangeNeedsOneGpuPerRank) {
  const EpSeat a{.host = 1, .device = 0, .capable = true}, b{.host = 1, .device = 1, .capable = true};
  const EpSeat other_host{.host = 2, .device = 0, .capable = true};
  EXPECT_TRUE(ep_device_exchange(std::vector<EpSeat>{a, b}));
  EXPECT_TRUE(ep_device_exchange(std::vector<EpSeat>{a, b, other_host}));
  EXPECT_FALSE(ep_device_exchange(std::vector<EpSeat>{a, b, a})) << "two ranks on GPU 0 of host 1";
  EpSeat cpu = b;
  cpu.capable = false;
  EXPECT_FALSE(ep_device_exchange(std::vector<EpSeat>{a, cpu}));
  EXPECT_FALSE(ep_device_exchange(std::vector<EpSeat>{}));
  EXPECT_TRUE(ep_device_exchange(std::vector<EpSeat>{a}));
}

RankLoad load(int64_t running, int64_t waiting, int64_t free_blocks, int64_t total) {
  RankLoad l;
  l.sched.running_tokens = running, l.sched.waiting_tokens = waiting;
  l.kv_blocks_free = free_blocks, l.kv_blocks_total = total;
  return l;
}

TEST(DpPlacement, LeastWorkThenKvThenRank) {
  std::vector<RankLoad> loads{load(100, 0, 10, 20), load(40, 30, 5, 20), load(50, 20, 15, 20)};
  EXPECT_EQ(pick_rank(loads, std::vector<int64_t>{0, 0, 0}), 2);    // 100 vs 70 vs 70: rank 2 has freer KV
  loads[2].kv_blocks_free = 5;
  EXPECT_EQ(pick_rank(loads, std::vector<int64_t>{0, 0, 0}), 1);    // all tied: the lower rank
  EXPECT_EQ(pick_rank(loads, std::vector<int64_t>{0, 40, 0}), 2);   // pending prompts count
  EXPECT_EQ(pick_rank(loads, std::vector<int64_t>{0, 40, 31}), 0);
  EXPECT_THROW(pick_rank(loads, std::vector<int64_t>{0, 0}), InvalidArgument);
  EXPECT_THROW(pick_rank({}, {}), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::engine::dp
