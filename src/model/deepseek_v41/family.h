// The DeepSeek-V4.1 family entry of the model registry (`DeepseekV41ForCausalLM`): config -> layer
// plans -> weights (either naming) -> the CPU backend (or, with DEEPINFER_ACCELERATOR=nvidia, the CUDA
// backend: deepseek/cuda/v41_cuda_model.h) -> the shared model (model.h).
#pragma once
#include "model/registry.h"

namespace deepinfer::model::v41 {

ModelFamily family();
// The GPU model (deepseek/cuda/v41_cuda_model.cpp); a build without the CUDA backend refuses.
std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions& options);

}  // namespace deepinfer::model::v41
