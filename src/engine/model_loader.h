// Resolves LLMConfig.model and loads the model and tokenizer behind their interfaces.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "deepinfer/llm.h"
#include "engine/adapters.h"
#include "model/causal_lm.h"

namespace deepinfer::engine {
class Engine;

// config.model, else env.hf_model_dir, else the bundled default model (default_model_dir()).
std::string resolve_model_path(const LLMConfig& config, const EnvConfig& env);
// Folders searched for the bundled default model, in order: next to the running executable
// (<exe>/../share/deepinfer/default-model for an installed binary, <exe>/../assets/default-model for
// a build folder inside the source tree, <exe>/default-model), then the source tree this binary was
// built from (<source>/assets/default-model). Works from any working directory.
std::vector<std::string> default_model_candidates();
// The first candidate holding a config.json, or "" when none does.
std::string default_model_dir();
// Loads the checkpoint at `path` on the backend `options.env` selects, sized for
// `options.limits`. "builtin:toy" gives ToyModel. Throws CheckpointError naming the folder when
// it is missing or the model module is absent.
std::unique_ptr<model::CausalLM> load_model(const std::string& path, const model::ModelLoadOptions& options);
// Tokenizer for the model at `path` (or config.tokenizer); null with skip_tokenizer_init.
std::unique_ptr<TextCodec> load_codec(const LLMConfig& config, const std::string& model_path, int64_t vocab_size);

// The whole engine for `config`, as LLM builds it (and the server, which owns its engine on a
// thread of its own): config.accelerator applied to `env` (InvalidArgument for an unknown
// name), the knobs checked, model, tokenizer and grammar compiler loaded, limits checked
// (InvalidArgument naming the LLMConfig field). `env` is the environment as read once.
std::unique_ptr<Engine> build_engine(const LLMConfig& config, EnvConfig& env);

}  // namespace deepinfer::engine
