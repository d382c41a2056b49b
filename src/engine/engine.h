// Engine: one scheduling round per step(): Scheduler -> SchedulerOutput -> ModelRunner
// (batched forward + sampling + draft verification + drafting) -> ModelRunnerOutput ->
// OutputProcessor::scan_stops -> Scheduler::update (the one place request state changes) ->
// OutputProcessor::process.
//
// Asynchronous scheduling (DEEPINFER_ASYNC_SCHEDULING, on by default): a
// step() plans and launches step N+1 before it applies step N, so the host schedules, plans and
// uploads N+1 while the device still runs N:
//   schedule(N+1) -> launch(N+1) -> collect(N) -> scan_stops/update/process(N)
//     -> grammar masks(N+1) -> sample(N+1) -> return N's outputs
// N+1's inputs that N draws come from N's draws on the device (ForwardBatch::device_inputs). A
// sequence N ends (EOS, stop ids or strings, grammar) also ran in N+1: update() drops that row, so
// nothing extra is emitted; max_tokens is known ahead and never over-scheduled. Caches of
// finished or preempted sequences return after the last step that used them completed (the cache
// manager's release queue). Each step's rows are drawn exactly as a synchronous step draws them
// (same history, masks, Philox position); only batch compositions can differ (a finished
// sequence's extra row, one step later admissions), so outputs are identical on and off whenever
// the model's logits do not depend on the batch (DEEPINFER_BATCH_INVARIANT=1). With the CPU
// backend every call finishes before it returns: the same steps simply run in order.
// Drafting steps are pipelined instead (N's acceptance and drafts are N+1's inputs):
//   collect(N) -> scan_stops/update(N) -> schedule(N+1) -> launch(N+1) -> process(N)
//     -> grammar masks(N+1) -> sample(N+1) -> return N's outputs
// so the plans are the synchronous ones and outputs are identical on and off for any model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "deepinfer/llm.h"
#include "engine/adapters.h"
#include "engine/kv_cache_manager.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/kv_transfer.h"
#include "engine/scheduler.h"
#include "engine/spec_budget.h"
#include "model/causal_lm.h"

namespace deepinfer::engine {

struct EngineConfig {
  SchedulerConfig scheduler;             // max_model_len 0 = the model's
  // 0 = auto (auto_cache_budget): what max_num_seqs sequences of max_model_len tokens can use,
  // at most kHostCacheCap for a host model; a GPU model caps any budget at its memory plan's.
  size_t kv_cache_memory_bytes = 0;
  uint64_t seed = 0;
  // The environment knobs as read once (LLM: EnvConfig::from_environment()). The engine refuses,
  // naming them, the knobs whose feature is not built (check_env_knobs).
  EnvConfig env;
  // What identifies the weights (LLM: the resolved checkpoint path). With the model's
  // describe() (architecture, backend, numerics) and the prefill mode it seeds the cache's
  // block-hash chains, so blocks of different models or numerics never share a hash.
  std::string model_identity;
  // Sample on the model's device when it keeps logits there (GPU model); LLM sets it from
  // DEEPINFER_DEVICE_SAMPLING.
  bool device_sampling = true;
  // Drafts verified per sequence per step (speculative decoding); needs a model drafter and
  // is capped by the drafter's max_draft_tokens() and the model's max_rollback(). 0 = off;
  // -1 = from env.use_nextn_decode (unset: kDefaultNextnDecode when the model has a drafter).
  int32_t num_speculative_tokens = -1;
  // Variable-length verification (scheduler varlen_drafts); unset = env.enable_mtp_varlen.
  std::optional<bool> varlen_drafts;
  // Adaptive drafting (scheduler adaptive_drafts, spec_adaptive.h); unset = env.spec_adaptive, unset
  // there = on for a model with device logits. Off whatever is asked under batch invariance.
  std::optional<bool> adaptive_drafts;
  // Its step cost curve; unset = measured at start-up (measure_step_cost) when varlen is on.
  std::optional<StepCostModel> step_cost;
  // Sampling requests draft from their own distribution, verified by rejection sampling
  // (RunnerOptions::sampled_drafts); false: greedy drafts, output identical to plain decoding.
  bool sampled_drafts = true;
  // Per-request maxima (LLMConfig.max_n / max_logprobs): a request asking for more is refused
  // at admission, naming the field.
  // Prefix caching's host tier for evicted blocks (pinned host memory on a device), 0 = none.
  size_t prefix_host_bytes = 0;
  // RunnerOptions::async_checkpoints (stream-ordered slot checkpoint copies; off until verified on a GPU).
  bool async_checkpoint_copies = false;
  int max_n = 1024;
  int max_logprobs = 20;
  // add_request waits this long for a request's grammar (GrammarCompiler::compile_async); a
  // compile done by then is as if synchronous (its error throws from add_request), a longer
  // one continues on the compiler's workers while other requests step, and a compile error
  // found later ends the request with RequestOutput.error.
  double grammar_compile_wait_s = 0.05;
};

constexpr size_t kHostCacheCap = size_t(1) << 30;

// The prefix cache's checkpoint interval for checkpoint_interval_blocks = -1 (the default): every
// block, unless the model's prefill is weight-bound below CausalLM::prefill_weight_pass_tokens()
// tokens per step (a full-width MoE on the GPU re-reads every routed expert for each chunk): then
// every k-th block, k = ceil(those tokens / block_tokens), so no prefill chunk is shorter.
int64_t auto_checkpoint_interval(const model::CausalLM& model, int64_t block_tokens);

// The cache budget for kv_cache_memory_bytes = 0: enough for `max_num_seqs` sequences of
// `max_model_len` tokens each (a cache never needs more), capped at kHostCacheCap unless the
// model runs on a device (supports_device_logits), whose plan_cache caps it at what the device's
// memory plan left for the cache (the whole card's share, as vLLM's gpu_memory_utilization).
size_t auto_cache_budget(const model::CausalLM& model, int64_t max_num_seqs, int64_t max_model_len);

// What the engine will ask of the model, for the loader (ModelLoadOptions.limits): the LLM's
// limits and the rollback the environment's draft length needs.
model::ModelLimits model_limits_for(const LLMConfig& config, const EnvConfig& env);

class Engine {
 public:
  // `codec` may be null (token ids only). `grammar` may be null (structured outputs rejected).
  Engine(const EngineConfig& config, std::unique_ptr<model::CausalLM> model, std::unique_ptr<TextCodec> codec,
         std::unique_ptr<GrammarCompiler> grammar = nullptr);
  ~Engine();

  // Validates and queues a request. Throws InvalidArgument (bad prompt or params),
  // TokenizerError or GrammarError; the engine is unchanged then.
  void add_request(const std::string& request_id, const PromptInput& prompt, const SamplingParams& params,
                   double arrival_time);
  std::vector<RequestOutput> step();
  // Ends a queued or running request; returns its final output (finished, finish_reason
  // "abort" for the samples still running), or nothing for an unknown id.
  std::vector<RequestOutput> abort(const std::string& request_id);
  bool has_unfinished() const { return !compiling_.empty() || scheduler_->has_unfinished() || inflight_ != nullptr; }
  // Steps overlap the device: plain steps fully (N+1 planned while N runs), drafting steps
  // pipelined (N applied first, its outputs processed while N+1 runs). DEEPINFER_ASYNC_SCHEDULING=0: neither.
  bool async_scheduling() const { return async_ || pipelined_; }
  bool pipelined_drafting() const { return pipelined_; }
  // Requests whose grammar is still compiling (not yet given to the scheduler).
  int64_t num_compiling() const { return int64_t(compiling_.size()); }

  model::CausalLM& model() { return *model_; }
  const TextCodec* codec() const { return codec_.get(); }
  // The structured-output compiler (null without the grammar module or a tokenizer). Its
  // compile() is thread-safe and caches by so_args: a server compiles a request's grammar on
  // a worker first, so add_request on the engine thread finds it compiled.
  GrammarCompiler* grammar() const { return grammar_.get(); }
  const Scheduler& scheduler() const { return *scheduler_; }
  const KVCacheManager& cache() const { return *cache_; }
  const ModelRunner& runner() const { return *runner_; }
  int64_t max_model_len() const { return config_.scheduler.max_model_len; }

  // Prefill/decode disaggregation (engine/kv_transfer.h). Between steps only (the engine thread).
  // The blocks and checkpoint of `prompt`'s longest cached prefix (empty without one). With
  // `device` the block payload stays in device memory (KvBundle::device_blocks; the small parts
  // on the host); InvalidArgument on an engine without a device cache.
  KvBundle export_prefix(std::span<const int32_t> prompt, bool device = false);
  // Makes a bundle's prefix a prefix-cache entry here: the tokens imported, 0 for an empty
  // bundle or prefix caching off, -1 when the cache has no room now. InvalidArgument for a
  // bundle of another model, numerics or block layout.
  int64_t import_prefix(const KvBundle& bundle);

 private:
  std::vector<int32_t> tokenize(const PromptInput& prompt) const;
  int32_t speculative_tokens(int32_t asked) const;  // what the model's drafter and rollback allow
  std::string cache_identity() const;               // seeds the cache's block hashes
  // Collects a launched and sampled step and applies it (scan_stops, update): the updates.
  std::vector<SeqUpdate> apply(const SchedulerOutput& plan);
  // The outputs of applied updates (OutputProcessor::process); finished requests are forgotten.
  std::vector<RequestOutput> report(const std::vector<SeqUpdate>& updates);
  std::vector<RequestOutput> finish(const SchedulerOutput& plan) { return report(apply(plan)); }
  std::vector<RequestOutput> run_step();            // one scheduled step
  // Gives requests whose grammar compiled to the scheduler; those that failed end with the error.
  std::vector<RequestOutput> admit_compiled();
  // Final outputs of a request never scheduled (aborted, or `error`: its grammar failed).
  std::vector<RequestOutput> end_unscheduled(const std::string& request_id, const std::vector<int64_t>& seq_ids,
                                             const std::string& error);

  struct Compiling {
    std::string request_id;
    std::shared_ptr<PendingGrammar> grammar;
    std::vector<std::unique_ptr<Request>> seqs;  // their matchers come from `grammar`
  };

  EngineConfig config_;
  std::unique_ptr<model::CausalLM> model_;
  std::unique_ptr<TextCodec> codec_;
  std::unique_ptr<GrammarCompiler> grammar_;
  std::unique_ptr<KVCacheManager> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<OutputProcessor> outputs_;
  std::unordered_map<std::string, std::vector<int64_t>> request_seqs_;
  bool async_ = false;      // plain steps: N+1 launched before N is collected
  bool pipelined_ = false;  // drafting steps: N applied before N+1 is planned, reported after it launched
  std::unique_ptr<SchedulerOutput> inflight_;  // launched and sampled, not yet applied (async / pipelined)
  std::vector<Compiling> compiling_;  // in add_request order
  int64_t next_seq_id_ = 0, next_arrival_ = 0;
};

double now_seconds();

}  // namespace deepinfer::engine
