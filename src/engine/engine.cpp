#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/check.h"
#include "core/logging.h"
#include "model/drafter.h"

namespace deepinfer::engine {
namespace {
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

model::ModelLimits model_limits_for(const LLMConfig& c, const EnvConfig& env) {
  return {.max_num_seqs = c.max_num_seqs, .max_num_batched_tokens = c.max_num_batched_tokens,
          .max_model_len = c.max_model_len, .max_rollback = env.max_rollback()};
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

size_t auto_cache_budget(const model::CausalLM& model, int64_t max_num_seqs, int64_t max_model_len) {
  // Per-block and per-slot bytes from a one-slot plan (nothing is allocated by planning).
  const kv::CacheGeometry unit = model.plan_cache(kHostCacheCap, 1);
  const int64_t blocks_per_seq = unit.block_tokens > 0 ? (max_model_len + unit.block_tokens - 1) / unit.block_tokens : 0;
  const double need = double(max_num_seqs) * (double(unit.bytes_per_slot) + double(blocks_per_seq) * double(unit.bytes_per_block));
  const double cap = model.supports_device_logits() ? 1e18 : double(kHostCacheCap);
  return size_t(std::min(need, cap));
}

int64_t auto_checkpoint_interval(const model::CausalLM& model, int64_t block_tokens) {
  const int64_t t = model.prefill_weight_pass_tokens();
  return t > block_tokens ? (t + block_tokens - 1) / block_tokens : 1;
}

Engine::Engine(const EngineConfig& config, std::unique_ptr<model::CausalLM> model, std::unique_ptr<TextCodec> codec,
               std::unique_ptr<GrammarCompiler> grammar)
    : config_(config), model_(std::move(model)), codec_(std::move(codec)), grammar_(std::move(grammar)) {
  DI_CHECK(model_, "Engine needs a model");
  check_env_knobs(config_.env, {.model_has_drafter = model_->drafter() != nullptr,
                                .model_replays = model_->replay_keep() > 0, .model = model_->describe()});
  SchedulerConfig& sc = config_.scheduler;
  if (sc.max_model_len <= 0 || sc.max_model_len > model_->max_model_len()) sc.max_model_len = model_->max_model_len();
  if (config_.kv_cache_memory_bytes == 0)
    config_.kv_cache_memory_bytes = auto_cache_budget(*model_, sc.max_num_seqs, sc.max_model_len);
  kv::CacheGeometry g = model_->plan_cache(config_.kv_cache_memory_bytes, sc.max_num_seqs);
  if (g.num_blocks <= 0 || g.num_slots <= 0)
    DI_THROW(OutOfMemory, "kv_cache_memory_bytes=", config_.kv_cache_memory_bytes, " holds no cache block (",
             g.bytes_per_block, " B per block, ", g.bytes_per_slot, " B per slot, ", sc.max_num_seqs, " slots)");
  // One sequence must fit in the whole cache, or it could never finish.
  int64_t cap = g.num_blocks * g.block_tokens;
  if (sc.max_model_len > cap) {
    DI_WARN("cache holds ", cap, " tokens; lowering max_model_len from ", sc.max_model_len);
    sc.max_model_len = cap;
  }
  sc.max_num_seqs = std::min(sc.max_num_seqs, g.num_slots);
  sc.replay_keep = model_->replay_keep();
  sc.num_speculative_tokens = speculative_tokens(config_.num_speculative_tokens);
  if (sc.num_speculative_tokens > 0 && model_->replay_keep() > 0)
    DI_THROW(InvalidArgument, "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact with speculative decoding is not built ",
             "(the drafter reads the target's rows at every prompt position; bounded replay computes the tail's "
             "only): set DEEPINFER_USE_NEXTN_DECODE=0 or use full prefill");
  sc.varlen_drafts = sc.num_speculative_tokens > 0 && config_.varlen_drafts.value_or(config_.env.enable_mtp_varlen);
  // Adaptive drafting decides from timings: off in batch-invariant mode (the determinism contract).
  sc.adaptive_drafts = sc.num_speculative_tokens > 0 && !config_.env.batch_invariant &&
                       config_.adaptive_drafts.value_or(
                           config_.env.spec_adaptive.value_or(model_->supports_device_logits()));
  model_->allocate_cache(g);
  if (sc.varlen_drafts) {
    // The cost curve over verify-shaped steps, measured before any slot or block is handed out.
    const int64_t max_tokens = std::min<int64_t>(sc.max_num_batched_tokens, sc.max_num_seqs * (1 + sc.num_speculative_tokens));
    sc.step_cost = config_.step_cost ? *config_.step_cost
                                     : measure_step_cost(*model_, g, max_tokens, sc.max_num_seqs,
                                                         config_.device_sampling && model_->supports_device_logits());
  }
  if (sc.prefix_cache.checkpoint_interval_blocks < 0) {
    sc.prefix_cache.checkpoint_interval_blocks = auto_checkpoint_interval(*model_, g.block_tokens);
    if (sc.prefix_cache.enabled && sc.prefix_cache.checkpoint_interval_blocks > 1)
      DI_LOG(kInfo, "prefix cache: prefill chunks end every ", sc.prefix_cache.checkpoint_interval_blocks,
             " blocks (", sc.prefix_cache.checkpoint_interval_blocks * g.block_tokens,
             " tokens: shorter chunks would re-read the weights; prefix_checkpoint_blocks sets it), at the "
             "prompt's last block and where a shared prefix ends");
  }
  cache_ = std::make_unique<KVCacheManager>(g, block_hash_seed(cache_identity()));
  const size_t block_bytes = model_->paged_block_bytes();
  sc.prefix_cache.host_blocks = block_bytes ? int64_t(config_.prefix_host_bytes / block_bytes) : 0;
  scheduler_ = std::make_unique<Scheduler>(sc, *cache_, model_->vocab_size());
  scheduler_->set_grammar_compiler(grammar_.get());
  runner_ = std::make_unique<ModelRunner>(*model_, RunnerOptions{.device_sampling = config_.device_sampling,
                                                                 .num_speculative_tokens = sc.num_speculative_tokens,
                                                                 .sampled_drafts = config_.sampled_drafts,
                                                                 .device_draft_sampling = config_.env.device_draft_sampling,
                                                                 .block_tokens = g.block_tokens,
                                                                 .host_blocks = sc.prefix_cache.host_blocks,
                                                                 .async_checkpoints = config_.async_checkpoint_copies});
  // Plain steps: N+1 is planned and launched before N is applied. Drafting steps: N+1's inputs
  // and drafts come from N's verification (which tokens it accepted) and its drafter pass, so N
  // is collected and applied first; what overlaps N+1's forward is N's output processing, the
  // caller's handling of it and N+1's grammar masks (pipelined_); a plain step (adaptive
  // drafting: no drafter follows it) overlaps as without drafting. Prefix caching runs
  // asynchronously (the runner saves a step's checkpoints before the next step writes its
  // slots; update() keys those whose block ends in the token that step sampled).
  const bool overlap = config_.env.async_scheduling.value_or(true);
  async_ = overlap && sc.num_speculative_tokens == 0;
  pipelined_ = overlap && sc.num_speculative_tokens > 0;
  outputs_ = std::make_unique<OutputProcessor>(codec_.get());
}

Engine::~Engine() = default;

std::string Engine::cache_identity() const {
  // Prefill mode: V4.1's bounded replay (its truncation mode and keep length) leaves different
  // cache contents for the same tokens, so it is part of the identity.
  // The model's own keep length names it (a compact run and a full one never share blocks or
  // checkpoints); V4 and full prefill keep the string they always had.
  const EnvConfig& e = config_.env;
  if (const int64_t keep = model_->replay_keep(); keep > 0)
    return detail::str_cat(config_.model_identity, "\n", model_->describe(), "\nprefill compact/", keep);
  return detail::str_cat(config_.model_identity, "\n", model_->describe(), "\nprefill ",
                         e.yoco_truncation_mode.value_or("full"), "/", e.yoco_keep_tokens.value_or(-1));
}

int32_t Engine::speculative_tokens(int32_t asked) const {
  model::Drafter* d = model_->drafter();
  const bool from_knob = asked < 0 && config_.env.use_nextn_decode.has_value();
  if (asked < 0) asked = config_.env.use_nextn_decode.value_or(d ? kDefaultNextnDecode : 0);
  if (asked == 0) return 0;
  if (!d) DI_THROW(InvalidArgument, "num_speculative_tokens=", asked, ": ", model_->describe(), " has no drafter");
  // The knob asks for more drafts than one drafter round makes (DSpark: its block size): refused
  // with both numbers rather than silently lowered. The default (unset) is capped below.
  if (from_knob && asked > d->max_draft_tokens())
    DI_THROW(InvalidArgument, "DEEPINFER_USE_NEXTN_DECODE=", asked, " is above the ", d->max_draft_tokens(),
             " drafts one round of ", d->describe(), " proposes; set it to at most ", d->max_draft_tokens());
  int64_t n = std::min<int64_t>({asked, d->max_draft_tokens(), model_->max_rollback()});
  if (n < asked)
    DI_WARN("speculative decoding: ", asked, " drafts asked, ", n, " used (", d->describe(), " drafts at most ",
            d->max_draft_tokens(), ", the model rolls back ", model_->max_rollback(), " positions)");
  return int32_t(std::max<int64_t>(n, 0));
}

std::vector<int32_t> Engine::tokenize(const PromptInput& prompt) const {
  if (prompt.is_token_ids) return prompt.token_ids;
  if (!codec_) DI_THROW(InvalidArgument, "text prompt given but the tokenizer is not loaded (skip_tokenizer_init); pass token ids");
  return codec_->encode(prompt.text);
}

void Engine::add_request(const std::string& request_id, const PromptInput& prompt, const SamplingParams& params,
                         double arrival_time) {
  const int64_t vocab = model_->vocab_size(), max_len = config_.scheduler.max_model_len;
  if (request_seqs_.count(request_id)) DI_THROW(InvalidArgument, "request id '", request_id, "' is already running");
  params.validate(vocab);
  if (params.n > config_.max_n)
    DI_THROW(InvalidArgument, "SamplingParams.n: ", params.n, " is above this LLM's max_n=", config_.max_n);
  for (auto [name, v] : {std::pair<const char*, const std::optional<int>&>{"logprobs", params.logprobs},
                         {"prompt_logprobs", params.prompt_logprobs}})
    if (v && *v > config_.max_logprobs)
      DI_THROW(InvalidArgument, "SamplingParams.", name, ": ", *v, " is above this LLM's max_logprobs=",
               config_.max_logprobs);
  if (prompt.is_token_ids ? prompt.token_ids.empty() : prompt.text.empty())
    DI_THROW(InvalidArgument, "request '", request_id, "': prompt is empty");
  auto ids = std::make_shared<std::vector<int32_t>>(tokenize(prompt));
  if (ids->empty()) DI_THROW(InvalidArgument, "request '", request_id, "': prompt is empty after tokenization");
  for (size_t i = 0; i < ids->size(); ++i)
    if ((*ids)[i] < 0 || (*ids)[i] >= vocab)
      DI_THROW(InvalidArgument, "request '", request_id, "': prompt token ", i, " is ", (*ids)[i], ", outside [0, ", vocab, ")");
  if (int64_t(ids->size()) >= max_len)
    DI_THROW(InvalidArgument, "request '", request_id, "': prompt has ", ids->size(), " tokens but max_model_len is ",
             max_len, " (room is needed for at least one output token)");
  // min_tokens that cannot fit would run the request to the end of the context, masking EOS.
  if (params.min_tokens > max_len - int64_t(ids->size()))
    DI_THROW(InvalidArgument, "request '", request_id, "': SamplingParams.min_tokens=", params.min_tokens,
             " is more than the room left for output (max_model_len ", max_len, " - prompt ", ids->size(), " = ",
             max_len - int64_t(ids->size()), ")");
  if (!config_.scheduler.enable_chunked_prefill && int64_t(ids->size()) > config_.scheduler.max_num_batched_tokens)
    DI_THROW(InvalidArgument, "request '", request_id, "': prompt has ", ids->size(), " tokens, more than max_num_batched_tokens=",
             config_.scheduler.max_num_batched_tokens, " with chunked prefill off");
  if (params.structured_outputs && !grammar_)
    DI_THROW(InvalidArgument, "request '", request_id, "': structured outputs (so_args) need the grammar module, which this build lacks");
  // The grammar compiles on the compiler's workers. One done within grammar_compile_wait_s
  // behaves as a synchronous compile (its error throws here); a longer one leaves the request
  // pending (step() admits it once compiled) while the other requests keep stepping.
  std::vector<std::unique_ptr<GrammarMatcher>> matchers;
  std::shared_ptr<PendingGrammar> compiling;
  if (params.structured_outputs) {
    compiling = grammar_->compile_async(*params.structured_outputs);
    if (compiling->wait_for(config_.grammar_compile_wait_s)) {
      for (int i = 0; i < params.n; ++i) matchers.push_back(compiling->make_matcher());
      compiling.reset();
    }
  }

  // Everything validated: commit.
  auto sp = std::make_shared<const SamplingParams>(params);
  int64_t arrival = next_arrival_++;
  uint64_t seed = params.seed ? *params.seed : splitmix(config_.seed ^ splitmix(uint64_t(arrival)));
  int64_t room = max_len - int64_t(ids->size());
  std::vector<int64_t> seq_ids;
  std::vector<std::unique_ptr<Request>> held;  // while the grammar compiles
  for (int i = 0; i < params.n; ++i) {
    auto r = std::make_unique<Request>();
    r->seq_id = next_seq_id_++;
    r->arrival = arrival;
    r->sample_index = uint32_t(i);
    r->seed = seed;
    r->params = sp;
    r->prompt_ids = ids;
    r->max_output_tokens = params.max_tokens ? std::min<int64_t>(*params.max_tokens, room) : room;
    r->eos_token_id = model_->eos_token_id();
    if (!matchers.empty()) r->grammar = std::move(matchers[size_t(i)]);
    seq_ids.push_back(r->seq_id);
    if (compiling) held.push_back(std::move(r));
    else scheduler_->add(std::move(r));
  }
  if (compiling) compiling_.push_back({request_id, std::move(compiling), std::move(held)});
  outputs_->add(request_id, prompt.is_token_ids ? "" : prompt.text, ids, sp, seq_ids, arrival_time);
  request_seqs_[request_id] = seq_ids;
}

std::vector<RequestOutput> Engine::end_unscheduled(const std::string& request_id, const std::vector<int64_t>& seq_ids,
                                                   const std::string& error) {
  std::vector<SeqUpdate> updates;
  for (int64_t id : seq_ids) {
    SeqUpdate u;
    u.seq_id = id;
    u.finished = true;
    u.finish_reason = int(FinishReason::kAbort);
    updates.push_back(u);
  }
  OutputProcessor::Result out = outputs_->process(updates, now_seconds());
  request_seqs_.erase(request_id);
  for (RequestOutput& o : out.outputs)
    if (!error.empty()) {
      o.error = error;
      o.outputs.clear();  // a rejected request has no completions (outputs.h)
    }
  return std::move(out.outputs);
}

std::vector<RequestOutput> Engine::admit_compiled() {
  std::vector<RequestOutput> failed;
  for (size_t i = 0; i < compiling_.size();) {
    Compiling& c = compiling_[i];
    if (!c.grammar->ready()) {
      ++i;
      continue;
    }
    std::string error;
    try {
      for (auto& r : c.seqs) r->grammar = c.grammar->make_matcher();
    } catch (const Error& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("internal error: ") + e.what();
    }
    std::vector<int64_t> ids;
    for (auto& r : c.seqs) {
      ids.push_back(r->seq_id);
      if (error.empty()) scheduler_->add(std::move(r));
    }
    if (!error.empty()) {
      std::vector<RequestOutput> o = end_unscheduled(c.request_id, ids, error);
      failed.insert(failed.end(), std::make_move_iterator(o.begin()), std::make_move_iterator(o.end()));
    }
    compiling_.erase(compiling_.begin() + long(i));
  }
  return failed;
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> out = admit_compiled();
  // An expert-parallel rank always steps (an empty step joins its peers' MoE exchanges).
  if (!scheduler_->has_unfinished() && !inflight_ && !model_->joins_collectives()) {
    // Only compiles left: no step to run; wait a little for one (callers loop on has_unfinished).
    if (out.empty() && !compiling_.empty() && compiling_.front().grammar->wait_for(0.01)) out = admit_compiled();
    if (!scheduler_->has_unfinished()) return out;
  }
  std::vector<RequestOutput> now = run_step();
  out.insert(out.end(), std::make_move_iterator(now.begin()), std::make_move_iterator(now.end()));
  return out;
}

std::vector<SeqUpdate> Engine::apply(const SchedulerOutput& plan) {
  ModelRunnerOutput result = runner_->collect(plan);
  std::vector<StopEvent> stops = outputs_->scan_stops(result);
  return scheduler_->update(plan, result, stops);
}

std::vector<RequestOutput> Engine::report(const std::vector<SeqUpdate>& updates) {
  OutputProcessor::Result out = outputs_->process(updates, now_seconds());
  for (const RequestOutput& o : out.outputs)
    if (o.finished) request_seqs_.erase(o.request_id);
  return std::move(out.outputs);
}

std::vector<RequestOutput> Engine::run_step() {
  // Drafting (pipelined): the step in flight is applied before the next is planned (its
  // acceptance and drafts are the next step's inputs); its outputs wait until that one launched.
  // A plain step in flight (adaptive drafting stopped everyone: no drafter follows it) overlaps
  // the next step as without drafting: applied after that one launched.
  std::vector<SeqUpdate> applied;
  const bool applied_first = pipelined_ && inflight_ && inflight_->feeds_drafter;
  if (applied_first) {
    applied = apply(*inflight_);
    inflight_.reset();
  }
  auto plan = std::make_unique<SchedulerOutput>(scheduler_->schedule());
  if (plan->empty() && !inflight_ && scheduler_->has_unfinished() && scheduler_->num_running() == 0)
    DI_THROW(InternalError, "scheduler made no progress with ", scheduler_->num_waiting(), " waiting sequences");
  runner_->launch(*plan);  // the device starts on it (the CPU runs it)
  std::vector<RequestOutput> out;
  if (applied_first) {
    out = report(applied);
  } else if (inflight_) {  // the previous step, while this one runs
    out = finish(*inflight_);
    inflight_.reset();
  }
  // Its rows are drawn once every earlier step is applied: masks and penalties see those tokens.
  plan->grammar_masks = scheduler_->grammar_masks(*plan);
  runner_->sample(*plan);
  if ((async_ || pipelined_) && !plan->empty()) {
    inflight_ = std::move(plan);
    return out;
  }
  std::vector<RequestOutput> now = finish(*plan);
  out.insert(out.end(), std::make_move_iterator(now.begin()), std::make_move_iterator(now.end()));
  return out;
}

std::vector<RequestOutput> Engine::abort(const std::string& request_id) {
  auto it = request_seqs_.find(request_id);
  if (it == request_seqs_.end()) return {};
  for (size_t i = 0; i < compiling_.size(); ++i)
    if (compiling_[i].request_id == request_id) {  // its grammar still compiles: never scheduled
      compiling_.erase(compiling_.begin() + long(i));
      std::vector<int64_t> ids = it->second;
      return end_unscheduled(request_id, ids, "");
    }
  std::vector<SeqUpdate> updates;
  for (int64_t id : it->second) {
    if (!scheduler_->get(id)) continue;
    scheduler_->abort(id);
    SeqUpdate u;
    u.seq_id = id;
    u.finished = true;
    u.finish_reason = int(FinishReason::kAbort);
    updates.push_back(u);
  }
  OutputProcessor::Result out = outputs_->process(updates, now_seconds());
  request_seqs_.erase(it);
  // The last request gone: the step in flight has nothing left to report; collect it now so that
  // its caches come back and has_unfinished() turns false.
  if (inflight_ && !scheduler_->has_unfinished()) {
    std::vector<RequestOutput> rest = finish(*inflight_);
    inflight_.reset();
    DI_CHECK(rest.empty(), "a step in flight reported ", rest.size(), " outputs with no request left");
  }
  return std::move(out.outputs);
}

}  // namespace deepinfer::engine
