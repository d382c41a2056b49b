// See codec.h. Fields go in declaration order; get_* reads them back the same way.
#include "engine/dp/codec.h"

#include "core/check.h"

namespace deepinfer::engine::dp {
namespace {
using parallel::WireReader;
using parallel::WireWriter;

// A struct that grows a field must grow its codec too (these sizes are libstdc++ x86-64's).
static_assert(sizeof(RequestMetrics) == 128, "RequestMetrics changed: update engine/dp/codec.cpp");
static_assert(sizeof(Logprob) == 40, "Logprob changed: update engine/dp/codec.cpp");
static_assert(sizeof(StructuredOutputsParams) == 232, "StructuredOutputsParams changed: update engine/dp/codec.cpp");
static_assert(sizeof(SamplingParams) == 408, "SamplingParams changed: update engine/dp/codec.cpp");
static_assert(sizeof(CompletionOutput) == 192, "CompletionOutput changed: update engine/dp/codec.cpp");
static_assert(sizeof(RequestOutput) == 320, "RequestOutput changed: update engine/dp/codec.cpp");
static_assert(sizeof(LLMConfig) == 248, "LLMConfig changed: update engine/dp/codec.cpp");
static_assert(sizeof(PromptInput) == 64, "PromptInput changed: update engine/dp/codec.cpp");

void put_logprobs(WireWriter& w, const PositionLogprobs& pl) {
  w.put<uint64_t>(pl.size());
  for (const auto& [id, lp] : pl) {
    w.put<int32_t>(id);
    w.put<float>(lp.logprob);
    w.put<int32_t>(lp.rank);
    w.put_str(lp.decoded_token);
  }
}

PositionLogprobs get_logprobs(WireReader& r) {
  const uint64_t n = r.count(4 + 4 + 4 + 8, "logprobs");
  PositionLogprobs pl;
  pl.reserve(size_t(n));
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t id = r.get<int32_t>("logprob token");
    Logprob lp;
    lp.logprob = r.get<float>("logprob");
    lp.rank = r.get<int32_t>("logprob rank");
    lp.decoded_token = r.get_str("logprob decoded_token");
    pl.emplace_back(id, std::move(lp));
  }
  return pl;
}

void put_structured(WireWriter& w, const StructuredOutputsParams& s) {
  auto str = [&](const std::string& v) { w.put_str(v); };
  w.put_opt(s.json, str);
  w.put_opt(s.regex, str);
  w.put_opt(s.choice, [&](const std::vector<std::string>& v) { w.put_strs(v); });
  w.put_opt(s.grammar, str);
  w.put_bool(s.json_object);
  w.put_opt(s.tool_calls, str);
  w.put_vec(s.trigger_token_ids);
  w.put_opt(s.bound_token_id, [&](int32_t v) { w.put<int32_t>(v); });
}

StructuredOutputsParams get_structured(WireReader& r) {
  StructuredOutputsParams s;
  s.json = r.get_opt("so json", [&] { return r.get_str("so json"); });
  s.regex = r.get_opt("so regex", [&] { return r.get_str("so regex"); });
  s.choice = r.get_opt("so choice", [&] { return r.get_strs("so choice"); });
  s.grammar = r.get_opt("so grammar", [&] { return r.get_str("so grammar"); });
  s.json_object = r.get_bool("so json_object");
  s.tool_calls = r.get_opt("so tool_calls", [&] { return r.get_str("so tool_calls"); });
  s.trigger_token_ids = r.get_vec<int32_t>("so trigger_token_ids");
  s.bound_token_id = r.get_opt("so bound_token_id", [&] { return r.get<int32_t>("so bound_token_id"); });
  return s;
}

void put_completion(WireWriter& w, const CompletionOutput& c) {
  w.put<int32_t>(c.index);
  w.put_str(c.text);
  w.put_vec(c.token_ids);
  w.put_opt(c.cumulative_logprob, [&](double v) { w.put<double>(v); });
  w.put_opt(c.logprobs, [&](const std::vector<PositionLogprobs>& v) {
    w.put<uint64_t>(v.size());
    for (const PositionLogprobs& pl : v) put_logprobs(w, pl);
  });
  w.put_str(c.finish_reason);
  w.put_opt(c.stop_token_id, [&](int32_t v) { w.put<int32_t>(v); });
  w.put_opt(c.stop_string, [&](const std::string& v) { w.put_str(v); });
}

CompletionOutput get_completion(WireReader& r) {
  CompletionOutput c;
  c.index = r.get<int32_t>("completion index");
  c.text = r.get_str("completion text");
  c.token_ids = r.get_vec<int32_t>("completion token_ids");
  c.cumulative_logprob = r.get_opt("cumulative_logprob", [&] { return r.get<double>("cumulative_logprob"); });
  c.logprobs = r.get_opt("completion logprobs", [&] {
    const uint64_t n = r.count(8, "completion logprobs");
    std::vector<PositionLogprobs> v;
    v.reserve(size_t(n));
    for (uint64_t i = 0; i < n; ++i) v.push_back(get_logprobs(r));
    return v;
  });
  c.finish_reason = r.get_str("finish_reason");
  c.stop_token_id = r.get_opt("stop_token_id", [&] { return r.get<int32_t>("stop_token_id"); });
  c.stop_string = r.get_opt("stop_string", [&] { return r.get_str("stop_string"); });
  return c;
}
}  // namespace

void put(WireWriter& w, const LLMConfig& c) {
  w.put_str(c.model);
  w.put_str(c.tokenizer);
  w.put_bool(c.skip_tokenizer_init);
  w.put<int64_t>(c.max_model_len);
  w.put<int64_t>(c.max_num_seqs);
  w.put<int64_t>(c.max_num_batched_tokens);
  w.put_bool(c.enable_chunked_prefill);
  w.put<uint64_t>(c.kv_cache_memory_bytes);
  w.put<uint64_t>(c.seed);
  w.put<int32_t>(c.max_n);
  w.put<int32_t>(c.max_logprobs);
  w.put_str(c.accelerator);
  w.put_bool(c.enable_prefix_caching);
  w.put<int64_t>(c.prefix_checkpoint_blocks);
  w.put<uint64_t>(c.prefix_host_cache_bytes);
  w.put<int32_t>(c.data_parallel_size);
  w.put<int32_t>(c.expert_parallel_size);
  w.put<int32_t>(c.num_redundant_experts);
  w.put_bool(c.enable_eplb);
  w.put<int32_t>(c.eplb_window_size);
  w.put<int32_t>(c.eplb_step_interval);
  w.put<int32_t>(c.context_parallel_size);
  w.put<int64_t>(c.context_parallel_min_tokens);
  w.put_strs(c.worker_command);
}

LLMConfig get_llm_config(WireReader& r) {
  LLMConfig c;
  c.model = r.get_str("model");
  c.tokenizer = r.get_str("tokenizer");
  c.skip_tokenizer_init = r.get_bool("skip_tokenizer_init");
  c.max_model_len = r.get<int64_t>("max_model_len");
  c.max_num_seqs = r.get<int64_t>("max_num_seqs");
  c.max_num_batched_tokens = r.get<int64_t>("max_num_batched_tokens");
  c.enable_chunked_prefill = r.get_bool("enable_chunked_prefill");
  c.kv_cache_memory_bytes = size_t(r.get<uint64_t>("kv_cache_memory_bytes"));
  c.seed = r.get<uint64_t>("seed");
  c.max_n = r.get<int32_t>("max_n");
  c.max_logprobs = r.get<int32_t>("max_logprobs");
  c.accelerator = r.get_str("accelerator");
  c.enable_prefix_caching = r.get_bool("enable_prefix_caching");
  c.prefix_checkpoint_blocks = r.get<int64_t>("prefix_checkpoint_blocks");
  c.prefix_host_cache_bytes = size_t(r.get<uint64_t>("prefix_host_cache_bytes"));
  c.data_parallel_size = r.get<int32_t>("data_parallel_size");
  c.expert_parallel_size = r.get<int32_t>("expert_parallel_size");
  c.num_redundant_experts = r.get<int32_t>("num_redundant_experts");
  c.enable_eplb = r.get_bool("enable_eplb");
  c.eplb_window_size = r.get<int32_t>("eplb_window_size");
  c.eplb_step_interval = r.get<int32_t>("eplb_step_interval");
  c.context_parallel_size = r.get<int32_t>("context_parallel_size");
  c.context_parallel_min_tokens = r.get<int64_t>("context_parallel_min_tokens");
  c.worker_command = r.get_strs("worker_command");
  return c;
}

void put(WireWriter& w, const PromptInput& p) {
  w.put_str(p.text);
  w.put_vec(p.token_ids);
  w.put_bool(p.is_token_ids);
}

PromptInput get_prompt(WireReader& r) {
  PromptInput p;
  p.text = r.get_str("prompt text");
  p.token_ids = r.get_vec<int32_t>("prompt token_ids");
  p.is_token_ids = r.get_bool("prompt is_token_ids");
  return p;
}

void put(WireWriter& w, const SamplingParams& p) {
  w.put<int32_t>(p.n);
  w.put<float>(p.temperature);
  w.put<float>(p.top_p);
  w.put<int32_t>(p.top_k);
  w.put<float>(p.min_p);
  w.put<float>(p.presence_penalty);
  w.put<float>(p.frequency_penalty);
  w.put<float>(p.repetition_penalty);
  w.put<uint64_t>(p.logit_bias.size());
  for (const auto& [id, b] : p.logit_bias) w.put<int32_t>(id), w.put<float>(b);
  w.put_opt(p.seed, [&](uint64_t v) { w.put<uint64_t>(v); });
  w.put_opt(p.max_tokens, [&](int v) { w.put<int32_t>(v); });
  w.put<int32_t>(p.min_tokens);
  w.put_strs(p.stop);
  w.put_vec(p.stop_token_ids);
  w.put_bool(p.include_stop_str_in_output);
  w.put_bool(p.ignore_eos);
  w.put_opt(p.logprobs, [&](int v) { w.put<int32_t>(v); });
  w.put_opt(p.prompt_logprobs, [&](int v) { w.put<int32_t>(v); });
  w.put_bool(p.skip_special_tokens);
  w.put_bool(p.detokenize);
  w.put<int32_t>(int32_t(p.output_kind));
  w.put_opt(p.structured_outputs, [&](const StructuredOutputsParams& s) { put_structured(w, s); });
}

SamplingParams get_sampling_params(WireReader& r) {
  SamplingParams p;
  p.n = r.get<int32_t>("n");
  p.temperature = r.get<float>("temperature");
  p.top_p = r.get<float>("top_p");
  p.top_k = r.get<int32_t>("top_k");
  p.min_p = r.get<float>("min_p");
  p.presence_penalty = r.get<float>("presence_penalty");
  p.frequency_penalty = r.get<float>("frequency_penalty");
  p.repetition_penalty = r.get<float>("repetition_penalty");
  const uint64_t nb = r.count(8, "logit_bias");
  for (uint64_t i = 0; i < nb; ++i) {
    const int32_t id = r.get<int32_t>("logit_bias token");
    p.logit_bias.emplace_back(id, r.get<float>("logit_bias value"));
  }
  p.seed = r.get_opt("seed", [&] { return r.get<uint64_t>("seed"); });
  p.max_tokens = r.get_opt("max_tokens", [&] { return int(r.get<int32_t>("max_tokens")); });
  p.min_tokens = r.get<int32_t>("min_tokens");
  p.stop = r.get_strs("stop");
  p.stop_token_ids = r.get_vec<int32_t>("stop_token_ids");
  p.include_stop_str_in_output = r.get_bool("include_stop_str_in_output");
  p.ignore_eos = r.get_bool("ignore_eos");
  p.logprobs = r.get_opt("logprobs", [&] { return int(r.get<int32_t>("logprobs")); });
  p.prompt_logprobs = r.get_opt("prompt_logprobs", [&] { return int(r.get<int32_t>("prompt_logprobs")); });
  p.skip_special_tokens = r.get_bool("skip_special_tokens");
  p.detokenize = r.get_bool("detokenize");
  const int32_t kind = r.get<int32_t>("output_kind");
  if (kind < 0 || kind > int32_t(OutputKind::kFinalOnly)) DI_THROW(InternalError, "wire: output_kind ", kind);
  p.output_kind = OutputKind(kind);
  p.structured_outputs = r.get_opt("structured_outputs", [&] { return get_structured(r); });
  return p;
}

void put(WireWriter& w, const RequestOutput& o) {
  w.put_str(o.request_id);
  w.put_str(o.prompt);
  w.put_vec(o.prompt_token_ids);
  w.put_opt(o.prompt_logprobs, [&](const std::vector<std::optional<PositionLogprobs>>& v) {
    w.put<uint64_t>(v.size());
    for (const auto& pl : v) w.put_opt(pl, [&](const PositionLogprobs& x) { put_logprobs(w, x); });
  });
  w.put<uint64_t>(o.outputs.size());
  for (const CompletionOutput& c : o.outputs) put_completion(w, c);
  w.put_bool(o.finished);
  w.put<int64_t>(o.num_cached_tokens);
  const RequestMetrics& m = o.metrics;
  for (double t : {m.arrival_time, m.first_scheduled_time, m.first_token_time, m.last_token_time, m.finished_time})
    w.put<double>(t);
  w.put<int64_t>(m.num_generation_tokens);
  w.put<int64_t>(m.num_preemptions);
  w.put<int64_t>(m.num_verify_steps);
  w.put<int64_t>(m.num_draft_tokens);
  w.put<int64_t>(m.num_accepted_draft_tokens);
  w.put_vec(m.draft_verified_per_position);
  w.put_vec(m.draft_accepted_per_position);
  w.put_str(o.error);
}

RequestOutput get_request_output(WireReader& r) {
  RequestOutput o;
  o.request_id = r.get_str("request_id");
  o.prompt = r.get_str("prompt");
  o.prompt_token_ids = r.get_vec<int32_t>("prompt_token_ids");
  o.prompt_logprobs = r.get_opt("prompt_logprobs", [&] {
    const uint64_t n = r.count(1, "prompt_logprobs");
    std::vector<std::optional<PositionLogprobs>> v;
    v.reserve(size_t(n));
    for (uint64_t i = 0; i < n; ++i) v.push_back(r.get_opt("prompt_logprobs entry", [&] { return get_logprobs(r); }));
    return v;
  });
  const uint64_t nc = r.count(1, "outputs");
  for (uint64_t i = 0; i < nc; ++i) o.outputs.push_back(get_completion(r));
  o.finished = r.get_bool("finished");
  o.num_cached_tokens = r.get<int64_t>("num_cached_tokens");
  RequestMetrics& m = o.metrics;
  for (double* t : {&m.arrival_time, &m.first_scheduled_time, &m.first_token_time, &m.last_token_time, &m.finished_time})
    *t = r.get<double>("metrics time");
  m.num_generation_tokens = r.get<int64_t>("num_generation_tokens");
  m.num_preemptions = r.get<int64_t>("num_preemptions");
  m.num_verify_steps = r.get<int64_t>("num_verify_steps");
  m.num_draft_tokens = r.get<int64_t>("num_draft_tokens");
  m.num_accepted_draft_tokens = r.get<int64_t>("num_accepted_draft_tokens");
  m.draft_verified_per_position = r.get_vec<int64_t>("draft_verified_per_position");
  m.draft_accepted_per_position = r.get_vec<int64_t>("draft_accepted_per_position");
  o.error = r.get_str("error");
  return o;
}

}  // namespace deepinfer::engine::dp
