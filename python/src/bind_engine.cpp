// deepinfer._C.engine: thin nanobind layer over include/deepinfer/{llm,sampling_params,outputs}.h.
// The vLLM-shaped Python classes live in python/deepinfer/{llm,sampling_params,outputs}.py.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "binder.h"
#include "deepinfer/llm.h"
#include "engine/dp/ranks.h"
#include "engine/toy_model.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace deepinfer::py {
namespace {
void bind_params(nb::module_& m) {
  nb::class_<StructuredOutputsParams>(m, "StructuredOutputsParams")
      .def(nb::init<>())
      .def_rw("json", &StructuredOutputsParams::json)
      .def_rw("regex", &StructuredOutputsParams::regex)
      .def_rw("choice", &StructuredOutputsParams::choice)
      .def_rw("grammar", &StructuredOutputsParams::grammar)
      .def_rw("json_object", &StructuredOutputsParams::json_object)
      .def_rw("tool_calls", &StructuredOutputsParams::tool_calls)
      .def_rw("trigger_token_ids", &StructuredOutputsParams::trigger_token_ids)
      .def_rw("bound_token_id", &StructuredOutputsParams::bound_token_id);
  nb::enum_<OutputKind>(m, "OutputKind")
      .value("CUMULATIVE", OutputKind::kCumulative)
      .value("DELTA", OutputKind::kDelta)
      .value("FINAL_ONLY", OutputKind::kFinalOnly);
  nb::class_<SamplingParams>(m, "SamplingParams")
      .def(nb::init<>())
      .def_rw("n", &SamplingParams::n)
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("logit_bias", &SamplingParams::logit_bias)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("max_tokens", &SamplingParams::max_tokens)
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("stop", &SamplingParams::stop)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("include_stop_str_in_output", &SamplingParams::include_stop_str_in_output)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def_rw("prompt_logprobs", &SamplingParams::prompt_logprobs)
      .def_rw("skip_special_tokens", &SamplingParams::skip_special_tokens)
      .def_rw("detokenize", &SamplingParams::detokenize)
      .def_rw("output_kind", &SamplingParams::output_kind)
      .def_rw("structured_outputs", &SamplingParams::structured_outputs)
      .def("validate", &SamplingParams::validate, "vocab_size"_a);
}

void bind_outputs(nb::module_& m) {
  nb::class_<Logprob>(m, "Logprob")
      .def_ro("logprob", &Logprob::logprob)
      .def_ro("rank", &Logprob::rank)
      .def_ro("decoded_token", &Logprob::decoded_token);
  nb::class_<CompletionOutput>(m, "CompletionOutput")
      .def_ro("index", &CompletionOutput::index)
      .def_ro("text", &CompletionOutput::text)
      .def_ro("token_ids", &CompletionOutput::token_ids)
      .def_ro("cumulative_logprob", &CompletionOutput::cumulative_logprob)
      .def_ro("logprobs", &CompletionOutput::logprobs)
      .def_ro("finish_reason", &CompletionOutput::finish_reason)
      .def_ro("stop_token_id", &CompletionOutput::stop_token_id)
      .def_ro("stop_string", &CompletionOutput::stop_string);
  nb::class_<RequestMetrics>(m, "RequestMetrics")
      .def_ro("arrival_time", &RequestMetrics::arrival_time)
      .def_ro("first_scheduled_time", &RequestMetrics::first_scheduled_time)
      .def_ro("first_token_time", &RequestMetrics::first_token_time)
      .def_ro("last_token_time", &RequestMetrics::last_token_time)
      .def_ro("finished_time", &RequestMetrics::finished_time)
      .def_ro("num_generation_tokens", &RequestMetrics::num_generation_tokens)
      .def_ro("num_preemptions", &RequestMetrics::num_preemptions)
      .def_ro("num_verify_steps", &RequestMetrics::num_verify_steps)
      .def_ro("num_draft_tokens", &RequestMetrics::num_draft_tokens)
      .def_ro("num_accepted_draft_tokens", &RequestMetrics::num_accepted_draft_tokens)
      .def_ro("draft_verified_per_position", &RequestMetrics::draft_verified_per_position)
      .def_ro("draft_accepted_per_position", &RequestMetrics::draft_accepted_per_position);
  nb::class_<RequestOutput>(m, "RequestOutput")
      .def_ro("request_id", &RequestOutput::request_id)
      .def_ro("prompt", &RequestOutput::prompt)
      .def_ro("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_ro("prompt_logprobs", &RequestOutput::prompt_logprobs)
      .def_ro("outputs", &RequestOutput::outputs)
      .def_ro("finished", &RequestOutput::finished)
      .def_ro("metrics", &RequestOutput::metrics)
      .def_ro("num_cached_tokens", &RequestOutput::num_cached_tokens)
      .def_ro("error", &RequestOutput::error);
  nb::class_<OpTiming>(m, "OpTiming")
      .def_ro("op", &OpTiming::op)
      .def_ro("calls", &OpTiming::calls)
      .def_ro("ms", &OpTiming::ms)
      .def("__repr__", [](const OpTiming& o) {
        return "OpTiming(op='" + o.op + "', calls=" + std::to_string(o.calls) + ", ms=" + std::to_string(o.ms) + ")";
      });
  nb::class_<GenerateSummary>(m, "GenerateSummary")
      .def_ro("num_requests", &GenerateSummary::num_requests)
      .def_ro("num_failed", &GenerateSummary::num_failed)
      .def_ro("num_prompt_tokens", &GenerateSummary::num_prompt_tokens)
      .def_ro("num_output_tokens", &GenerateSummary::num_output_tokens)
      .def_ro("elapsed_s", &GenerateSummary::elapsed_s)
      .def_ro("mean_ttft_s", &GenerateSummary::mean_ttft_s)
      .def_ro("mean_tpot_s", &GenerateSummary::mean_tpot_s)
      .def_ro("output_tokens_per_s", &GenerateSummary::output_tokens_per_s)
      .def_ro("total_tokens_per_s", &GenerateSummary::total_tokens_per_s)
      .def_ro("num_preemptions", &GenerateSummary::num_preemptions)
      .def_ro("num_steps", &GenerateSummary::num_steps)
      .def_ro("num_draft_tokens", &GenerateSummary::num_draft_tokens)
      .def_ro("num_accepted_draft_tokens", &GenerateSummary::num_accepted_draft_tokens)
      .def_ro("num_verify_steps", &GenerateSummary::num_verify_steps)
      .def_ro("acceptance_length", &GenerateSummary::acceptance_length)
      .def_ro("acceptance_rate_per_position", &GenerateSummary::acceptance_rate_per_position)
      .def_ro("draft_time_s", &GenerateSummary::draft_time_s)
      .def_ro("verify_time_s", &GenerateSummary::verify_time_s)
      .def_ro("num_cached_tokens", &GenerateSummary::num_cached_tokens)
      .def_ro("prefix_hit_rate", &GenerateSummary::prefix_hit_rate)
      .def_ro("num_checkpoints", &GenerateSummary::num_checkpoints)
      .def_ro("checkpoint_bytes", &GenerateSummary::checkpoint_bytes)
      .def_ro("host_blocks_spilled", &GenerateSummary::host_blocks_spilled)
      .def_ro("host_blocks_loaded", &GenerateSummary::host_blocks_loaded)
      .def("__str__", &GenerateSummary::str);
}

// LLM.generate without the GIL, polling for Ctrl-C between engine steps. The poll takes the
// GIL briefly; a pending KeyboardInterrupt is fetched there (PyErr_CheckSignals raises it in
// this thread), the C++ call aborts its requests and returns, and the interrupt is re-raised.
std::vector<RequestOutput> generate(LLM& l, const std::vector<PromptInput>& prompts,
                                    const std::vector<SamplingParams>& params, bool progress_bar) {
  GenerateOptions o;
  o.progress_bar = progress_bar;
  std::optional<nb::python_error> interrupted;
  o.should_cancel = [&interrupted] {
    nb::gil_scoped_acquire g;
    if (PyErr_CheckSignals() == 0) return false;
    interrupted.emplace();  // takes the pending exception out of the thread state
    return true;
  };
  std::vector<RequestOutput> out;
  {
    nb::gil_scoped_release g;
    out = l.generate(prompts, params, o);
  }
  if (interrupted) throw *interrupted;
  return out;
}

void bind_llm(nb::module_& m) {
  nb::class_<LLMConfig>(m, "LLMConfig")
      .def(nb::init<>())
      .def_rw("model", &LLMConfig::model)
      .def_rw("tokenizer", &LLMConfig::tokenizer)
      .def_rw("skip_tokenizer_init", &LLMConfig::skip_tokenizer_init)
      .def_rw("max_model_len", &LLMConfig::max_model_len)
      .def_rw("max_num_seqs", &LLMConfig::max_num_seqs)
      .def_rw("max_num_batched_tokens", &LLMConfig::max_num_batched_tokens)
      .def_rw("enable_chunked_prefill", &LLMConfig::enable_chunked_prefill)
      .def_rw("kv_cache_memory_bytes", &LLMConfig::kv_cache_memory_bytes)
      .def_rw("seed", &LLMConfig::seed)
      .def_rw("max_n", &LLMConfig::max_n)
      .def_rw("max_logprobs", &LLMConfig::max_logprobs)
      .def_rw("accelerator", &LLMConfig::accelerator)
      .def_rw("enable_prefix_caching", &LLMConfig::enable_prefix_caching)
      .def_rw("prefix_checkpoint_blocks", &LLMConfig::prefix_checkpoint_blocks)
      .def_rw("prefix_host_cache_bytes", &LLMConfig::prefix_host_cache_bytes)
      .def_rw("data_parallel_size", &LLMConfig::data_parallel_size)
      .def_rw("expert_parallel_size", &LLMConfig::expert_parallel_size)
      .def_rw("worker_command", &LLMConfig::worker_command)
      .def_rw("num_redundant_experts", &LLMConfig::num_redundant_experts)
      .def_rw("enable_eplb", &LLMConfig::enable_eplb)
      .def_rw("eplb_window_size", &LLMConfig::eplb_window_size)
      .def_rw("eplb_step_interval", &LLMConfig::eplb_step_interval)
      .def_rw("context_parallel_size", &LLMConfig::context_parallel_size)
      .def_rw("context_parallel_min_tokens", &LLMConfig::context_parallel_min_tokens);
  // `python -m deepinfer._rank_worker`: a worker rank of a parallel LLM (engine/dp/ranks.h).
  m.def("rank_worker_main", [] {
    nb::gil_scoped_release unlocked;
    return deepinfer::engine::dp::rank_worker_main();
  });
  nb::class_<PromptInput>(m, "PromptInput")
      .def_static("from_text", &PromptInput::from_text)
      .def_static("from_token_ids", &PromptInput::from_token_ids);
  nb::class_<ChatMessage>(m, "ChatMessage")
      .def("__init__", [](ChatMessage* c, std::string role, std::string content) {
             new (c) ChatMessage{std::move(role), std::move(content)};
           }, "role"_a, "content"_a);
  nb::class_<LLM>(m, "LLM")
      .def("__init__", [](LLM* l, const LLMConfig& c) {
             nb::gil_scoped_release g;
             new (l) LLM(c);
           }, "config"_a)
      .def("generate", &generate, "prompts"_a, "params"_a, "progress_bar"_a = false,
           "Runs the requests without the GIL. Ctrl-C (KeyboardInterrupt) is checked before every engine step: it "
           "aborts this call's requests and is raised here.")
      .def("add_request", [](LLM& l, const PromptInput& prompt, const SamplingParams& params) {
             nb::gil_scoped_release g;  // admission may compile a grammar
             return l.add_request(prompt, params);
           }, "prompt"_a, "params"_a)
      .def("step", [](LLM& l) {
             nb::gil_scoped_release g;
             return l.step();
           })
      .def("abort_request", [](LLM& l, const std::string& id) {
             nb::gil_scoped_release g;  // waits for a step another thread may be running
             l.abort_request(id);
           }, "request_id"_a)
      .def("has_unfinished", [](const LLM& l) {
             nb::gil_scoped_release g;
             return l.has_unfinished();
           })
      .def("reserve_request_id", &LLM::reserve_request_id)
      .def("chat_prompt", [](const LLM& l, const std::vector<ChatMessage>& conv, bool add_generation_prompt, bool thinking) {
             ChatTemplateOptions o;
             o.add_generation_prompt = add_generation_prompt;
             o.thinking = thinking;
             return l.chat_prompt(conv, o);
           }, "conversation"_a, "add_generation_prompt"_a = true, "thinking"_a = false)
      .def("encode", &LLM::encode)
      .def("decode", &LLM::decode, "ids"_a, "skip_special_tokens"_a = true)
      .def("has_tokenizer", &LLM::has_tokenizer)
      .def("vocab_size", &LLM::vocab_size)
      .def("max_model_len", &LLM::max_model_len)
      .def("describe", &LLM::describe)
      .def("last_summary", &LLM::last_summary)
      .def("set_op_profiling", [](LLM& l, bool on) {
             nb::gil_scoped_release g;  // waits for a running step
             l.set_op_profiling(on);
           }, "on"_a)
      .def("take_op_profile", [](LLM& l) {
             nb::gil_scoped_release g;
             return l.take_op_profile();
           });
  // The toy model's logits from the token list alone: the oracle for Python API tests.
  m.def("toy_reference_logits", [](const std::vector<int32_t>& tokens) {
    engine::ToyModelConfig c;
    std::vector<float> flat = engine::ToyModel::reference_logits(c, tokens);
    std::vector<std::vector<float>> rows;
    for (size_t p = 0; p < tokens.size(); ++p)
      rows.emplace_back(flat.begin() + long(p * size_t(c.vocab_size)), flat.begin() + long((p + 1) * size_t(c.vocab_size)));
    return rows;
  });
}

void bind_engine(nb::module_& m) {
  nb::module_ e = m.def_submodule("engine", "deepinfer engine: LLM, SamplingParams, outputs (C++ side)");
  bind_params(e);
  bind_outputs(e);
  bind_llm(e);
}
}  // namespace
DI_PY_BINDER("engine", 50, bind_engine);
}  // namespace deepinfer::py
