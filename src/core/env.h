// Environment knobs, read once at startup into a plain struct that the engine owns and
// passes down. Nothing below the engine reads the environment.
#pragma once
#include <string>

namespace deepinfer {

enum class Accelerator { kAuto, kCPU, kNvidia, kAscend };

struct EnvConfig {
  Accelerator accelerator = Accelerator::kAuto;  // DEEPINFER_ACCELERATOR: nvidia | cpu | ascend (reserved)
  std::string hf_model_dir;                      // DEEPINFER_HF_MODEL_DIR
  int use_nextn_decode = 5;                      // DEEPINFER_USE_NEXTN_DECODE: max draft length
  bool enable_mtp_varlen = false;                // DEEPINFER_ENABLE_MTP_VARLEN
  bool batch_invariant = false;                  // DEEPINFER_BATCH_INVARIANT
  bool async_scheduling = true;                  // DEEPINFER_ASYNC_SCHEDULING (default on)
  std::string yoco_truncation_mode;              // DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE (compact)
  int yoco_keep_tokens = 140;                    // DEEPINFER_YOCO_PREFILL_KEEP_TOKENS
  bool cuda_graphs = true;                       // DEEPINFER_CUDA_GRAPHS: GPU decode replays CUDA graphs
  bool device_sampling = true;                   // DEEPINFER_DEVICE_SAMPLING: sample where the logits are

  // Reads the process environment; throws InvalidArgument naming the variable on a bad value.
  static EnvConfig from_environment();
};

const char* accelerator_name(Accelerator a);

}  // namespace deepinfer
