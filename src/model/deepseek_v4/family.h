// The DeepSeek-V4 family entry of the model registry: config -> layer plans -> weights (tensor
// table) -> backend (CPU, or the GPU when the options ask for it) -> the shared model.
#pragma once
#include <memory>
#include <string>

#include "model/registry.h"

namespace deepinfer::model::v4 {

ModelFamily family();
// The GPU side (model/deepseek/cuda; a stub that throws when the build has no CUDA backend).
std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions& options);

}  // namespace deepinfer::model::v4
