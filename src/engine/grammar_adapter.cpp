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
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#endif

namespace deepinfer::engine {

#if defined(DEEPINFER_HAVE_STRUCTURED)
namespace {

std::string so_args_json(const StructuredOutputsParams& spec) {
  if (spec.num_set() != 1)
    DI_THROW(InvalidArgument, "structured outputs: exactly one of json, regex, choice, grammar, json_object must be set (got ",
             spec.num_set(), ")");
  nlohmann::json j = nlohmann::json::object();
  if (spec.json) j["json_schema"] = *spec.json;  // schema text: the grammar engine parses it
  else if (spec.regex) j["regex"] = *spec.regex;
  else if (spec.choice) j["choice"] = *spec.choice;
  else if (spec.grammar) j["ebnf"] = *spec.grammar;
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

 private:
  structured::GrammarMatcher m_;
};

class StructuredCompiler final : public GrammarCompiler {
 public:
  explicit StructuredCompiler(std::shared_ptr<const structured::TokenVocabulary> vocab)
      : compiler_(std::move(vocab)) {}
  std::unique_ptr<GrammarMatcher> compile(const StructuredOutputsParams& spec) override {
    // compile() caches by the canonical so_args text: identical specs share one grammar.
    std::shared_ptr<const structured::CompiledGrammar> g = compiler_.compile(so_args_json(spec));
    {
      std::lock_guard<std::mutex> lock(mu_);
      distinct_.insert(g.get());
    }
    return std::make_unique<StructuredMatcher>(std::move(g));
  }
  int64_t num_distinct_grammars() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return int64_t(distinct_.size());
  }

 private:
  structured::GrammarCompiler compiler_;
  mutable std::mutex mu_;
  std::unordered_set<const structured::CompiledGrammar*> distinct_;  // identity only, never dereferenced
};

}  // namespace

std::unique_ptr<GrammarCompiler> make_grammar_compiler(const TextCodec* codec, int64_t vocab_size,
                                                       int64_t eos_token_id) {
  if (!codec) return nullptr;  // token ids only: nothing to match text against
  structured::TokenizerInfo info;
  info.token_bytes.resize(size_t(vocab_size));
  for (int64_t t = 0; t < vocab_size; ++t) {
    if (t == eos_token_id) continue;
    try {
      if (codec->is_special(int32_t(t))) {
        info.special_ids.push_back(int32_t(t));
        if (!codec->token_bytes(int32_t(t)).empty()) info.terminal_ids.push_back(int32_t(t));
      }
      else info.token_bytes[size_t(t)] = codec->token_bytes(int32_t(t));
    } catch (const Error&) {
      // Model ids past the tokenizer's (padded embedding rows): no bytes, never allowed.
    }
  }
  if (eos_token_id >= 0 && eos_token_id < vocab_size) info.stop_ids.push_back(int32_t(eos_token_id));
  return std::make_unique<StructuredCompiler>(structured::make_vocabulary(std::move(info)));
}

#else

std::unique_ptr<GrammarCompiler> make_grammar_compiler(const TextCodec*, int64_t, int64_t) { return nullptr; }

#endif

}  // namespace deepinfer::engine
