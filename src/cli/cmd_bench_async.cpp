// `deepinfer bench-async`: what asynchronous scheduling and batch-invariant mode cost or gain
// (issue #12, docs/PERFORMANCE.md). For each configuration an engine is built on the model
// (default: the bundled default model), B greedy requests of --prompt-len tokens are prefilled,
// --warmup-steps decode steps run, then --decode-steps pure decode steps are timed (nobody
// finishes inside the window, so each step emits B tokens): decode tokens/s over the window's
// wall time and, on a device backend, each step's device busy time and the device's idle time
// before it (CUDA events at the step's first upload and after its sampling was queued:
// CausalLM::set_profiling). Configurations: async on/off at each --async-batches B, and
// batch-invariant off/on (async on) at each --invariant-batches B; prefix caching as the engine
// defaults (on; --prefix-cache 0 turns it off); --drafts L times speculative decoding instead
// (async on: pipelined drafting steps, docs/DETERMINISM.md). --check-invariance / --check-prefix-invariance
// check bit-identity of one request alone, in batches, and (the latter) served from the prefix
// cache against the cache off, with batch invariance on.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "cli/lists.h"
#include "core/check.h"
#include "engine/engine.h"
#include "engine/model_loader.h"

namespace {
using namespace deepinfer;
using namespace deepinfer::engine;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string model;
  int64_t prompt_len = 64, warm = 8, steps = 64;
  bool prefix_cache = true;  // in the timed engines (the engine's default; distinct prompts: no hits)
  int32_t drafts = 0;        // speculative tokens in the timed engines (async on = pipelined drafting steps)
  float temperature = 0;     // of the timed requests (> 0: seeded sampling, sampled drafts)
  bool plain_steps = true;   // adaptive drafting's plain steps (DraftGateConfig::plain_steps)
  EnvConfig env;
};

struct Result {
  std::string what;
  int64_t B = 0;
  bool async = false, invariant = false;
  int32_t drafts = 0;
  double tokens_per_step = 0;  // per sequence (1 + accepted drafts with drafting)
  double tok_s = 0, step_ms = 0, busy_ms = 0, idle_ms = 0, idle_max_ms = 0;
  int64_t profiled = 0;
  std::string backend;
};

double mean(const std::vector<double>& v, size_t from = 0) {
  if (v.size() <= from) return 0;
  double s = 0;
  for (size_t i = from; i < v.size(); ++i) s += v[i];
  return s / double(v.size() - from);
}

std::vector<int32_t> prompt(int64_t P, int64_t vocab, int64_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < P; ++i) p.push_back(int32_t(3 + (i * 131 + salt * 977) % (vocab - 3)));
  return p;
}

Result run_one(const Config& c, int64_t B, bool async, bool invariant) {
  EnvConfig env = c.env;
  env.async_scheduling = async;
  env.batch_invariant = invariant;
  // A verify step commits up to 1 + drafts tokens per sequence: nobody may finish in the window.
  const int64_t max_out = (c.warm + c.steps + 8) * (1 + c.drafts);
  const int64_t max_len = c.prompt_len + max_out + 16;
  const int64_t budget = std::max<int64_t>(B * c.prompt_len, 256);
  EngineConfig ec;
  ec.env = env;
  ec.scheduler.max_num_seqs = B;
  ec.scheduler.max_num_batched_tokens = budget;
  ec.scheduler.max_model_len = max_len;
  ec.scheduler.prefix_cache.enabled = c.prefix_cache;
  ec.scheduler.draft_gate.plain_steps = c.plain_steps;
  ec.num_speculative_tokens = c.drafts;
  auto model = load_model(c.model, {.env = env,
                                    .limits = {.max_num_seqs = B, .max_num_batched_tokens = budget, .max_model_len = max_len,
                                               .max_rollback = c.drafts > 0 ? c.drafts + 1 : 0},
                                    .progress = false});
  Engine eng(ec, std::move(model), nullptr);
  Result r{.what = "", .B = B, .async = eng.async_scheduling(), .invariant = invariant, .drafts = c.drafts,
           .backend = eng.model().describe()};
  SamplingParams sp;
  sp.temperature = c.temperature;
  sp.ignore_eos = true;
  sp.max_tokens = int(max_out);
  const int64_t vocab = eng.model().vocab_size();
  for (int64_t i = 0; i < B; ++i) {
    sp.seed = uint64_t(1000 + i);
    eng.add_request("b" + std::to_string(i), PromptInput::from_token_ids(prompt(c.prompt_len, vocab, i)), sp, 0);
  }
  // Prefill until every request has its first token, then the warm-up decode steps.
  std::vector<size_t> have(size_t(B), 0);
  auto emitted = [&](const std::vector<RequestOutput>& outs) {
    int64_t n = 0;
    for (const RequestOutput& o : outs) {
      const size_t i = size_t(std::stoll(o.request_id.substr(1)));
      const size_t now = o.outputs.empty() ? 0 : o.outputs[0].token_ids.size();
      n += int64_t(now - have[i]);
      have[i] = now;
    }
    return n;
  };
  for (int guard = 0; *std::min_element(have.begin(), have.end()) == 0; ++guard) {
    DI_CHECK(guard < 100000, "bench-async: prefill made no progress");
    emitted(eng.step());
  }
  for (int64_t i = 0; i < c.warm; ++i) emitted(eng.step());
  eng.model().set_profiling(true);
  const ModelRunner::Stats run0 = eng.runner().stats();
  int64_t tokens = 0;
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < c.steps; ++i) tokens += emitted(eng.step());
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const model::CausalLM::StepProfile prof = eng.model().take_profile();
  eng.model().set_profiling(false);
  r.tok_s = double(tokens) / wall;
  r.step_ms = wall * 1e3 / double(c.steps);
  r.tokens_per_step = double(tokens) / double(c.steps * B);
  r.profiled = int64_t(prof.busy_ms.size());
  r.busy_ms = mean(prof.busy_ms);
  r.idle_ms = mean(prof.idle_ms, 1);  // the first step has no predecessor inside the window
  for (size_t i = 1; i < prof.idle_ms.size(); ++i) r.idle_max_ms = std::max(r.idle_max_ms, prof.idle_ms[i]);
  if (c.drafts > 0) {  // where a drafting step's time goes (host clock, the timed window)
    const ModelRunner::Stats& run1 = eng.runner().stats();
    std::fprintf(stderr, "bench-async: B=%ld async=%d drafting: propose %.3f ms per step (%ld calls), verify steps %ld\n",
                 long(B), int(r.async), (run1.draft_time_s - run0.draft_time_s) * 1e3 / double(c.steps),
                 long(run1.draft_calls - run0.draft_calls), long(run1.verify_steps - run0.verify_steps));
  }
  if (const DraftGate::Stats& g = eng.scheduler().draft_gate().stats(); g.stops + g.probes > 0) {
    const SchedulerStats& st = eng.scheduler().stats();
    std::fprintf(stderr, "bench-async: B=%ld async=%d adaptive drafting: %ld stops (%ld requests), %ld re-probes, %ld probes, "
                 "threshold %.2f; steps (all, prefill included): %ld drafter, %ld plain; %ld overlapped launches\n",
                 long(B), int(r.async), long(g.stops), long(g.requests_stopped), long(g.reprobes), long(g.probes),
                 g.last_threshold, long(st.num_drafter_steps), long(st.num_plain_steps),
                 long(eng.runner().stats().overlapped_launches));
  }
  return r;
}

// One greedy and one seeded request (logprobs 4) alone, then inside `n` neighbours of random
// lengths arriving over the first steps, with batch invariance on (async on): its token ids and
// logprob bits must be identical. Returns the cases that differ.
struct Trace {
  std::vector<int32_t> ids;
  std::vector<float> lps;
  bool operator==(const Trace& o) const {
    return ids == o.ids && lps.size() == o.lps.size() &&
           std::equal(lps.begin(), lps.end(), o.lps.begin(),
                      [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; });
  }
};

// One traced run: the target inside `neighbours` random requests arriving over its first steps.
// shared > 0: the target's prompt is a shared prefix of that many tokens + its own 17, and half
// the neighbours start with a piece of the prefix; with the cache on, a request with the prefix
// and another tail runs to the end first, so the target starts from its cached blocks.
struct TraceRun {
  bool seeded = false;
  int64_t neighbours = 0, budget = 2048;
  uint64_t seed = 1;
  bool prefix_cache = false;
  int64_t shared = 0;
};

Trace trace_in_batch(const Config& c, const TraceRun& tr, int64_t* cached = nullptr) {
  EnvConfig env = c.env;
  env.async_scheduling = true;
  env.batch_invariant = true;
  const int64_t max_len = tr.shared + 256;
  EngineConfig ec;
  ec.env = env;
  ec.scheduler.max_num_seqs = 256;
  ec.scheduler.max_num_batched_tokens = tr.budget;
  ec.scheduler.max_model_len = max_len;
  ec.scheduler.prefix_cache.enabled = tr.prefix_cache;
  ec.num_speculative_tokens = 0;
  auto model = load_model(c.model, {.env = env,
                                    .limits = {.max_num_seqs = 256, .max_num_batched_tokens = tr.budget, .max_model_len = max_len},
                                    .progress = false});
  Engine eng(ec, std::move(model), nullptr);
  DI_CHECK(eng.async_scheduling(), "bench-async: the traced engine is not asynchronous");
  const int64_t vocab = eng.model().vocab_size();
  const std::vector<int32_t> shared = prompt(tr.shared, vocab, 31337);
  auto with_shared = [&](int64_t len, std::vector<int32_t> tail) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + len);
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  SamplingParams tp;
  tp.max_tokens = 16;
  tp.ignore_eos = true;
  tp.logprobs = 4;
  tp.temperature = tr.seeded ? 0.9f : 0.f;
  if (tr.seeded) tp.seed = 987654321;
  std::mt19937_64 rng(tr.seed);
  std::vector<std::pair<int, int64_t>> arrivals;  // (step offset, neighbour)
  for (int64_t i = 0; i < tr.neighbours; ++i) arrivals.push_back({int(rng() % 5), i});
  // The request that fills the cache with the prefix first (cache on only).
  int target_at = 1;
  if (tr.prefix_cache && tr.shared > 0) {
    SamplingParams wp;
    wp.max_tokens = 3;
    wp.ignore_eos = true;
    wp.temperature = 0;
    eng.add_request("warm", PromptInput::from_token_ids(with_shared(tr.shared, prompt(9, vocab, 777))), wp, 0);
    for (int guard = 0; eng.has_unfinished(); ++guard) {
      DI_CHECK(guard < 100000, "bench-async: the prefix run made no progress");
      eng.step();
    }
  }
  Trace t;
  bool done = false;
  for (int step = 0; !done; ++step) {
    DI_CHECK(step < 100000, "bench-async: invariance run made no progress");
    if (step == target_at) {
      const std::vector<int32_t> own = prompt(tr.shared > 0 ? 17 : 37, vocab, 4242);
      eng.add_request("target", PromptInput::from_token_ids(tr.shared > 0 ? with_shared(tr.shared, own) : own), tp, 0);
    }
    for (auto [at, i] : arrivals) {
      if (at != step) continue;
      SamplingParams sp;
      sp.max_tokens = 1 + int(rng() % 24);
      sp.ignore_eos = true;
      sp.temperature = rng() % 2 ? 0.8f : 0.f;
      sp.seed = rng();
      std::vector<int32_t> np = prompt(1 + int64_t(rng() % 150), vocab, i);
      if (tr.shared > 0 && rng() % 2) np = with_shared(1 + int64_t(rng() % uint64_t(tr.shared)), np);
      eng.add_request("n" + std::to_string(i), PromptInput::from_token_ids(np), sp, 0);
    }
    for (const RequestOutput& o : eng.step()) {
      if (o.request_id != "target" || !o.finished) continue;
      DI_CHECK(o.error.empty(), "bench-async: the traced request failed: ", o.error);
      if (cached) *cached = o.num_cached_tokens;
      const CompletionOutput& co = o.outputs.at(0);
      t.ids = co.token_ids;
      if (co.logprobs)
        for (const auto& pos : *co.logprobs)
          for (const auto& [id, lp] : pos) {
            t.ids.push_back(id);
            t.lps.push_back(lp.logprob);
          }
      done = true;
    }
  }
  return t;
}

int check_invariance(const Config& c, const std::vector<int64_t>& sizes) {
  int bad = 0;
  for (bool seeded : {false, true}) {
    const Trace alone = trace_in_batch(c, {.seeded = seeded});
    uint64_t seed = 2;
    for (int64_t n : sizes)
      for (int64_t budget : {int64_t(61), int64_t(2048)}) {
        const bool same = trace_in_batch(c, {.seeded = seeded, .neighbours = n, .budget = budget, .seed = seed++}) == alone;
        bad += !same;
        std::printf("invariance %s: %ld neighbours, budget %ld: %s\n", seeded ? "seeded" : "greedy", long(n),
                    long(budget), same ? "identical" : "DIFFERS");
      }
  }
  return bad;
}

// Prefix caching with batch invariance on: the target (a shared prefix + its own tail) alone with
// the cache off, against the cache on after another request cached the prefix, alone and inside
// neighbours (half of them sharing part of the prefix), chunked (budget 61) and not.
int check_prefix_invariance(const Config& c, const std::vector<int64_t>& sizes, int64_t shared) {
  int bad = 0;
  std::vector<int64_t> counts = {0};
  counts.insert(counts.end(), sizes.begin(), sizes.end());
  for (bool seeded : {false, true}) {
    const Trace off = trace_in_batch(c, {.seeded = seeded, .shared = shared});
    uint64_t seed = 100;
    for (int64_t n : counts)
      for (int64_t budget : {int64_t(61), int64_t(2048)}) {
        int64_t cached = 0;
        const bool same = trace_in_batch(c, {.seeded = seeded, .neighbours = n, .budget = budget, .seed = seed++,
                                             .prefix_cache = true, .shared = shared},
                                         &cached) == off;
        bad += !same || cached == 0;
        std::printf("prefix invariance %s: cache on (%ld of %ld prompt tokens cached), %ld neighbours, budget %ld: %s\n",
                    seeded ? "seeded" : "greedy", long(cached), long(shared + 17), long(n), long(budget),
                    !same ? "DIFFERS" : cached == 0 ? "NO HIT" : "identical to the cache off");
      }
  }
  return bad;
}

int run_bench_async(int argc, char** argv) {
  CLI::App app{"Time decode with asynchronous scheduling on/off and batch-invariant mode on/off"};
  Config c;
  std::string async_b = "64", inv_b = "1,32,128", json_path, accelerator;
  app.add_option("-m,--model", c.model, "checkpoint folder (default: the bundled default model)");
  app.add_option("--prompt-len", c.prompt_len, "prompt tokens")->capture_default_str();
  app.add_option("--warmup-steps", c.warm, "decode steps before timing")->capture_default_str();
  app.add_option("--decode-steps", c.steps, "timed decode steps")->capture_default_str();
  app.add_option("--async-batches", async_b, "batch sizes timed with async on and off (empty: none)")->capture_default_str();
  app.add_option("--invariant-batches", inv_b, "batch sizes timed with batch invariance off and on")->capture_default_str();
  app.add_option("--accelerator", accelerator, "cpu | nvidia | auto (default: $DEEPINFER_ACCELERATOR)");
  app.add_option("--json", json_path, "also write the results as JSON lines here");
  std::string check_s;
  app.add_option("--check-invariance", check_s,
                 "neighbour counts: check that one request's ids and logprobs are bit-identical alone and in such "
                 "batches (batch invariance on); exit 1 when one differs");
  std::string prefix_check_s;
  int64_t shared = 600;
  app.add_option("--check-prefix-invariance", prefix_check_s,
                 "neighbour counts: check that a request hitting the prefix cache gives the ids and logprobs it gives "
                 "with the cache off (batch invariance on), alone and in such batches; exit 1 when one differs");
  app.add_option("--shared-prefix", shared, "shared prefix tokens of --check-prefix-invariance")->capture_default_str();
  app.add_option("--prefix-cache", c.prefix_cache, "prefix caching in the timed engines (1: the engine's default)")
      ->capture_default_str();
  app.add_option("--temperature", c.temperature, "timed requests' temperature (0: greedy; > 0: seeded sampling)")
      ->capture_default_str();
  app.add_option("--plain-steps", c.plain_steps,
                 "adaptive drafting: 1 runs a step where every request stopped drafting as a plain step; 0 keeps "
                 "feeding the drafter (the behaviour before, to compare)")
      ->capture_default_str();
  app.add_option("--drafts", c.drafts,
                 "speculative tokens in the timed engines (the model's drafter; async on = pipelined drafting steps)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (c.model.empty()) c.model = default_model_dir();
  if (c.model.empty()) DI_THROW(InvalidArgument, "bench-async: no --model and no bundled default model");
  DI_CHECK(c.prompt_len >= 1 && c.steps >= 1 && c.warm >= 0, "bench-async: bad --prompt-len/--decode-steps/--warmup-steps");
  DI_CHECK(c.drafts >= 0, "bench-async: --drafts must be >= 0");
  c.env = EnvConfig::from_environment();
  if (accelerator == "cpu") c.env.accelerator = Accelerator::kCPU;
  else if (accelerator == "nvidia") c.env.accelerator = Accelerator::kNvidia;
  else if (accelerator == "auto") c.env.accelerator = Accelerator::kAuto;
  else if (!accelerator.empty()) DI_THROW(InvalidArgument, "--accelerator '", accelerator, "': cpu, nvidia or auto");

  if (!check_s.empty()) {
    const int bad = check_invariance(c, cli::parse_int_list(check_s, "--check-invariance"));
    std::printf("invariance: %d case(s) differ\n", bad);
    if (bad) return 1;
  }
  if (!prefix_check_s.empty()) {
    DI_CHECK(shared > 0, "bench-async: --shared-prefix must be > 0");
    const int bad = check_prefix_invariance(c, cli::parse_int_list(prefix_check_s, "--check-prefix-invariance"), shared);
    std::printf("prefix invariance: %d case(s) differ or missed the cache\n", bad);
    if (bad) return 1;
  }
  std::vector<Result> rows;
  for (int64_t B : cli::parse_int_list(async_b, "--async-batches"))
    for (bool a : {false, true}) rows.push_back(run_one(c, B, a, false)), rows.back().what = "async";
  for (int64_t B : cli::parse_int_list(inv_b, "--invariant-batches"))
    for (bool inv : {false, true}) rows.push_back(run_one(c, B, true, inv)), rows.back().what = "invariant";
  if (!rows.empty()) std::printf("backend: %s\n", rows[0].backend.c_str());
  std::printf("%-9s %5s %5s %9s %6s %10s %9s %9s %9s %9s %9s\n", "what", "B", "async", "invariant", "drafts", "tok/s",
              "step ms", "tok/step", "busy ms", "idle ms", "idle max");
  for (const Result& r : rows)
    std::printf("%-9s %5ld %5d %9d %6d %10.1f %9.3f %9.3f %9.3f %9.3f %9.3f\n", r.what.c_str(), long(r.B), int(r.async),
                int(r.invariant), int(r.drafts), r.tok_s, r.step_ms, r.tokens_per_step, r.busy_ms, r.idle_ms,
                r.idle_max_ms);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    DI_CHECK(bool(f), "--json '", json_path, "' cannot be written");
    for (const Result& r : rows)
      f << "{\"what\":\"" << r.what << "\",\"B\":" << r.B << ",\"async\":" << r.async << ",\"invariant\":" << r.invariant
        << ",\"drafts\":" << r.drafts << ",\"tokens_per_step\":" << r.tokens_per_step << ",\"tok_s\":" << r.tok_s
        << ",\"step_ms\":" << r.step_ms << ",\"busy_ms\":" << r.busy_ms
        << ",\"idle_ms\":" << r.idle_ms << ",\"idle_max_ms\":" << r.idle_max_ms << ",\"profiled\":" << r.profiled
        << "}\n";
  }
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("bench-async", "time async scheduling on/off and batch-invariant mode on/off", run_bench_async);
