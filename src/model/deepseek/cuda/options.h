// Options of the CUDA backend: numerics, decode path, storage policies for weights, memory plan
// limits and the device. Plain data handed down at load (no process-wide switches); the engine's
// values come from ModelLoadOptions (cuda_model.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/dtype.h"
#include "core/env.h"
#include "parallel/eplb.h"

namespace deepinfer::model::ds::cuda {

enum class Numerics {
  kExact,       // fp32 everywhere: f32 weights (dequantised at upload), activations, caches, fp32 GEMMs
                // without TF32 (parity with transformers' fp32 logits; tests, 2x the weight memory)
  kBf16,        // bf16 weights, activations and caches, fp32 accumulation; no quantisation round trips
  kProduction,  // kBf16 + the model's cache formats (V4: FP8 KV round trip, FP4 indexer; ops/cuda/quant.h)
};
// Storage type of linears, activations between kernels and the kv cache in a numerics mode
// (compressor partials, residual streams, mHC, router logits are f32 in every mode).
inline DType storage_dtype(Numerics n) { return n == Numerics::kExact ? DType::kF32 : DType::kBF16; }
inline size_t storage_bytes(Numerics n) { return n == Numerics::kExact ? 4 : 2; }

// How decode steps (every sequence one new token, at most 64 sequences) run.
enum class DecodePath {
  kGeneral,  // the variable-shape path
  kFixed,    // fixed shapes per padded batch size (1, 2, 4, ..., 64), device-side MoE, no host sync
  kGraph,    // kFixed captured once per padded size into a CUDA graph and replayed
};

// How routed experts live on the device in the bf16/production numerics.
enum class ExpertPath {
  kNative,       // default: release-format experts (FP4/FP8), device routing, grouped GEMM (no host sync)
  kDequantised,  // experts dequantised to bf16 at upload, same device routing + grouped GEMM
  kHostRouted,   // dequantised, routing read back, one cuBLASLt GEMM per expert (the first version)
};
// How dense FP8 linears live on the device in the bf16/production numerics.
enum class DensePath {
  kNative,       // default: FP8 as stored (gemm_fp8w up to kDenseFp8PrefillM tokens, above a bf16 scratch)
  kDequantised,  // dequantised to bf16 at upload (the first version)
};

// Above this many tokens a dense FP8 linear is dequantised to the arena's bf16 scratch and run by
// cuBLASLt; at or below, gemm_fp8w. From the H200 timings alone the crossover is ~32-64 tokens, but
// cuBLASLt sums in another order than gemm_fp8w, and the bf16 path checks (token by token vs one
// chunk within 3% and no top-1 flip on tiny_official's 300 tokens) need one order for every chunk
// size up to a fixture's length: so 512, which costs steps of 65..512 new tokens.
constexpr int64_t kDenseFp8PrefillM = 512;

// Keys per split-KV split in batch-invariant mode: a token's keys are always cut at multiples of
// this (one split when it has no more), so its attention never depends on the batch.
constexpr int kInvariantSplitKeys = 128;
// Batch-invariant attention runs in launches of at most this many (token x split) partials, which
// bounds its workspace like the adaptive split's (a token's result does not depend on the launch).
constexpr int64_t kInvariantSplitPartials = 2048;

struct CudaModelOptions {
  Numerics numerics = Numerics::kExact;  // tests; the engine loads kProduction
  bool progress = true;               // weight upload progress bar on stderr
  int64_t max_batch_tokens = 8192;    // memory plan: largest step (new tokens)
  int64_t max_seqs = 64;              // memory plan: sequences per step
  int64_t max_context = 65536;        // memory plan: longest context (indexer scores)
  int64_t max_rollback = 0;           // ring slack for rollback (ModelLimits::max_rollback)
  double utilization = 0.92;          // share of the card the engine may take
  int device = 0;
  std::optional<parallel::ExpertShard> expert_shard;  // ModelLoadOptions::expert_shard
  DecodePath decode = DecodePath::kGeneral;  // prefill and larger batches always take the general path
  ExpertPath experts = ExpertPath::kNative;
  DensePath dense = DensePath::kNative;
  bool load_mtp = true;               // upload the MTP block(s) when the checkpoint has them
  // Backend::linear_many runs FP8 products that share their input (wq_a + wkv) as one
  // gemm_fp8w_multi launch where their K splits agree: the same bits as one launch each, ~4.6 us
  // less per layer and step at M = 1 on the H200. false: one launch each (tests compare the two).
  bool multi_linear = true;
  // Oracle mode for golden tests: with numerics = kProduction, keep kExact's f32 storage (weights,
  // activations, caches, fp32 GEMMs) and add only the production round trips, so a reference
  // applying the same FP8/FP4 roundings in fp32 can be matched tightly.
  bool f32_storage = false;
  // DEEPINFER_BATCH_INVARIANT (bf16 / production numerics): every reduction order fixed per
  // token, so a token's logits do not depend on its batch, chunking or decode path (general,
  // fixed, graph): all dense products through gemm_fp8w (its K split depends on the weight's
  // shape only; bf16 weights through its w_bf16 path), split-KV attention in splits of
  // kInvariantSplitKeys keys whatever the batch, and the fixed decode path's experts through the
  // grouped GEMM as prefill's (docs/DETERMINISM.md). Exact numerics (cuBLASLt fp32) is refused.
  bool batch_invariant = false;
  EpExchange ep_exchange = EpExchange::kAuto;  // DEEPINFER_EP_EXCHANGE (set_expert_parallel)
  // The numerics whose storage dtype the buffers use.
  Numerics storage_numerics() const { return f32_storage ? Numerics::kExact : numerics; }
};

}  // namespace deepinfer::model::ds::cuda
