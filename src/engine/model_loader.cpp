#include "engine/model_loader.h"

#include <filesystem>

#include "core/check.h"
#include "engine/engine.h"
#include "engine/engine_factory.h"
#include "engine/toy_model.h"

#if defined(DEEPINFER_HAVE_MODEL)
#include "model/registry.h"
#endif

#ifndef DEEPINFER_DEFAULT_MODEL_DIR
#define DEEPINFER_DEFAULT_MODEL_DIR ""
#endif

namespace deepinfer::engine {
namespace fs = std::filesystem;
constexpr const char* kToy = "builtin:toy";

std::vector<std::string> default_model_candidates() {
  std::vector<std::string> out;
  std::error_code ec;
  // /proc/self/exe: the CLI binary itself (for the Python module it is the interpreter, whose
  // neighbours never hold a model; Python passes the package's own default path instead).
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && !exe.empty()) {
    const fs::path dir = exe.parent_path();
    for (const fs::path& p : {dir / ".." / "share" / "deepinfer" / "default-model", dir / ".." / "assets" / "default-model",
                              dir / "default-model"})
      out.push_back(p.lexically_normal().string());
  }
  const std::string built_from = DEEPINFER_DEFAULT_MODEL_DIR;
  if (!built_from.empty()) out.push_back(built_from);
  return out;
}

std::string default_model_dir() {
  for (const std::string& c : default_model_candidates())
    if (fs::exists(fs::path(c) / "config.json")) return c;
  return "";
}

std::string resolve_model_path(const LLMConfig& config, const EnvConfig& env) {
  if (!config.model.empty()) return config.model;
  if (!env.hf_model_dir.empty()) return env.hf_model_dir;
  std::string def = default_model_dir();
  if (!def.empty()) return def;
  std::string looked;
  for (const std::string& c : default_model_candidates()) looked += (looked.empty() ? "" : ", ") + c;
  DI_THROW(CheckpointError, "no model given and no bundled default model found (looked in ", looked,
           "): pass model=, set DEEPINFER_HF_MODEL_DIR, or keep the source tree's assets/default-model");
}

std::unique_ptr<model::CausalLM> load_model(const std::string& path, const model::ModelLoadOptions& options) {
  if (path == kToy) return std::make_unique<ToyModel>(ToyModelConfig{.max_rollback = options.limits.max_rollback});
  if (!fs::is_directory(path)) DI_THROW(CheckpointError, "model folder '", path, "' does not exist");
  if (!fs::exists(fs::path(path) / "config.json")) DI_THROW(CheckpointError, "model folder '", path, "' has no config.json");
#if defined(DEEPINFER_HAVE_MODEL)
  // The family is chosen by config.json `architectures` (model/registry.h); the family picks the
  // backend from DEEPINFER_ACCELERATOR.
  return model::load_model(path, options);
#else
  DI_THROW(CheckpointError, "cannot load '", path, "': this build has no model module");
#endif
}

std::unique_ptr<TextCodec> load_codec(const LLMConfig& config, const std::string& model_path, int64_t vocab_size) {
  if (config.skip_tokenizer_init) return nullptr;
  if (model_path == kToy && config.tokenizer.empty()) return make_toy_codec(vocab_size);
  std::string tok = config.tokenizer.empty() ? model_path : config.tokenizer;
  ChatFormat chat = ChatFormat::kV4;
#if defined(DEEPINFER_HAVE_MODEL)
  // A DeepSeek-V4.1 checkpoint (config.json architectures) chats in V4.1's format.
  if (fs::exists(fs::path(model_path) / "config.json") &&
      model::config_architecture(model_path).find("V41") != std::string::npos)
    chat = ChatFormat::kV41;
#endif
  return load_tokenizer_codec(tok, chat);
}

std::unique_ptr<Engine> build_engine(const LLMConfig& config, EnvConfig& env) {
  validate_llm_config(config);
  apply_accelerator(config, env);
  return make_engine(config, env, load_parts(config, env));
}

}  // namespace deepinfer::engine
