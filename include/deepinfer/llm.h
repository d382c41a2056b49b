// deepinfer::LLM — offline inference, shaped like vLLM's LLM class.
//
//   deepinfer::LLM llm({.model = "/path/to/DeepSeek-V4-Flash"});
//   deepinfer::SamplingParams sp;  sp.temperature = 0;  sp.max_tokens = 64;
//   auto outs = llm.generate({deepinfer::PromptInput::text("Hello")}, {sp});
//
// One LLM owns one engine (scheduler, cache manager, model runner, sampler, output
// processing). generate() runs the engine until every request is done. A bad request
// (empty or too-long prompt, invalid sampling values, unknown structured-output spec) is
// returned with `error` set and never stops the others. Errors about the engine itself
// (missing checkpoint, bad config) throw deepinfer::Error subclasses from the constructor.
//
// Threads: every method may be called from several threads at once. Calls are concurrent,
// engine steps are serialised: one lock guards the engine, each step runs the requests of all
// callers in one batch, and its outputs go to the call that owns each request (generate(),
// chat(), or the add_request/step stream). Request ids come from one counter and never repeat
// within an LLM.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

struct LLMConfig {
  // Checkpoint folder. Empty: DEEPINFER_HF_MODEL_DIR, else the bundled default model (assets/default-model).
  // "builtin:toy" is a small deterministic model for tests (byte-level text).
  std::string model;
  std::string tokenizer;                 // tokenizer.json or folder; empty = the model folder
  bool skip_tokenizer_init = false;      // serve token ids only (no text in or out)
  int64_t max_model_len = 0;             // 0 = the model's (capped by what the cache holds)
  int64_t max_num_seqs = 64;             // sequences per step
  int64_t max_num_batched_tokens = 2048; // tokens per step
  bool enable_chunked_prefill = true;
  size_t kv_cache_memory_bytes = 0;      // cache budget; 0 = auto: max_num_seqs x max_model_len
                                         // worth, at most 1 GiB on the host, up to the GPU's plan
  uint64_t seed = 0;                     // seeds requests that carry no seed of their own
  int max_n = 1024;                      // a request with SamplingParams.n above this is refused
  int max_logprobs = 20;                 // ... with logprobs / prompt_logprobs above this (vLLM's name)
  std::string accelerator;               // "cpu" | "nvidia" | "auto"; empty = DEEPINFER_ACCELERATOR / auto
  // Prefix caching (exact reuse of a cached prompt prefix: shared blocks + slot checkpoints).
  bool enable_prefix_caching = true;
  // Prefill chunks end every k-th cache block so the slot state there is checkpointed (a later
  // prompt can hit at any of them); 0 = only at the prompt's last block boundary; -1 = automatic:
  // every block, or every k-th where shorter prefill chunks would be bound by re-reading the
  // weights (a full-width MoE on the GPU: k = 6 for V4-Flash-shaped layers; engine.h).
  int64_t prefix_checkpoint_blocks = -1;
  // Host memory (pinned on a GPU) that evicted cache blocks spill to and prefix hits load back
  // from; 0 = no host tier (a CPU model's cache is host memory already).
  size_t prefix_host_cache_bytes = 0;

  // Parallelism (docs/PARALLEL.md): data_parallel_size ranks, one process each (one GPU each on
  // the GPU backend). Attention is data-parallel (each rank owns its requests and their cache;
  // new requests go to the least loaded rank); the routed experts are sharded across groups of
  // expert_parallel_size consecutive ranks (0 = all of them; 1 = every rank holds every expert).
  int data_parallel_size = 1;
  int expert_parallel_size = 0;
  // Expert placement (vLLM's names): extra expert slots for replicas of hot experts, and the
  // expert-parallel load balancer re-placing experts every eplb_step_interval steps by the loads
  // of the last eplb_window_size steps.
  int num_redundant_experts = 0;
  bool enable_eplb = false;
  int eplb_window_size = 1000;
  int eplb_step_interval = 3000;
  // Context parallelism (docs/PARALLEL.md; CPU backend): each data-parallel rank is context_parallel_size
  // processes that split the attention core of every step of at least context_parallel_min_tokens
  // tokens (long prefills) by the balanced chunk pairing; the first runs its engine. With
  // expert_parallel_size = context_parallel_size the experts (and those steps' MoE) are split over them too.
  int context_parallel_size = 1;
  int64_t context_parallel_min_tokens = 512;
  // argv that starts worker ranks 1..data_parallel_size-1 (or context_parallel_size-1) on this node. Empty: the variable
  // DEEPINFER_WORKER_COMMAND (split at spaces), else this program when it is the deepinfer CLI
  // (`deepinfer rank-worker`). The Python LLM sets `python -m deepinfer._rank_worker`.
  std::vector<std::string> worker_command;
};

// A prompt: text, or token ids (vLLM {"prompt_token_ids": [...]}).
struct PromptInput {
  std::string text;
  std::vector<int32_t> token_ids;
  bool is_token_ids = false;
  static PromptInput from_text(std::string t) { return {std::move(t), {}, false}; }
  static PromptInput from_token_ids(std::vector<int32_t> ids) { return {{}, std::move(ids), true}; }
};

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;
};
struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool thinking = false;  // V4 thinking mode ("<think>") instead of chat mode ("</think>")
};

// Called for every request that produced something in a step (streaming); the final
// call for a request has finished = true.
using OutputCallback = std::function<void(const RequestOutput&)>;

struct GenerateOptions {
  OutputCallback on_output;
  bool progress_bar = false;  // a progress bar on stderr
  // Polled before every engine step. When it returns true, this call's unfinished requests are
  // aborted (they end finished, finish_reason "abort", freeing their cache) and generate()
  // returns at once. The Python binding polls for Ctrl-C (KeyboardInterrupt) here.
  std::function<bool()> should_cancel;
};

// Totals of the last generate()/chat() call.
struct GenerateSummary {
  int64_t num_requests = 0, num_failed = 0;
  int64_t num_prompt_tokens = 0, num_output_tokens = 0;
  double elapsed_s = 0;
  double mean_ttft_s = 0;   // time to first token (from arrival)
  double mean_tpot_s = 0;   // time per output token after the first
  double output_tokens_per_s = 0;
  double total_tokens_per_s = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  // Speculative decoding (zeros when no draft was verified): drafts verified / accepted, the
  // (sequence, step) pairs that verified drafts, the acceptance length (mean tokens committed
  // per verify step: 1 + accepted / verify steps), per draft position the share of its
  // verifications that accepted it, and the time spent in the drafter and in verify steps.
  int64_t num_draft_tokens = 0, num_accepted_draft_tokens = 0, num_verify_steps = 0;
  double acceptance_length = 0;
  std::vector<double> acceptance_rate_per_position;
  double draft_time_s = 0, verify_time_s = 0;
  // Adaptive drafting (DEEPINFER_SPEC_ADAPTIVE): requests that stopped drafting at least once
  // (because their acceptance could not pay for it), their mean acceptance length then, the
  // cost threshold (drafting step time / plain step time) last used, and how often requests
  // re-probed.
  int64_t num_drafting_stopped = 0, num_drafting_reprobes = 0;
  double drafting_stopped_acceptance = 0, drafting_threshold = 0;
  // Prefix caching: prompt tokens served from the cache (RequestOutput::num_cached_tokens summed),
  // their share of the prompt tokens, and the slot checkpoints held at the end (count, bytes).
  int64_t num_cached_tokens = 0;
  double prefix_hit_rate = 0;
  int64_t num_checkpoints = 0;
  int64_t checkpoint_bytes = 0;
  int64_t host_blocks_spilled = 0, host_blocks_loaded = 0;  // host tier, during this call
  std::string str() const;  // one-paragraph human summary
};

class LLM {
 public:
  explicit LLM(const LLMConfig& config);
  ~LLM();
  LLM(LLM&&) noexcept;
  LLM& operator=(LLM&&) noexcept;

  // `params` has one entry for all prompts or one per prompt. Outputs are in prompt order.
  // If options.on_output throws, this call's unfinished requests are aborted and the
  // exception propagates (the engine stays usable). A request aborted from elsewhere
  // (abort_request on its id) comes back finished with finish_reason "abort".
  std::vector<RequestOutput> generate(const std::vector<PromptInput>& prompts, const std::vector<SamplingParams>& params,
                                      const GenerateOptions& options = {});
  // Each conversation is formatted with the model's chat template (DeepSeek-V4 format).
  std::vector<RequestOutput> chat(const std::vector<std::vector<ChatMessage>>& conversations,
                                  const std::vector<SamplingParams>& params, const ChatTemplateOptions& chat_options = {},
                                  const GenerateOptions& options = {});

  // Incremental use (vLLM LLMEngine style), for streaming without a callback: queue requests
  // with add_request, then call step() until has_unfinished() is false. add_request throws a
  // deepinfer::Error for a bad request (nothing is queued then) and returns the request id.
  // step() runs one engine round and returns the requests that produced something, shaped by
  // each request's output_kind (kDelta: only the new text and tokens; a piece that could
  // still become a stop string is held back until it is decided). step() returns outputs of
  // requests queued with add_request only; generate() calls running at the same time (other
  // threads, or inside a step() loop) share the engine and keep their own outputs.
  // abort_request ends a queued or running request (of any caller): its last output, finished
  // with finish_reason "abort", goes to the caller that owns it. Unknown ids are ignored.
  std::string add_request(const PromptInput& prompt, const SamplingParams& params);
  std::vector<RequestOutput> step();
  void abort_request(const std::string& request_id);
  bool has_unfinished() const;  // any request of any caller still in the engine
  // A fresh id from the same counter, for requests refused before they reach the engine
  // (the Python layer's argument errors), so ids never repeat.
  std::string reserve_request_id();

  std::vector<int32_t> encode(const std::string& text) const;  // throws TokenizerError without a tokenizer
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  std::string chat_prompt(const std::vector<ChatMessage>& conversation, const ChatTemplateOptions& options = {}) const;
  bool has_tokenizer() const;

  int64_t vocab_size() const;
  int64_t max_model_len() const;
  std::string describe() const;       // model, backend, cache geometry
  GenerateSummary last_summary() const;  // of the generate()/chat() call that finished last
  // Per-operation device time, for benchmarks (`deepinfer bench-flash --breakdown`): while on, every
  // step runs eagerly (no CUDA graph replay) and each model op is timed on the device between two
  // events; take_op_profile() returns the sums since it was turned on or last taken, largest first.
  // This process's model only (rank 0's when parallel); the CPU backend records nothing.
  void set_op_profiling(bool on);
  std::vector<OpTiming> take_op_profile();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
