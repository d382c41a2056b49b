#include "engine/model_loader.h"

#include <filesystem>

#include "core/check.h"
#include "engine/toy_model.h"

#if defined(DEEPINFER_HAVE_MODEL) && __has_include("model/deepseek_v4/model.h")
#include "model/deepseek_v4/model.h"
#define DI_ENGINE_HAS_V4 1
#endif
#if defined(DEEPINFER_HAVE_MODEL_CUDA) && __has_include("model/deepseek_v4/cuda/cuda_model.h")
#include "model/deepseek_v4/cuda/cuda_model.h"
#define DI_ENGINE_HAS_V4_CUDA 1
#endif

#ifndef DEEPINFER_DEFAULT_MODEL_DIR
#define DEEPINFER_DEFAULT_MODEL_DIR ""
#endif

namespace deepinfer::engine {
namespace fs = std::filesystem;
constexpr const char* kToy = "builtin:toy";

std::string resolve_model_path(const LLMConfig& config, const EnvConfig& env) {
  if (!config.model.empty()) return config.model;
  if (!env.hf_model_dir.empty()) return env.hf_model_dir;
  std::string def = DEEPINFER_DEFAULT_MODEL_DIR;
  if (!def.empty() && fs::exists(def)) return def;
  DI_THROW(CheckpointError, "no model given: pass model=, set DEEPINFER_HF_MODEL_DIR, or run ./build.sh to make ",
           def.empty() ? std::string("models/default") : def);
}

std::unique_ptr<model::CausalLM> load_model(const std::string& path, const model::ModelLoadOptions& options) {
  // Until the model registry takes ModelLoadOptions, the V4 loaders get the environment only.
  const EnvConfig& env = options.env;
  if (path == kToy) return std::make_unique<ToyModel>(ToyModelConfig{.max_rollback = options.limits.max_rollback});
  if (!fs::is_directory(path)) DI_THROW(CheckpointError, "model folder '", path, "' does not exist");
  if (!fs::exists(fs::path(path) / "config.json")) DI_THROW(CheckpointError, "model folder '", path, "' has no config.json");
#if defined(DI_ENGINE_HAS_V4_CUDA)
  // DEEPINFER_ACCELERATOR=nvidia, or auto with a GPU present: the GPU forward.
  if (model::v4::use_cuda_model(env)) return model::v4::DeepseekV4CudaModel::load(path, env);
#endif
#if defined(DI_ENGINE_HAS_V4)
  return model::v4::DeepseekV4Model::load(path, env);
#else
  DI_THROW(CheckpointError, "cannot load '", path, "': this build has no DeepSeek-V4 model module");
#endif
}

std::unique_ptr<TextCodec> load_codec(const LLMConfig& config, const std::string& model_path, int64_t vocab_size) {
  if (config.skip_tokenizer_init) return nullptr;
  if (model_path == kToy && config.tokenizer.empty()) return make_toy_codec(vocab_size);
  std::string tok = config.tokenizer.empty() ? model_path : config.tokenizer;
  return load_tokenizer_codec(tok);
}

}  // namespace deepinfer::engine
