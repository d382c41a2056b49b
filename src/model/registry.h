// Model families by `architectures` in config.json: the one table the engine loads through (no
// compile-time switch over families). A family's loader picks its backend from the options
// (DEEPINFER_ACCELERATOR: nvidia -> the GPU, auto -> the GPU when one is present, cpu).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace deepinfer::model {

struct ModelFamily {
  std::string name;                        // "DeepSeek-V4"
  std::vector<std::string> architectures;  // config.json `architectures` values it serves
  std::function<std::unique_ptr<CausalLM>(const std::string& dir, const ModelLoadOptions&)> load;
};

// The families this build knows, in lookup order.
const std::vector<ModelFamily>& model_families();
// config.json `architectures[0]` of a model folder (ConfigError naming the file when absent/invalid).
std::string config_architecture(const std::string& dir);
// Loads the model in `dir` through its family; ConfigError listing the known architectures when
// none serves it.
std::unique_ptr<CausalLM> load_model(const std::string& dir, const ModelLoadOptions& options);

// Whether a device backend should be used for these options (accelerator and device presence),
// and the number of accelerators this build can see (0 without the CUDA backend).
// DEEPINFER_ACCELERATOR=auto without an accelerator logs one line saying why the CPU runs.
bool use_accelerator(const ModelLoadOptions& options);
int accelerator_count();
// Why accelerator_count() is 0 ("" when it is not): no CUDA backend in this build, or the CUDA
// runtime's own reason (no device, driver missing).
std::string accelerator_unavailable_reason();

}  // namespace deepinfer::model
