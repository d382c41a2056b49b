// The DeepSeek-V4.1 family entry of the model registry (`DeepseekV41ForCausalLM`): config -> layer
// plans -> weights (either naming) -> the CPU backend -> the shared model (model.h).
#pragma once
#include "model/registry.h"

namespace deepinfer::model::v41 {

ModelFamily family();

}  // namespace deepinfer::model::v41
