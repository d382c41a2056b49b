// Random DeepSeek-V4.1-Flash-shaped checkpoints at full width for timing the engine at the real
// shapes (`deepinfer make-flash-stack --family v41`): hidden 5120, 64 heads x 512, q rank 1280, 384
// routed experts top-6 of width 2304, index 32 heads x 128, vocab 129280, in the release layout
// (FP8 e4m3 + E8M0 32x32 dense, packed FP4 + E8M0/32 experts, FP8 Engram rows), values drawn by
// the fast counter-based generator (v4/fast_fill.h) with V4's scales (MODEL-DEEPSEEK-V4.md §9).
//
// The stack is a chosen subset of the release's 40 layers, renumbered in order, each keeping its
// role (MODEL-DEEPSEEK-V41.md §2.1): its compress ratio, whether it is a KV source, an index source,
// the candidate source, an Engram layer. A layer that reads another's KV needs that source in the
// subset (else InvalidArgument names both). Not the release's bytes: random weights, the Engram
// tables cut to about `engram_rows` rows each through a smaller engram_vocab_size (the bucket primes
// start above it; a token reads the same number of rows whatever the table's length), the Engram multipliers drawn here (not the reference's frozen
// ones), the class map t mod engram_compressed_vocab_size; no DSpark stages, no vision tower.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::model::v41 {

struct V41StackOptions {
  std::vector<int64_t> release_layers;  // ascending release layer ids in [0, 40)
  int64_t engram_rows = int64_t(1) << 20;
  uint64_t seed = 0;
  int num_shards = 0;  // 0: one per layer, + one for the globals
  bool progress = false;
  bool small = false;  // reduced widths (hidden 256, 8 heads x 128, 16 experts of 128): CPU script tests
};

// The release layers a default stack of `n` layers samples: one of each role first
// (0 S, 1 S+Engram, 2 KV source ratio 2, 3 its reuse, 20 the ratio-1 KV source and candidate
// source, 24 a re-indexing layer inside the candidate mask, 21 a ratio-1 reuse), then the
// release's next layers in order. n in [1, 40].
std::vector<int64_t> v41_default_stack_layers(int64_t n);

// config.json text of the stack (release composite layout).
std::string v41_stack_config_json(const V41StackOptions& opts);

// Writes config.json, engram_sidecar.json and the shards into `dir` (created). Returns the bytes
// of the shards.
uint64_t write_v41_stack(const std::string& dir, const V41StackOptions& opts);

}  // namespace deepinfer::model::v41
