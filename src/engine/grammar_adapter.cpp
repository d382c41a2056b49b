// Wires the grammar engine (include/deepinfer/structured.h) to the sampler's bitmask when
// the module is built; otherwise structured-output requests are rejected at admission.
//
// SamplingParams.structured_outputs (vLLM names) -> the grammar's so_args JSON:
//   json -> {"json_schema": <schema text>}   regex -> {"regex": ...}   choice -> {"choice": [...]}
//   grammar -> {"ebnf": ...}                 json_object -> {"json_object": true}
//   plus trigger_token_ids / bound_token_id when set (the matcher applies DeepInfer's trigger).
// The vocabulary is the model's: token bytes from the tokenizer for every id below the
// model's vocab size ("" past the tokenizer's), the model's EOS as the stop token, and every
// other special token forbidden inside a grammar unless the grammar names it as a terminal,
// `<[id]>` (the server's tool-call grammars name the DSML and </think> tokens).
#include "engine/adapters.h"

#include "core/check.h"

#if defined(DEEPINFER_HAVE_STRUCTURED)
#include <algorithm>
#include <chrono>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#endif

namespace deepinfer::engine {

#if defined(DEEPINFER_HAVE_STRUCTURED)
namespace {

std::string so_args_json(const StructuredOutputsParams& spec) {
  if (spec.num_set() != 1)
    DI_THROW(InvalidArgument, "structured outputs: exactly one of json, regex, choice, grammar, json_object, tool_calls must be set (got ",
             spec.num_set(), ")");
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (spec.json) j["json_schema"] = *spec.json;  // schema text: the grammar engine parses it
  else if (spec.regex) j["regex"] = *spec.regex;
  else if (spec.choice) j["choice"] = *spec.choice;
  else if (spec.grammar) j["ebnf"] = *spec.grammar;
  else if (spec.tool_calls) {
    try {
      j["tool_calls"] = nlohmann::ordered_json::parse(*spec.tool_calls);  // the schemas' key order matters
    } catch (const nlohmann::json::parse_error& e) {
      DI_THROW(InvalidArgument, "structured outputs: tool_calls is not valid JSON: ", e.what());
    }
  }
  else j["json_object"] = true;
  if (!spec.trigger_token_ids.empty()) j["trigger_token_ids"] = spec.trigger_token_ids;
  if (spec.bound_token_id) j["bound_token_id"] = *spec.bound_token_id;
  return j.dump();
}

class StructuredMatcher final : public GrammarMatcher {
 public:
  explicit StructuredMatcher(std::shared_ptr<const structured::CompiledGrammar> g) : m_(std::move(g)) {}
  void fill_bitmask(std::vector<uint32_t>& mask) override {
    // Same layout (bit t of word t/32); int32 and uint32 may alias.
    m_.fill_next_token_bitmask(std::span<int32_t>(reinterpret_cast<int32_t*>(mask.data()), mask.size()));
  }
  bool accept_token(int32_t token) override { return m_.accept_token(token); }
  bool is_terminated() const override { return m_.is_terminated(); }
  bool supports_rollback() const override { return true; }
  void rollback(int32_t n) override { m_.rollback(n); }
  structured::GrammarMatcher& inner() { return m_; }

 private:
  structured::GrammarMatcher m_;
};

class StructuredCompiler;

// A compile running on the compiler's workers.
class StructuredPending final : public PendingGrammar {
 public:
  StructuredPending(StructuredCompiler& c, std::shared_future<std::shared_ptr<const structured::CompiledGrammar>> f)
      : compiler_(c), future_(std::move(f)) {}
  bool ready() const override { return wait_for(0); }
  bool wait_for(double seconds) const override {
    return future_.wait_for(std::chrono::duration<double>(std::max(0.0, seconds))) == std::future_status::ready;
  }
  std::unique_ptr<GrammarMatcher> make_matcher() const override;

 private:
  StructuredCompiler& compiler_;
  std::shared_future<std::shared_ptr<const structured::CompiledGrammar>> future_;
};

class StructuredCompiler final : public GrammarCompiler {
 public:
  StructuredCompiler(std::shared_ptr<const structured::TokenVocabulary> vocab, int threads, double precompute_ms)
      : compiler_(std::move(vocab)), workers_(threads, {.time_budget_ms = precompute_ms}) {}
  std::unique_ptr<GrammarMatcher> compile(const StructuredOutputsParams& spec) override {
    // compile() caches by the canonical so_args text: identical specs share one grammar.
    auto g = compiler_.compile(so_args_json(spec));
    // The first masks' state caches, filled on a worker while the prompt is prefilled.
    workers_.precompute_async(g);
    return matcher(std::move(g));
  }
  std::shared_ptr<PendingGrammar> compile_async(const StructuredOutputsParams& spec) override {
    // The spec's own errors (two kinds set) throw here; the grammar's arrive through the future.
    return std::make_shared<StructuredPending>(*this, workers_.compile_async(compiler_, so_args_json(spec)));
  }
  void fill_bitmasks(std::span<const GrammarMaskJob> jobs) override;
  int64_t num_distinct_grammars() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(distinct_.size());
  }
  std::unique_ptr<GrammarMatcher> matcher(std::shared_ptr<const structured::CompiledGrammar> g) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      distinct_.insert(g.get());
    }
    return std::make_unique<StructuredMatcher>(std::move(g));
  }

 private:
  structured::GrammarCompiler compiler_;
  structured::StructuredWorkers workers_;  // after compiler_: its threads stop first
  mutable std::mutex mu_;
  std::unordered_set<const structured::CompiledGrammar*> distinct_;  // identity only, never dereferenced
};

std::unique_ptr<GrammarMatcher> StructuredPending::make_matcher() const { return compiler_.matcher(future_.get()); }

void StructuredCompiler::fill_bitmasks(std::span<const GrammarMaskJob> jobs) {
  // Every job's matcher is ours when all came from this compiler; anything else fills in turn.
  std::vector<structured::MaskJob> mine;
  std::vector<std::vector<int32_t>> draft_words;  // contiguous rows for jobs with drafts
  std::vector<size_t> owner;
  mine.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const GrammarMaskJob& j = jobs[i];
    auto* m = dynamic_cast<StructuredMatcher*>(j.matcher);
    DI_CHECK(j.rows && j.rows->size() == j.drafts.size() + 1, "mask job ", i, ": ", j.rows ? j.rows->size() : 0,
             " rows for ", j.drafts.size(), " drafts");
    if (!m) {
      j.matcher->fill_bitmasks(j.drafts, *j.rows);
      continue;
    }
    const size_t w = j.rows->front().size();
    std::span<int32_t> words;
    if (j.drafts.empty()) {
      words = std::span<int32_t>(reinterpret_cast<int32_t*>(j.rows->front().data()), w);
    } else {
      draft_words.emplace_back((j.drafts.size() + 1) * w, 0);
      words = draft_words.back();
    }
    mine.push_back({&m->inner(), j.drafts, words, w, 0});
    owner.push_back(i);
  }
  workers_.fill_bitmasks(mine);
  for (size_t k = 0, d = 0; k < mine.size(); ++k) {
    const GrammarMaskJob& j = jobs[owner[k]];
    if (j.drafts.empty()) continue;
    if (size_t(mine[k].filled) != j.drafts.size() + 1)
      DI_THROW(InternalError, "draft ", mine[k].filled - 1, " (token ", j.drafts[size_t(mine[k].filled - 1)],
               ") was checked against the grammar but is rejected now");
    const std::vector<int32_t>& src = draft_words[d++];
    const size_t w = mine[k].row_words;
    for (size_t r = 0; r < j.rows->size(); ++r)
      std::copy(src.begin() + long(r * w), src.begin() + long((r + 1) * w), reinterpret_cast<int32_t*>((*j.rows)[r].data()));
  }
}

}  // namespace

std::unique_ptr<GrammarCompiler> make_grammar_compiler(const TextCodec* codec, int64_t vocab_size,
                                                       int64_t eos_token_id, int threads, double precompute_ms) {
  if (!codec) return nullptr;  // token ids only: nothing to match text against
  structured::TokenizerInfo info;
  info.token_bytes.resize(size_t(vocab_size));
  for (int64_t t = 0; t < vocab_size; ++t) {
    if (t == eos_token_id) continue;
    try {
      if (codec->is_special(int32_t(t))) {
        info.special_ids.push_back(int32_t(t));
        // Its text names it (so_args tool_calls finds the DSML token); the vocabulary respells it.
        if (!(info.token_bytes[size_t(t)] = codec->token_bytes(int32_t(t))).empty()) info.terminal_ids.push_back(int32_t(t));
      }
      else info.token_bytes[size_t(t)] = codec->token_bytes(int32_t(t));
    } catch (const Error&) {
      // Model ids past the tokenizer's (padded embedding rows): no bytes, never allowed.
    }
  }
  if (eos_token_id >= 0 && eos_token_id < vocab_size) info.stop_ids.push_back(int32_t(eos_token_id));
  if (threads <= 0) threads = int(std::clamp<unsigned>(std::thread::hardware_concurrency() / 2, 1, 8));
  return std::make_unique<StructuredCompiler>(structured::make_vocabulary(std::move(info)), threads, precompute_ms);
}

#else

std::unique_ptr<GrammarCompiler> make_grammar_compiler(const TextCodec*, int64_t, int64_t, int, double) { return nullptr; }

#endif

}  // namespace deepinfer::engine
