// The DeepSeek-V4.1 family entry of the model registry (`DeepseekV41ForCausalLM`): config -> layer
// plans -> weights (either naming) -> the CPU backend (or the CUDA backend,
// deepseek/cuda/v41_cuda_model.h: with DEEPINFER_ACCELERATOR=nvidia, and with auto when a GPU is
// present and takes everything asked for) -> the shared model (model.h).
#pragma once
#include "model/registry.h"

namespace deepinfer::model::v41 {

ModelFamily family();
// The GPU model (deepseek/cuda/v41_cuda_model.cpp); a build without the CUDA backend refuses.
std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions& options);
// Why DEEPINFER_ACCELERATOR=auto keeps <dir> on the CPU although a GPU is present ("" = it does
// not): a config the GPU kernels refuse, or expert parallelism. DSpark drafting no longer keeps it
// on the CPU (the GPU model drafts with its stages on the host).
std::string auto_gpu_refusal(const std::string& dir, const ModelLoadOptions& options);

}  // namespace deepinfer::model::v41
