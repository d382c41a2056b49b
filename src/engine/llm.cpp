// deepinfer::LLM: resolves the config (environment read once), builds the Engine, and runs
// it to completion for generate()/chat(), turning bad requests into per-request errors.
#include "deepinfer/llm.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/check.h"
#include "core/strings.h"
#include "core/env.h"
#include "core/fair_mutex.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "engine/dp/ranks.h"
#include "engine/engine_factory.h"
#include "engine/model_loader.h"

namespace deepinfer {
using engine::Engine;

namespace {
// Outputs of one caller's requests, filled by whichever thread steps the engine.
struct Inbox {
  std::vector<RequestOutput> outputs;
};
}  // namespace

struct LLM::Impl {
  EnvConfig env;
  std::unique_ptr<Engine> own_engine;                 // single rank
  std::unique_ptr<engine::dp::RankRuntime> ranks;     // data_parallel_size > 1: this is rank 0
  Engine* engine = nullptr;       // this process's engine (rank 0's when parallel)
  engine::dp::Driver* dp = nullptr;  // drives every rank's engine when parallel
  std::atomic<int64_t> next_id{0};
  // Guards the engine and everything below. Held for one engine step (or one admission) at a
  // time, never while a caller's callback runs. First come, first served (core/fair_mutex.h):
  // with several threads in generate(), each gets a step in turn, so one that must stop (Ctrl-C,
  // should_cancel) waits for at most one step per other caller.
  mutable FairMutex mu;
  GenerateSummary summary;
  Inbox stream;                                   // requests queued with add_request
  std::unordered_map<std::string, Inbox*> owner;  // unfinished request id -> its caller's inbox

  std::string new_id() { return std::to_string(next_id.fetch_add(1)); }
  // Hands each output to its request's caller; finished requests leave `owner`. Lock held.
  void route(std::vector<RequestOutput>&& outs) {
    for (RequestOutput& o : outs) {
      auto it = owner.find(o.request_id);
      if (it == owner.end()) continue;
      Inbox* box = it->second;
      if (o.finished) owner.erase(it);
      o.error = escape_invalid_utf8(o.error);  // the bindings need valid UTF-8
      box->outputs.push_back(std::move(o));
    }
  }
  // The engine calls, through the data-parallel driver when there is one.
  void add(const std::string& id, const PromptInput& prompt, const SamplingParams& params) {
    if (dp) dp->add_request(id, prompt, params, engine::now_seconds());
    else engine->add_request(id, prompt, params, engine::now_seconds());
  }
  bool unfinished() const { return dp ? dp->has_unfinished() : engine->has_unfinished(); }
  // One engine step, unless `box` already holds outputs that another caller's step produced.
  void step_for(Inbox& box) {
    if (box.outputs.empty() && unfinished()) route(dp ? dp->step() : engine->step());
  }
  void abort_locked(const std::string& id) { route(dp ? dp->abort(id) : engine->abort(id)); }
  // Aborts every request still owned by `box` and forgets them (error and cancel paths).
  void release(Inbox& box) {
    std::vector<std::string> mine;
    for (const auto& [id, b] : owner)
      if (b == &box) mine.push_back(id);
    for (const std::string& id : mine) abort_locked(id);
    for (const std::string& id : mine) owner.erase(id);
  }
};

LLM::LLM(const LLMConfig& config) : impl_(std::make_unique<Impl>()) {
  engine::validate_llm_config(config);
  impl_->env = engine::resolve_env(config);
  if (config.data_parallel_size > 1 || config.context_parallel_size > 1) {
    const std::optional<parallel::RankEnv> launched = parallel::RankEnv::from_environment();
    if (launched && launched->world_size > 1 && launched->rank > 0) {
      // An external launcher started this process as a worker rank: it serves rank 0's rounds
      // and ends with them (there is nothing for this process to return to its caller).
      engine::dp::serve_worker(*launched, &config);
      DI_INFO("parallel rank ", launched->rank, ": rank 0 shut down; exiting");
      std::exit(0);
    }
    impl_->ranks = engine::dp::start_driver(config, impl_->env, launched && launched->world_size > 1 ? launched : std::nullopt);
    impl_->engine = impl_->ranks->engine.get();
    impl_->dp = impl_->ranks->driver.get();
    return;
  }
  impl_->own_engine = engine::make_engine(config, impl_->env, engine::load_parts(config, impl_->env));
  impl_->engine = impl_->own_engine.get();
}

LLM::~LLM() = default;
LLM::LLM(LLM&&) noexcept = default;
LLM& LLM::operator=(LLM&&) noexcept = default;

namespace {
void draw_progress(int64_t done, int64_t total, int64_t out_tokens, double elapsed) {
  int width = 30, fill = total ? int(width * done / total) : width;
  std::fprintf(stderr, "\rProcessed prompts: [%.*s%*s] %lld/%lld  %.1f out tok/s", fill,
               "##############################", width - fill, "", (long long)done, (long long)total,
               elapsed > 0 ? double(out_tokens) / elapsed : 0.0);
  std::fflush(stderr);
}
}  // namespace

namespace {
GenerateSummary summarize(const std::vector<RequestOutput>& results, GenerateSummary s) {
  int64_t n_ttft = 0, n_tpot = 0;
  std::vector<int64_t> verified, accepted;  // per draft position
  for (const RequestOutput& r : results) {
    if (!r.error.empty()) continue;
    s.num_prompt_tokens += int64_t(r.prompt_token_ids.size());
    s.num_cached_tokens += r.num_cached_tokens;
    s.num_output_tokens += r.metrics.num_generation_tokens;
    if (r.metrics.first_token_time > 0) {
      s.mean_ttft_s += r.metrics.first_token_time - r.metrics.arrival_time;
      n_ttft++;
    }
    s.num_verify_steps += r.metrics.num_verify_steps;
    s.num_draft_tokens += r.metrics.num_draft_tokens;
    s.num_accepted_draft_tokens += r.metrics.num_accepted_draft_tokens;
    const auto& ver = r.metrics.draft_verified_per_position;
    if (verified.size() < ver.size()) verified.resize(ver.size(), 0), accepted.resize(ver.size(), 0);
    for (size_t i = 0; i < ver.size(); ++i) {
      verified[i] += ver[i];
      accepted[i] += r.metrics.draft_accepted_per_position[i];
    }
    int64_t n = r.outputs.empty() ? 0 : int64_t(r.outputs[0].token_ids.size());
    if (n > 1) {
      s.mean_tpot_s += (r.metrics.last_token_time - r.metrics.first_token_time) / double(n - 1);
      n_tpot++;
    }
  }
  if (s.num_verify_steps > 0)
    s.acceptance_length = 1.0 + double(s.num_accepted_draft_tokens) / double(s.num_verify_steps);
  for (size_t i = 0; i < verified.size(); ++i)
    s.acceptance_rate_per_position.push_back(verified[i] > 0 ? double(accepted[i]) / double(verified[i]) : 0.0);
  if (n_ttft) s.mean_ttft_s /= double(n_ttft);
  if (n_tpot) s.mean_tpot_s /= double(n_tpot);
  if (s.num_prompt_tokens) s.prefix_hit_rate = double(s.num_cached_tokens) / double(s.num_prompt_tokens);
  if (s.elapsed_s > 0) {
    s.output_tokens_per_s = double(s.num_output_tokens) / s.elapsed_s;
    s.total_tokens_per_s = double(s.num_output_tokens + s.num_prompt_tokens) / s.elapsed_s;
  }
  return s;
}
}  // namespace

std::vector<RequestOutput> LLM::generate(const std::vector<PromptInput>& prompts, const std::vector<SamplingParams>& params,
                                         const GenerateOptions& options) {
  if (params.size() != 1 && params.size() != prompts.size())
    DI_THROW(InvalidArgument, "generate: got ", params.size(), " SamplingParams for ", prompts.size(),
             " prompts (pass one, or one per prompt)");
  Impl& m = *impl_;
  Engine& eng = *m.engine;
  GenerateSummary s;
  s.num_requests = int64_t(prompts.size());
  double t0 = engine::now_seconds();
  std::vector<RequestOutput> results(prompts.size());
  std::unordered_map<std::string, size_t> index;
  std::vector<size_t> rejected;
  Inbox box;
  int64_t steps0 = 0, pre0 = 0, spill0 = 0, load0 = 0;
  double draft0 = 0, verify0 = 0;
  engine::DraftGate::Stats gate0;
  {
    std::lock_guard<FairMutex> lock(m.mu);
    steps0 = eng.scheduler().stats().num_steps, pre0 = eng.scheduler().stats().num_preemptions;
    spill0 = eng.runner().stats().blocks_to_host, load0 = eng.runner().stats().blocks_from_host;
    draft0 = eng.runner().stats().draft_time_s, verify0 = eng.runner().stats().verify_time_s;
    gate0 = eng.scheduler().draft_gate().stats();
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::string id = m.new_id();
      results[i].request_id = id;
      try {
        m.add(id, prompts[i], params.size() == 1 ? params[0] : params[i]);
        m.owner[id] = &box;
        index[id] = i;
      } catch (const std::exception& e) {
        // A bad request fails alone; the rest of the batch still runs. Admission should only
        // throw deepinfer::Error; anything else (a library exception a parser let through) is a
        // bug, reported on this request as an internal error rather than failing the whole call.
        const bool typed = dynamic_cast<const Error*>(&e) != nullptr;
        results[i].prompt = prompts[i].text;
        results[i].prompt_token_ids = prompts[i].token_ids;
        results[i].finished = true;
        results[i].error = escape_invalid_utf8(typed ? std::string(e.what()) : std::string("internal error: ") + e.what());
        rejected.push_back(i);
      }
    }
  }
  // Whatever way this call ends (a throwing callback, a failed step), none of its requests stay
  // behind in the engine, and `box` (on this stack) leaves the owner map.
  struct Release {
    Impl& m;
    Inbox& box;
    ~Release() {
      std::lock_guard<FairMutex> lock(m.mu);
      m.release(box);
    }
  } release{m, box};
  s.num_failed = int64_t(rejected.size());
  for (size_t i : rejected) {
    DI_WARN("request ", i, " rejected: ", results[i].error);
    if (options.on_output) options.on_output(results[i]);
  }
  int64_t done = int64_t(rejected.size()), unfinished = int64_t(index.size());
  bool bar = options.progress_bar && isatty(2);
  auto consume = [&](std::vector<RequestOutput>& got) {
    for (RequestOutput& o : got) {
      if (options.on_output) options.on_output(o);
      if (!o.finished) continue;
      done++, unfinished--;
      results[index.at(o.request_id)] = std::move(o);
    }
  };
  while (unfinished > 0) {
    std::vector<RequestOutput> got;
    const bool cancel = options.should_cancel && options.should_cancel();
    {
      std::lock_guard<FairMutex> lock(m.mu);
      if (cancel) m.release(box);  // the aborts' final outputs land in `box`
      else m.step_for(box);
      got.swap(box.outputs);
      if (got.empty() && !m.unfinished())
        DI_THROW(InternalError, "generate: ", unfinished, " request(s) left the engine without a final output");
    }
    consume(got);
    if (cancel) break;
    if (bar) {
      int64_t out_tok = 0;
      for (auto& r : results) for (auto& c : r.outputs) out_tok += int64_t(c.token_ids.size());
      draw_progress(done, s.num_requests, out_tok, engine::now_seconds() - t0);
    }
  }
  if (bar) std::fprintf(stderr, "\n");
  s.elapsed_s = engine::now_seconds() - t0;
  std::lock_guard<FairMutex> lock(m.mu);
  // With concurrent callers these counters include their steps too (the steps were shared).
  s.num_steps = eng.scheduler().stats().num_steps - steps0;
  s.num_preemptions = eng.scheduler().stats().num_preemptions - pre0;
  s.draft_time_s = eng.runner().stats().draft_time_s - draft0;
  s.verify_time_s = eng.runner().stats().verify_time_s - verify0;
  {
    const engine::DraftGate::Stats& g = eng.scheduler().draft_gate().stats();
    s.num_drafting_stopped = g.requests_stopped - gate0.requests_stopped;
    s.num_drafting_reprobes = g.reprobes - gate0.reprobes;
    if (s.num_drafting_stopped > 0)
      s.drafting_stopped_acceptance =
          (g.stopped_tokens_per_verify - gate0.stopped_tokens_per_verify) / double(s.num_drafting_stopped);
    s.drafting_threshold = g.last_threshold;
  }
  s.num_checkpoints = eng.scheduler().prefix_cache().stats().num_checkpoints;
  s.checkpoint_bytes = int64_t(eng.scheduler().prefix_cache().stats().checkpoint_bytes);
  s.host_blocks_spilled = eng.runner().stats().blocks_to_host - spill0;
  s.host_blocks_loaded = eng.runner().stats().blocks_from_host - load0;
  m.summary = summarize(results, s);
  return results;
}

std::string LLM::add_request(const PromptInput& prompt, const SamplingParams& params) {
  Impl& m = *impl_;
  std::lock_guard<FairMutex> lock(m.mu);
  std::string id = m.new_id();
  m.add(id, prompt, params);
  m.owner[id] = &m.stream;
  return id;
}

std::vector<RequestOutput> LLM::step() {
  Impl& m = *impl_;
  std::lock_guard<FairMutex> lock(m.mu);
  m.step_for(m.stream);
  std::vector<RequestOutput> out;
  out.swap(m.stream.outputs);
  return out;
}

void LLM::abort_request(const std::string& request_id) {
  std::lock_guard<FairMutex> lock(impl_->mu);
  impl_->abort_locked(request_id);
}

bool LLM::has_unfinished() const {
  std::lock_guard<FairMutex> lock(impl_->mu);
  return impl_->unfinished();
}

std::string LLM::reserve_request_id() { return impl_->new_id(); }

std::vector<RequestOutput> LLM::chat(const std::vector<std::vector<ChatMessage>>& conversations,
                                     const std::vector<SamplingParams>& params, const ChatTemplateOptions& chat_options,
                                     const GenerateOptions& options) {
  std::vector<PromptInput> prompts;
  for (const auto& conv : conversations) prompts.push_back(PromptInput::from_text(chat_prompt(conv, chat_options)));
  return generate(prompts, params, options);
}

std::string LLM::chat_prompt(const std::vector<ChatMessage>& conversation, const ChatTemplateOptions& options) const {
  const engine::TextCodec* c = impl_->engine->codec();
  if (!c) DI_THROW(TokenizerError, "chat needs a tokenizer (the LLM was built with skip_tokenizer_init)");
  return c->chat_prompt(conversation, options);
}

std::vector<int32_t> LLM::encode(const std::string& text) const {
  const engine::TextCodec* c = impl_->engine->codec();
  if (!c) DI_THROW(TokenizerError, "no tokenizer loaded (skip_tokenizer_init)");
  return c->encode(text);
}

std::string LLM::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const engine::TextCodec* c = impl_->engine->codec();
  if (!c) DI_THROW(TokenizerError, "no tokenizer loaded (skip_tokenizer_init)");
  return c->decode(ids, skip_special_tokens);
}

bool LLM::has_tokenizer() const { return impl_->engine->codec() != nullptr; }
int64_t LLM::vocab_size() const { return impl_->engine->model().vocab_size(); }
int64_t LLM::max_model_len() const { return impl_->engine->max_model_len(); }
GenerateSummary LLM::last_summary() const {
  std::lock_guard<FairMutex> lock(impl_->mu);
  return impl_->summary;
}

void LLM::set_op_profiling(bool on) {
  std::lock_guard<FairMutex> lock(impl_->mu);
  impl_->engine->model().set_op_profiling(on);
}

std::vector<OpTiming> LLM::take_op_profile() {
  std::lock_guard<FairMutex> lock(impl_->mu);
  return impl_->engine->model().take_op_profile();
}

namespace {
// "data-parallel 3 ranks", "context-parallel 2 ranks", "data-parallel 2 x context-parallel 2 ranks".
std::string ranks_str(const engine::dp::RankRuntime& r) {
  if (!r.cp) return detail::str_cat("; data-parallel ", r.world_size, " ranks");
  const int cp = r.cp->size(), dp = r.world_size / cp;
  return dp > 1 ? detail::str_cat("; data-parallel ", dp, " x context-parallel ", cp, " ranks")
                : detail::str_cat("; context-parallel ", cp, " ranks");
}
}  // namespace

std::string LLM::describe() const {
  const kv::CacheGeometry& g = impl_->engine->cache().geometry();
  return detail::str_cat(impl_->engine->model().describe(), "; cache: ", g.num_blocks, " blocks x ", g.block_tokens,
                         " tokens, ", g.num_slots, " slots; max_model_len ", max_model_len(), "; accelerator ",
                         accelerator_name(impl_->env.accelerator),
                         impl_->ranks ? detail::str_cat(ranks_str(*impl_->ranks),
                                                        impl_->engine->model().joins_collectives() ? ", experts sharded" : "")
                                      : std::string());
}

std::string GenerateSummary::str() const {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "requests: %lld (%lld failed)  prompt tokens: %lld  output tokens: %lld  time: %.2f s\n"
                "TTFT: %.1f ms  TPOT: %.1f ms  throughput: %.1f output tok/s, %.1f total tok/s  steps: %lld  preemptions: %lld\n"
                "prefix cache: %lld cached prompt tokens (hit rate %.1f%%), %lld checkpoints (%.1f MiB), host tier %lld "
                "blocks spilled / %lld loaded",
                (long long)num_requests, (long long)num_failed, (long long)num_prompt_tokens, (long long)num_output_tokens,
                elapsed_s, mean_ttft_s * 1e3, mean_tpot_s * 1e3, output_tokens_per_s, total_tokens_per_s,
                (long long)num_steps, (long long)num_preemptions, (long long)num_cached_tokens, prefix_hit_rate * 100.0,
                (long long)num_checkpoints, double(checkpoint_bytes) / double(1 << 20), (long long)host_blocks_spilled,
                (long long)host_blocks_loaded);
  std::string out = buf;
  if (num_draft_tokens > 0) {
    std::snprintf(buf, sizeof buf,
                  "\nspeculative: acceptance length %.3f tokens/step over %lld verify steps, %lld of %lld drafts "
                  "accepted; draft time %.2f s, verify time %.2f s; per position:",
                  acceptance_length, (long long)num_verify_steps, (long long)num_accepted_draft_tokens,
                  (long long)num_draft_tokens, draft_time_s, verify_time_s);
    out += buf;
    for (double r : acceptance_rate_per_position) {
      std::snprintf(buf, sizeof buf, " %.3f", r);
      out += buf;
    }
  }
  if (num_drafting_stopped > 0) {
    std::snprintf(buf, sizeof buf,
                  "\ndrafting disabled for %lld requests: acceptance %.2f tokens/step (their batch's mean was below "
                  "the %.2f a drafting step costs in plain steps; %lld re-probes; DEEPINFER_SPEC_ADAPTIVE=0 keeps drafting)",
                  (long long)num_drafting_stopped, drafting_stopped_acceptance, drafting_threshold,
                  (long long)num_drafting_reprobes);
    out += buf;
  }
  return out;
}

}  // namespace deepinfer
