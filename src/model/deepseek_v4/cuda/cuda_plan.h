// Host-side planning of the GPU forward, free of CUDA calls (tested on machines without a GPU):
//  * the device cache geometry in the bytes the GPU stores (bf16 windows/entries/keys, f32
//    compressor partials), and the device memory plan for weights + activations + cache;
//  * StepMeta: every index list one forward needs, derived once per step from the ForwardBatch
//    and shared by all layers (row indices, not pointers, so they do not depend on the layer).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/deepseek_v4/config.h"
#include "model/forward_batch.h"

namespace deepinfer::model::v4::gpu {

enum class Numerics {
  kExact,       // fp32 everywhere: f32 weights (dequantised at upload), activations, caches, fp32 GEMMs
                // without TF32 (parity with transformers' fp32 logits; tests, 2x the weight memory)
  kBf16,        // bf16 weights, activations and caches, fp32 accumulation; no quantisation round trips
  kProduction,  // kBf16 + the reference's FP8 KV round trip and FP4 indexer rounding (ops/cuda/quant.h)
};
// Storage type of linears, activations between kernels and the kv cache in a numerics mode
// (compressor partials, residual streams, mHC, router logits are f32 in every mode).
inline DType storage_dtype(Numerics n) { return n == Numerics::kExact ? DType::kF32 : DType::kBF16; }
inline size_t storage_bytes(Numerics n) { return n == Numerics::kExact ? 4 : 2; }

// Device storage per layer (spec: kv::LayerCacheSpec); "kv" = storage_dtype (bf16, f32 in kExact):
//   window      kv   [slots, W, d]                 kv of position p at row slot*W + p mod W
//   comp        kv   [blocks*epb, d]               entry i at block_table[i/epb]*epb + i mod epb
//   index_keys  kv   [blocks*epb, index_dim]       same addressing (CSA)
//   comp_state  f32  [slots, state_rows, 2c]       (a | z) of position p at row slot*S + p mod S
//   index_state f32  [slots, 2m, 2*index_width]
// kv_bytes: bytes of one window/entry/key element (storage_bytes of the numerics mode).
size_t gpu_block_bytes(const std::vector<kv::LayerCacheSpec>& layers, int64_t block_tokens, size_t kv_bytes = 2);
size_t gpu_slot_bytes(const std::vector<kv::LayerCacheSpec>& layers, size_t kv_bytes = 2);
// Slots first, then as many blocks as fit in `budget_bytes`; OutOfMemory when the slots do not fit.
kv::CacheGeometry plan_gpu_cache(const std::vector<kv::LayerCacheSpec>& layers, size_t budget_bytes,
                                 int64_t max_slots, size_t kv_bytes = 2);
std::vector<kv::LayerCacheSpec> cache_specs_for(const DeepseekV4Config& cfg, int64_t num_mtp);

// How routed experts live on the device: kFP4 / kFP8Block (release bytes + e8m0 scales, read by
// the grouped GEMM and the decode GEMV) when the checkpoint has them, the numerics mode is not
// kExact (exact keeps the f32 dequantised path the parity tests rely on), the widths are
// multiples of 32 and expert_path() is kNative; otherwise dequantised (kBF16 here meaning "the
// storage dtype").
WeightFormat device_expert_format(const DeepseekV4Config& cfg, Numerics numerics);
// Test/diagnostic switch (process-wide, read when a model loads) for the bf16/production MoE:
enum class ExpertPath {
  kNative,       // default: release-format experts, device routing, grouped GEMM (no host sync)
  kDequantised,  // experts dequantised to bf16 at upload, same device routing + grouped GEMM
  kHostRouted,   // the first version: dequantised, routing read back, one cuBLASLt GEMM per expert
};
void set_expert_path(ExpertPath p);
ExpertPath expert_path();
// Dense FP8 linears (attention wq_a/wq_b/wkv/wo_a/wo_b, indexer wq_b, shared expert W1|W3 and W2:
// those the release checkpoint stores as e4m3 + 128x128 e8m0 scales) stay FP8 on the device in
// the bf16/production numerics (ops/cuda/gemm_fp8w.h: the weight-only GEMM for up to
// kDenseFp8PrefillM tokens, above that a dequantisation to a bf16 scratch + cuBLASLt); exact
// numerics keeps the f32 dequantised path the parity tests rely on. Test switch, process-wide,
// read when a model loads:
enum class DensePath {
  kNative,       // default: FP8 on the device
  kDequantised,  // dense FP8 linears dequantised to bf16 at upload (the first version)
};
void set_dense_path(DensePath p);
DensePath dense_path();
// Whether the mode keeps the config's dense FP8 linears FP8 (cfg.dense_format kFP8Block with
// 128-blocks, not kExact, kNative). A linear whose scales are not powers of two <= 2^7 or whose
// input width is not a multiple of 16 is still dequantised (cuda_weights warns).
bool device_dense_fp8(const DeepseekV4Config& cfg, Numerics numerics);
// Above this many tokens a dense FP8 linear is dequantised to the arena's bf16 scratch and run by
// cuBLASLt; at or below, gemm_fp8w. From the H200 timings alone the crossover is ~32-64 tokens
// (gemm_fp8w_test), but cuBLASLt sums in another order than gemm_fp8w, and the bf16 path checks
// (golden_test, moe_native_test: token by token vs one chunk within 3% and no top-1 flip on
// tiny_official's 300 tokens) need one order for every chunk size up to a fixture's length: so
// 512, which costs steps of 65..512 new tokens (gemm_fp8w re-reads the weight per 64 rows).
constexpr int64_t kDenseFp8PrefillM = 512;
// One dense FP8 linear of a layer as the forward runs it: `batch` matrices [n, k] (wo_a: groups).
struct DenseShape {
  int64_t n = 0, k = 0, batch = 1;
  int64_t scale_rows = 128;  // 16 for W1|W3 when I is not a multiple of 128 (scales repeated per 16 rows)
};
// The dense FP8 linears of one layer of `kind` (W1|W3 fused as one [2I, D]).
std::vector<DenseShape> dense_fp8_shapes(const DeepseekV4Config& cfg, AttnKind kind);

// Bytes of one routed-expert matrix [n, k] on the device in `f` (kFP4: n*k/2 + n*k/32 scale
// bytes; kFP8Block: n*k + n*ceil(k/128), the block scale repeated per row; else n*k*elem_bytes).
int64_t device_expert_matrix_bytes(WeightFormat f, int64_t n, int64_t k, int64_t elem_bytes);

// Bytes the uploaded weights take on the device (linears incl. dequantised FP8 at
// `linear_bytes` per element: bf16, f32 in kExact; routed experts in device_expert_format of
// the mode, linear_bytes 4 meaning kExact; f32 mHC/router bias/sinks/ape, bf16 norms stored as
// f32). Computed from the config alone.
size_t gpu_weight_bytes(const DeepseekV4Config& cfg, bool with_mtp, size_t linear_bytes = 2);
// Upper bound of the per-forward device workspace for `max_tokens` new tokens in a batch of
// up to `max_seqs` sequences with contexts up to `max_context` tokens.
// act_bytes: storage_bytes of the numerics mode.
size_t gpu_activation_bytes(const DeepseekV4Config& cfg, int64_t max_tokens, int64_t max_seqs, int64_t max_context,
                            size_t act_bytes = 2);

// One compressor kind (ratio m, overlapping or not) over the batch.
struct CompressMeta {
  int64_t ratio = 0;
  bool overlap = false;
  int64_t state_rows = 0;        // S: ring rows per slot
  int64_t entries_per_block = 0; // epb
  // Staging for pooling, per sequence that completes >= 1 block in this step.
  struct Launch {
    int64_t stage_row0 = 0;      // first stage row of this sequence
    int64_t n_rows = 0;          // rows staged (positions lo .. pos0+n-1)
    int64_t lo = 0;              // absolute position of its first staged row
    int64_t first_block = 0, n_blocks = 0;
    int64_t entry0 = 0;          // first row of the step's entry buffer
  };
  std::vector<Launch> launches;
  std::vector<int64_t> stage_src;    // [stage rows] >= 0: state ring row; < 0: -(t+1) = az row t
  std::vector<int64_t> entry_pos;    // [entries] m*i (rope position of the entry)
  std::vector<int64_t> entry_dst;    // [entries] pool row
  std::vector<int64_t> state_src;    // [kept] az rows stored into the ring
  std::vector<int64_t> state_dst;    // [kept] ring rows
  // Candidates: all finished entries of a token's sequence; token t sees cand_count[t] of them.
  std::vector<int32_t> cand_rows;
  std::vector<int64_t> cand_offset;  // [T]
  std::vector<int32_t> cand_count;   // [T]
  int64_t max_count = 0;             // max over tokens of cand_count (fixed shape: the capacity)
  // Fixed-shape decode only (build_decode_meta): staging rows of token t are
  // [t*rows_per_token, (t+1)*rows_per_token); stage_dst is that row or -1 (skip); block[t] is the
  // block token t completes or -1; entry_dst/state_dst are -1 for tokens that write nothing.
  int64_t rows_per_token = 0;
  std::vector<int64_t> stage_dst;    // [T*rows_per_token]
  std::vector<int64_t> block;        // [T]
};

struct StepMeta {
  int64_t T = 0, n_streams = 0;
  std::vector<int32_t> token_ids;    // [T]
  std::vector<int64_t> pos;          // [T]
  std::vector<int64_t> embed_src;    // [T*n] embedding row of (t, stream)
  // Sliding window (same W for every layer): staged rows, then per-token runs.
  std::vector<int64_t> win_src;      // [win rows] >= 0: ring row; < 0: -(t+1) = kv row t
  std::vector<int32_t> win_begin, win_count;  // [T]
  std::vector<int64_t> win_store_src, win_store_dst;  // kv rows -> ring rows
  int64_t max_window = 0;            // max win_count
  std::vector<CompressMeta> kinds;   // one per distinct (ratio, overlap) of the layers
  std::vector<int64_t> sel_offset;   // [T] t * index_topk (CSA selection lists)
  std::vector<int64_t> logits_rows;  // [R]
  // Fixed-shape decode (build_decode_meta): every list's length depends only on T (the padded
  // batch), so a captured graph replays with new contents. Pad tokens write no cache state.
  bool fixed = false;
  std::vector<int64_t> win_dst;      // [T*W] staging row of win_src[i] (t*W + j) or -1 (skip)
  std::vector<int32_t> cand_pool;    // candidate rows of all kinds (their cand_offset index into it)
  std::vector<int64_t> comb_rows;    // [T*K] identity (device MoE combine)

  const CompressMeta* kind(int64_t ratio, bool overlap) const;
};

// Builds the step's index lists. The batch must already be validated (slots, block tables).
StepMeta build_step_meta(const DeepseekV4Config& cfg, const kv::CacheGeometry& g, const ForwardBatch& b);

// Fixed-shape decode: padded batch sizes 1, 2, 4, ..., 64 (one CUDA graph each).
constexpr int64_t kDecodeBuckets[] = {1, 2, 4, 8, 16, 32, 64};
// Smallest bucket >= num_seqs, or 0 when larger than the last.
int64_t decode_bucket(int64_t num_seqs);
// Candidate capacity per token of each compressor kind (the kinds' order of build_step_meta),
// from the longest context the fixed path serves.
std::vector<int64_t> decode_cand_caps(const DeepseekV4Config& cfg, int64_t max_context);
// Whether the batch can take the fixed-shape path: every sequence one new token, at most 64
// sequences, candidate counts within the caps, logits rows within the batch.
bool decode_eligible(const DeepseekV4Config& cfg, const ForwardBatch& b, const std::vector<int64_t>& caps);
// The fixed-shape StepMeta of a decode batch padded to `padded` tokens (b.num_tokens() <= padded;
// an empty batch gives the all-pad lists, used to size buffers). logits_rows has `padded` rows:
// logits_indices first, then 0.
StepMeta build_decode_meta(const DeepseekV4Config& cfg, const kv::CacheGeometry& g, const ForwardBatch& b,
                           int64_t padded, const std::vector<int64_t>& caps);

// Throws InvalidArgument naming the sequence/field when the batch does not fit the cache.
void validate_batch(const DeepseekV4Config& cfg, const kv::CacheGeometry& g, bool allocated, const ForwardBatch& b);

}  // namespace deepinfer::model::v4::gpu
