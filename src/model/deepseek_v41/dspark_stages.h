// Where the DSpark drafter's stage forward runs when it is not the host (dspark.h): a device
// backend implements DSparkStages (the CUDA one: model/deepseek/cuda/v41_dspark_cuda.h) and the
// model hands DSparkDrafter a maker for it (DSparkOptions::stages). The drafter keeps the slot
// bookkeeping (which positions each ring holds, rollback, snapshot framing) on the host; the
// rings themselves, the stage weights and all stage math live behind this interface, so a draft
// round moves only ids, log-probabilities and confidence logits back (plus logits when asked).
//
// Ring layout seen through the interface: stage k of slot s holds position p in row p mod
// capacity, head_dim f32 per row, the same rows the host drafter keeps (snapshots are the same
// bytes either way).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer::model::v41 {

struct DSparkWeights;

// Ring rows to write: positions first_position + [from, num) of one slot from tap rows
// first_row + [from, num) (rows before `from` would be overwritten in the same feed).
struct DSparkFeed {
  int32_t slot = 0;
  int64_t first_position = 0, first_row = 0, from = 0, num = 0;
};

// One drafting sequence of a round: ring positions [lo, last] are read, the block sits at
// positions last + 1 .. last + B with `anchor` first.
struct DSparkBlockSeq {
  int32_t slot = 0;
  int64_t lo = 0, last = 0;
  int32_t anchor = 0;
  int32_t num_drafts = 0;
};

// Row t = j * B + i is draft i of drafting sequence j (rows past num_drafts are unspecified).
struct DSparkBlockOut {
  // greedy: the argmax drafts of base + Markov bias, their raw log-softmax values and c_i.
  std::vector<int32_t> tokens;
  std::vector<float> logprobs, conf_logits;  // [S*B]
  std::vector<float> logits;                 // [S*B, V] base + bias (greedy and asked for), else empty
  // not greedy: what the host tail needs to pick with the engine's picker.
  std::vector<float> base, xhat;             // [S*B, V] head logits (no bias), [S*B, D] collapsed stream
};

class DSparkStages {
 public:
  virtual ~DSparkStages() = default;
  virtual std::string describe() const = 0;
  // Writes ring rows kv_k(p) of every stage for each feed, from `taps` (HiddenRows: host or
  // device rows of taps * hidden f32).
  virtual void feed(const HiddenRows& taps, const std::vector<DSparkFeed>& feeds) = 0;
  // The block of every sequence through the stages and the head; greedy: the Markov tail too.
  virtual void block(const std::vector<DSparkBlockSeq>& seqs, bool greedy, bool want_logits, DSparkBlockOut& out) = 0;
  // Ring rows of positions [lo, hi) of every stage, stage-major: dst [stages, hi - lo, head_dim].
  virtual void read_ring(int32_t slot, int64_t lo, int64_t hi, float* dst) = 0;
  virtual void write_ring(int32_t slot, int64_t lo, int64_t hi, const float* src) = 0;
};

// Makes the stages from the drafter's f32 weights (the maker may upload and keep its own copy).
using DSparkStagesMaker = std::function<std::unique_ptr<DSparkStages>(
    const DeepseekV41Config& cfg, const DSparkWeights& w, int64_t ring_capacity, bool qat)>;

}  // namespace deepinfer::model::v41
