// Random DeepSeek-V4 checkpoints for tests and the bundled default model.
// Values follow MODEL-DEEPSEEK-V4.md §9 (every parameter non-trivial: norms 1+N(0,.1), hc scale
// 1+N(0,.3), hc base N(0,.5), hc fn N(0,.05), sinks N(0,1), ape N(0,.5), experts N(0,.06),
// embed N(0,1), other linears N(0,1/sqrt(fan_in)), router bias N(0,.05), tid2eid k distinct
// experts per row). Each tensor's values depend only on (seed, release name), so the two layouts
// written with one seed hold the same weights up to the official layout's FP8/FP4 rounding.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  // kOfficial: release names and encodings per cfg.dense_format / cfg.expert_format (bf16 norms,
  // f32 hc/sink/ape/bias, FP8 e4m3 + e8m0 128x128 block scales, FP4 e2m1 packed in I8 + e8m0
  // per-32 scales) and mtp.K blocks. kTransformers: HF 5.17 state_dict names, fused experts, `dtype`.
  CheckpointLayout layout = CheckpointLayout::kOfficial;
  DType dtype = DType::kBF16;  // float dtype of the transformers layout (bf16 or f32)
  int num_shards = 1;          // > 1 writes model-0000i-of-0000n.safetensors + index
  // Fast mode, for full-width stacks (official layout only): counter-based hashes (mean/sd per
  // Init kind as above, but NOT the same values as the default mode: triangular values bounded at
  // +-2.45 sd; FP4 codes drawn from a table of normal quantiles with one power-of-two scale per
  // tensor), filled in parallel and streamed to disk tensor by tensor, so memory stays at two
  // ~256 MB buffers whatever the checkpoint size. Bytes depend only on (seed, tensor name), never
  // on the thread count.
  bool fast = false;
  bool progress = false;       // fast mode: a progress line on stderr
};

// Writes config.json (cfg.to_json_string() in opts.layout) and the shard(s) into `dir` (created).
void write_random_checkpoint(const std::string& dir, DeepseekV4Config cfg, const RandomCheckpointOptions& opts);

// The bundled default model: real vocab (129280, the DeepSeek tokenizer), tiny everything else;
// 6 layers S S C H C H (HCA ratio 16 so short prompts reach it), 3 hash-MoE layers, 1 MTP block.
DeepseekV4Config default_model_config(CheckpointLayout layout);

// V4-Flash at full width (MODEL-DEEPSEEK-V4.md §1: hidden 4096, 64 heads x 512, 256 experts top-6
// of width 2048, vocab 129280, ...) cut to its first `num_layers` (1..43) layers of the Flash
// schedule (S S C H C H ...; hash MoE on layers 0-2), official layout (FP8 dense, FP4 experts),
// no MTP block. Throws InvalidArgument outside 1..43.
DeepseekV4Config flash_stack_config(int64_t num_layers);

}  // namespace deepinfer::model::v4
