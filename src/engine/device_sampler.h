// DeviceSampler: the engine's sampler run on the model's GPU, over logits the model left in
// device memory (CausalLM::forward_device). Same semantics as sample_rows() (sampler.h): the
// kernel is ops::cuda::sample, the host sampler's twin step by step (penalties, temperature,
// min-p/top-k/top-p, grammar bitmask, Philox draw keyed by (seed, sample index, position)),
// so tokens are identical and logprobs agree to a float ulp (src/ops/cuda/sampling.h says where
// fp64 summation order could move a draw: within ~1e-13 of a CDF boundary).
//
// Per step: the rows' parameters, bias/banned/penalty lists and grammar bitmasks are packed
// into one pinned buffer and uploaded with one copy; the kernel runs on the model's stream
// right after the forward; one copy brings back the packed ids, logprobs, ranks and top-N
// into pinned memory; one event wait. Buffers grow and are reused across steps.
// Asynchronous scheduling splits sample() into enqueue() (no host wait) and wait(); the ids
// also stay in a device buffer (device_tokens()) that the next step's forward reads its input
// tokens from, ordered on the same stream, before the host has seen them.
// Built only with the CUDA backend: create() returns null otherwise.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "model/causal_lm.h"

namespace deepinfer::engine {

// A row's speculative-decoding role on the device (ops/cuda/sampling.h kSpecDraft / kSpecVerify):
// kDraft draws a sampled draft from the row's processed distribution q and writes q into draft
// pool row `q_row`; kVerify rejection-samples `draft` (drawn from pool row `q_row` of `pool`, a
// drafting DeviceSampler) against the row's p, the decision coming back in SampleResult.
struct SpecRow {
  enum Mode : int32_t { kPlain = 0, kDraft = 1, kVerify = 2 };
  Mode mode = kPlain;
  int32_t draft = -1;
  int64_t q_row = -1;
  const class DeviceSampler* pool = nullptr;  // kVerify: whose pool holds q (kDraft: this one)
};

class DeviceSampler {
 public:
  struct Stats {
    int64_t steps = 0, rows = 0;
    int64_t h2d_bytes = 0, d2h_bytes = 0;  // totals over all steps
    int64_t last_d2h_bytes = 0;            // of the last step
  };

  // Null when this build has no CUDA backend.
  static std::unique_ptr<DeviceSampler> create(int64_t vocab);
  ~DeviceSampler();

  // Whether the device can draw `row` as the host would (top-N logprobs within the kernel's
  // limit, a grammar mask covering the vocabulary). Rows it cannot take go to the host sampler.
  bool supports(const SamplingRow& row) const;
  // The part of supports() a request's parameters decide (the grammar masks the engine builds
  // always cover the vocabulary).
  bool supports(const SamplingParams& params) const;

  // Draws rows[i] from row i of `logits` (rows.size() == logits.rows; SamplingRow::logits is
  // ignored). Results in row order, logprobs filled for rows whose params ask for them.
  std::vector<SampleResult> sample(const model::DeviceLogits& logits, std::span<const SamplingRow> rows);

  // sample() in two halves. enqueue() copies what it needs from `rows` (they may go away),
  // uploads, launches and starts the copy back on logits.stream, without waiting; wait() waits
  // for that copy and returns the results. One enqueue() at a time before its wait().
  // `spec`: empty, or one entry per row (SpecRow); rows with a mode must be sampled rows.
  void enqueue(const model::DeviceLogits& logits, std::span<const SamplingRow> rows,
               std::span<const SpecRow> spec = {});
  std::vector<SampleResult> wait();

  // Draft distribution pool: [rows, vocab] f32 device rows that kDraft rows write q into and
  // kVerify rows (of any sampler on the same device and stream) read. reserve_draft_pool() may
  // reallocate (earlier rows are lost): call it only when no queued work reads the pool.
  void reserve_draft_pool(int64_t rows, int device);
  int64_t draft_pool_rows() const;
  float* draft_row(int64_t row) const;
  // Copies pool row `row` ([vocab] f32) to the host, after the work queued on `stream` (waits).
  void copy_draft_row(int64_t row, float* dst, void* stream) const;
  // Device int32 [rows of the last enqueue()]: its ids, in row order. Valid for work ordered on
  // the same stream after that enqueue and before the next one (which may move it).
  const int32_t* device_tokens() const;

  const Stats& stats() const { return stats_; }

 private:
  struct Impl;
  explicit DeviceSampler(int64_t vocab);
  [[maybe_unused]] int64_t vocab_;  // unread in a build without CUDA
  std::unique_ptr<Impl> impl_;
  Stats stats_;
};

}  // namespace deepinfer::engine
