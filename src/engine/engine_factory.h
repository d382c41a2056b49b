// Building an Engine from the LLM's config, in two parts so that a parallel rank can wire its
// model to its process groups between loading and the engine (the engine plans and allocates the
// cache from the model as it is then).
#pragma once
#include <memory>
#include <string>

#include "core/env.h"
#include "deepinfer/llm.h"
#include "engine/adapters.h"
#include "engine/engine.h"
#include "model/causal_lm.h"

namespace deepinfer::engine {

// The LLMConfig's own checks (fields named as LLMConfig.<field>); before any load.
void validate_llm_config(const LLMConfig& config);

// The environment as read once, with LLMConfig.accelerator applied; refuses knobs that need
// nothing from the model before a (possibly long) load.
EnvConfig resolve_env(const LLMConfig& config);
// The same on an environment already read: LLMConfig.accelerator applied, knobs checked.
void apply_accelerator(const LLMConfig& config, EnvConfig& env);

struct LoadedParts {
  std::string path;  // the resolved checkpoint
  std::unique_ptr<model::CausalLM> model;
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<GrammarCompiler> grammar;
};
// `device`: the accelerator index (a data-parallel rank passes its local rank; device backends
// take it modulo the visible devices, so several ranks may share one GPU).
// `shard`: the routed experts to prepare (expert parallelism without EPLB; empty = all).
LoadedParts load_parts(const LLMConfig& config, const EnvConfig& env, int device = 0,
                       std::optional<parallel::ExpertShard> shard = std::nullopt);
std::unique_ptr<Engine> make_engine(const LLMConfig& config, const EnvConfig& env, LoadedParts parts);

}  // namespace deepinfer::engine
