// `deepinfer bench-structured`: structured outputs through the engine, end to end (issue #19,
// docs/PERFORMANCE.md). B requests, each with its own JSON schema (--schemas: one schema per
// line), are added together and generated greedily on the model (default: the bundled default
// model, on the CPU) until all finish. The engine's grammar compiler is wrapped so that every
// step's fill_bitmasks call (the step waits for it: the masks are on its critical path) is
// timed; add_request's time (it waits up to EngineConfig::grammar_compile_wait_s for a compile,
// which queues behind earlier precomputes on the same worker) is timed apart. Each
// --precompute-ms value gets its own engine, vocabulary and grammar caches (nothing is shared
// between them); the outputs of every configuration must be identical token for token (masks
// do not depend on the precompute), else the command fails.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "cli/command.h"
#include "cli/lists.h"
#include "core/check.h"
#include "deepinfer/error.h"
#include "engine/engine_factory.h"

namespace {
using namespace deepinfer;
using namespace deepinfer::engine;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Forwards to the engine's grammar compiler, timing each step's mask fill.
class TimedGrammar final : public GrammarCompiler {
 public:
  explicit TimedGrammar(std::unique_ptr<GrammarCompiler> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<GrammarMatcher> compile(const StructuredOutputsParams& s) override { return inner_->compile(s); }
  std::shared_ptr<PendingGrammar> compile_async(const StructuredOutputsParams& s) override {
    return inner_->compile_async(s);
  }
  void fill_bitmasks(std::span<const GrammarMaskJob> jobs) override {
    const auto t0 = Clock::now();
    inner_->fill_bitmasks(jobs);
    step_ms_ += ms_since(t0);
    for (const GrammarMaskJob& j : jobs) masks_ += int64_t(j.drafts.size()) + 1;  // rows
  }
  int64_t num_distinct_grammars() const override { return inner_->num_distinct_grammars(); }
  // The mask time and masks since the last call.
  std::pair<double, int64_t> take() { return {std::exchange(step_ms_, 0.0), std::exchange(masks_, 0)}; }

 private:
  std::unique_ptr<GrammarCompiler> inner_;
  double step_ms_ = 0;
  int64_t masks_ = 0;
};

struct Options {
  std::string model, schemas;
  std::vector<double> precompute_ms{0, 50};
  int64_t max_tokens = 64, repeat = 1, grammar_threads = 0, prompt_words = 48;
};

struct Run {
  double precompute_ms = 0;
  double wall_ms = 0, add_ms = 0, add_max_ms = 0, mask_ms = 0, first_mask_ms = 0;
  std::vector<double> step_mask_ms, step_ms;  // [steps with masks]
  int64_t masks = 0, tokens = 0, stopped = 0;
  std::map<std::string, std::vector<int32_t>> outputs;  // request id -> tokens
};

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q / 100.0 * double(v.size())))];
}

std::vector<std::string> read_schemas(const std::string& path) {
  std::ifstream f(path);
  if (!f) DI_THROW(InvalidArgument, "bench-structured: cannot read --schemas ", path);
  std::vector<std::string> out;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const nlohmann::json parsed = nlohmann::json::parse(line);  // only checked here; the engine parses it again
      (void)parsed;
    } catch (const nlohmann::json::parse_error& e) {
      DI_THROW(InvalidArgument, "bench-structured: ", path, " line ", n, " is not JSON: ", e.what());
    }
    out.push_back(line);
  }
  if (out.empty()) DI_THROW(InvalidArgument, "bench-structured: ", path, " has no schemas");
  return out;
}

Run run_one(const Options& o, const std::vector<std::string>& schemas, double precompute_ms) {
  LLMConfig cfg;
  cfg.model = o.model;
  cfg.accelerator = "cpu";
  cfg.max_num_seqs = int64_t(schemas.size());
  cfg.max_model_len = o.prompt_words * 4 + o.max_tokens + 64;
  cfg.max_num_batched_tokens = std::max<int64_t>(2048, cfg.max_model_len * cfg.max_num_seqs);
  const EnvConfig env = resolve_env(cfg);
  LoadedParts parts = load_parts(cfg, env);
  auto timed = std::make_unique<TimedGrammar>(make_grammar_compiler(
      parts.codec.get(), parts.model->vocab_size(), parts.model->eos_token_id(), int(o.grammar_threads), precompute_ms));
  TimedGrammar& grammar = *timed;
  parts.grammar = std::move(timed);
  std::unique_ptr<Engine> eng = make_engine(cfg, env, std::move(parts));
  Run r;
  r.precompute_ms = precompute_ms;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = int(o.max_tokens);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < schemas.size(); ++i) {
    sp.structured_outputs = StructuredOutputsParams{};
    sp.structured_outputs->json = schemas[i];
    // Prompts of different words so prefill is real work (the gap the precompute fills).
    std::string prompt = "Request " + std::to_string(i) + ": answer with one JSON value for the schema.";
    for (int64_t w = 0; w < o.prompt_words; ++w) prompt += " word" + std::to_string((w * 7 + int64_t(i) * 13) % 97);
    const auto a0 = Clock::now();
    eng->add_request("r" + std::to_string(i), PromptInput::from_text(prompt), sp, 0);
    const double a = ms_since(a0);
    r.add_ms += a;
    r.add_max_ms = std::max(r.add_max_ms, a);
  }
  (void)grammar.take();  // add_request makes no masks; reset anyway
  bool first = true;
  for (int guard = 0; eng->has_unfinished(); ++guard) {
    DI_CHECK(guard < 1000000, "bench-structured: the engine made no progress");
    const auto s0 = Clock::now();
    for (const RequestOutput& out : eng->step()) {
      if (!out.error.empty()) DI_THROW(InternalError, "bench-structured: request ", out.request_id, " failed: ", out.error);
      if (!out.finished || out.outputs.empty()) continue;
      r.outputs[out.request_id] = out.outputs[0].token_ids;
      r.tokens += int64_t(out.outputs[0].token_ids.size());
      r.stopped += out.outputs[0].finish_reason == "stop";
    }
    const double step = ms_since(s0);
    const auto [m, n] = grammar.take();
    if (n == 0) continue;  // prefill-only steps make no masks
    if (first) r.first_mask_ms = m;
    first = false;
    r.step_mask_ms.push_back(m);
    r.step_ms.push_back(step);
    r.mask_ms += m;
    r.masks += n;
  }
  r.wall_ms = ms_since(t0);
  return r;
}

void print(const Run& r, size_t B) {
  double steps_ms = 0;
  for (double s : r.step_ms) steps_ms += s;
  std::printf(
      "{\"precompute_ms\": %g, \"requests\": %zu, \"stopped\": %ld, \"tokens\": %ld, \"wall_ms\": %.1f, "
      "\"add_request_ms\": %.2f, \"add_request_max_ms\": %.2f, \"mask_steps\": %zu, \"masks\": %ld, "
      "\"mask_ms_total\": %.2f, \"mask_ms_first_step\": %.3f, \"mask_ms_step_p50\": %.3f, \"mask_ms_step_p99\": %.3f, "
      "\"mask_ms_step_max\": %.3f, \"step_ms_p50\": %.3f, \"mask_share_of_steps\": %.3f}\n",
      r.precompute_ms, B, long(r.stopped), long(r.tokens), r.wall_ms, r.add_ms, r.add_max_ms, r.step_mask_ms.size(),
      long(r.masks), r.mask_ms, r.first_mask_ms, pct(r.step_mask_ms, 50), pct(r.step_mask_ms, 99),
      pct(r.step_mask_ms, 100), pct(r.step_ms, 50), steps_ms > 0 ? r.mask_ms / steps_ms : 0.0);
  std::fflush(stdout);
}

int run_bench_structured(int argc, char** argv) {
  CLI::App app{"Structured outputs through the engine: per-step mask wait with the mask precompute on and off"};
  Options o;
  std::string pre = "0,50";
  app.add_option("--schemas", o.schemas, "JSON schemas, one per line (one request each)")->required();
  app.add_option("-m,--model", o.model, "checkpoint folder (default: the bundled default model)");
  app.add_option("--precompute-ms", pre, "comma-separated mask precompute budgets, one engine each (0: off)")
      ->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "max new tokens per request")->capture_default_str();
  app.add_option("--prompt-words", o.prompt_words, "words of each prompt (prefill work before the first mask)")
      ->capture_default_str();
  app.add_option("--grammar-threads", o.grammar_threads, "grammar worker threads (0: the engine's default)")
      ->capture_default_str();
  app.add_option("--repeat", o.repeat, "runs of every configuration, alternating")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.precompute_ms.clear();
  for (const std::string& s : cli::split_list(pre)) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || !(v >= 0 && v <= 60000))
      DI_THROW(InvalidArgument, "bench-structured: --precompute-ms item '", s, "' is not a number of ms in [0, 60000]");
    o.precompute_ms.push_back(v);
  }
  if (o.precompute_ms.empty() || o.repeat < 1 || o.max_tokens < 1)
    DI_THROW(InvalidArgument, "bench-structured: needs --precompute-ms values, --repeat >= 1 and --max-tokens >= 1");
  const std::vector<std::string> schemas = read_schemas(o.schemas);
  std::optional<std::map<std::string, std::vector<int32_t>>> reference;
  for (int64_t k = 0; k < o.repeat; ++k)
    for (double p : o.precompute_ms) {
      const Run r = run_one(o, schemas, p);
      print(r, schemas.size());
      if (!reference) reference = r.outputs;
      else if (*reference != r.outputs)
        DI_THROW(InternalError, "bench-structured: outputs with --precompute-ms ", p, " differ from the first run's");
    }
  std::fprintf(stderr, "bench-structured: outputs identical across all %zu runs\n", o.precompute_ms.size() * size_t(o.repeat));
  return 0;
}

}  // namespace

DI_REGISTER_COMMAND("bench-structured", "structured outputs through the engine: per-step mask wait, precompute on/off",
                    run_bench_structured);
