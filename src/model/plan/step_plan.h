// The host-side step planner, shared by every backend: from a ForwardBatch, the cache geometry and
// the model's layer plans it derives, once per step, every index list the forward's kernels consume
// (row indices, not pointers, so they do not depend on the layer or the backend): window staging
// and stores through each slot's ring, compressor staging and partial-ring stores, the entries a
// step completes and where they go in the paged pools, each token's candidate entries, logits
// and hidden rows. Free of device calls (tested on machines without a GPU).
// Two shapes of the same lists:
//  - general (build_step_plan): varlen sequences, lists sized by the batch;
//  - fixed (build_fixed_step_plan): a decode batch (one token per sequence) or a verify batch (a few
//    tokens per sequence: the last committed token and its drafts) padded to a token bucket, every
//    list per token and its length fixed by the padded size, so one captured CUDA graph per bucket
//    replays any such batch with new contents; pad tokens write no cache state (destination -1).
#pragma once
#include <cstdint>
#include <iterator>
#include <vector>

#include "kv/kv_cache.h"
#include "model/forward_batch.h"
#include "model/plan/layer_plan.h"

namespace deepinfer::model {

// What the planner needs of a model beyond its layer plans.
struct StepPlanDims {
  int64_t n_streams = 1;   // residual streams per token (mHC)
  int64_t index_topk = 0;  // selected entries per token of a scoring layer
  int64_t topk_experts = 1;  // routed experts per token (fixed-shape MoE combine rows)
};

// One compressor kind (ratio m, overlapping or not, ring rows S) over the batch. Every layer
// whose compressor (or V4 key compressor) has this kind shares these lists.
struct CompressPlan {
  int64_t ratio = 0;
  bool overlap = false;
  int64_t state_rows = 0;        // S: partial ring rows per slot (incl. rollback slack)
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
  std::vector<int64_t> stage_src;    // [stage rows] >= 0: state ring row; < 0: -(t+1) = projection row t
  std::vector<int64_t> entry_pos;    // [entries] m*i (rope position of the entry)
  std::vector<int64_t> entry_dst;    // [entries] pool row
  std::vector<int64_t> state_src;    // [kept] projection rows stored into the ring
  std::vector<int64_t> state_dst;    // [kept] ring rows
  // Candidates: all finished entries of a token's sequence; token t sees cand_count[t] of them.
  std::vector<int32_t> cand_rows;
  std::vector<int64_t> cand_offset;  // [T]
  std::vector<int32_t> cand_count;   // [T]
  int64_t max_count = 0;             // max over tokens of cand_count (fixed shape: the capacity)
  // Fixed shape only: staging rows of token t are [t*rows_per_token, (t+1)*rows_per_token);
  // stage_dst is that row or -1 (skip); block[t] is the block token t completes or -1;
  // entry_dst / state_dst are -1 for tokens that write nothing.
  int64_t rows_per_token = 0;
  std::vector<int64_t> stage_dst;    // [T*rows_per_token]
  std::vector<int64_t> block;        // [T]
};

struct StepPlan {
  int64_t T = 0, n_streams = 0;
  std::vector<int32_t> token_ids;    // [T]
  std::vector<int64_t> pos;          // [T]
  std::vector<int64_t> embed_src;    // [T*n] embedding row of (t, stream)
  // Sliding window (same W and ring for every layer): staged rows, then per-token runs.
  int64_t window = 0, ring_rows = 0;
  std::vector<int64_t> win_src;      // [win rows] >= 0: ring row; < 0: -(t+1) = kv row t
  std::vector<int32_t> win_begin, win_count;  // [T]
  std::vector<int64_t> win_store_src, win_store_dst;  // kv rows -> ring rows
  int64_t max_window = 0;            // max win_count
  // Bounded replay: the runs of the replay_tail layers (starting no earlier than each sequence's
  // decoder_from, inside the same staged rows); empty when they equal win_begin / win_count.
  // General plans only (a fixed-shape batch needs none: its windows never reach before a tail).
  std::vector<int32_t> tail_win_begin, tail_win_count;  // [T]
  std::vector<CompressPlan> kinds;   // one per distinct (ratio, overlap, state rows) of the layers
  std::vector<int64_t> sel_offset;   // [T] t * index_topk (selection lists)
  std::vector<int64_t> logits_rows;  // [R]
  std::vector<int64_t> hidden_rows;  // [Rh] rows whose final streams are returned
  // Fixed shape only.
  bool fixed = false;
  std::vector<int64_t> win_dst;      // [T*W] staging row of win_src[i] (t*W + j) or -1 (skip)
  std::vector<int32_t> cand_pool;    // candidate rows of all kinds (their cand_offset index into it)
  std::vector<int64_t> comb_rows;    // [T*K] identity (device MoE combine)

  const CompressPlan* kind(int64_t ratio, bool overlap) const;
  // Index into `kinds` of a layer's compressor kind (its entries), -1 when it owns none.
  int64_t kind_index(int64_t ratio, bool overlap) const;
};

// The distinct compressor kinds of `specs`, in first-appearance order (entries then key
// compressors, layer by layer): the order of StepPlan::kinds and of fixed_candidate_caps.
struct KindKey {
  int64_t ratio = 0;
  bool overlap = false;
  int64_t state_rows = 0;
};
std::vector<KindKey> compressor_kinds(const std::vector<kv::LayerCacheSpec>& specs);

// Builds the step's index lists. The batch must already be validated (validate_forward_batch).
StepPlan build_step_plan(const std::vector<kv::LayerCacheSpec>& specs, const StepPlanDims& dims,
                         const kv::CacheGeometry& g, const ForwardBatch& b);

// Fixed-shape decode: padded batch sizes 1, 2, 4, ..., 64, then 96 ... 256 (one CUDA graph each).
// The buckets above 64 are the token buckets' (below): a decode batch of up to 256 sequences gets a
// graph where the backend's FixedLimits allow that many tokens (the CUDA backend's grouped MoE path
// does; without the buckets, steps of 65-256 sequences ran eagerly with the prefill-sized expert
// GEMM, 2.9x slower per MoE layer at 128 tokens on the H200).
constexpr int64_t kDecodeBuckets[] = {1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256};
// Smallest bucket >= num_seqs, or 0 when larger than the last.
int64_t decode_bucket(int64_t num_seqs);
// Fixed-shape steps of several tokens per sequence (verify steps) pad the token count to these:
// the decode buckets, then 384 (e.g. 64 sequences x 6 tokens). A decode batch gets the same
// bucket from either function.
constexpr int64_t kFixedTokenBuckets[] = {1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384};
int64_t fixed_token_bucket(int64_t tokens);

// What a backend's fixed-shape path takes (fixed_eligible): at most `max_tokens` tokens in all and
// `max_tokens_per_seq` per sequence (1: decode only).
// The default (64 tokens) is what every backend's decode path serves; a backend raises it where
// its kernels take more (CudaBackend::fixed_limits).
struct FixedLimits {
  int64_t max_tokens = 64;
  int64_t max_tokens_per_seq = 1;
};
// Candidate capacity per token of each compressor kind (compressor_kinds order), from the
// longest context the fixed path serves.
std::vector<int64_t> fixed_candidate_caps(const std::vector<kv::LayerCacheSpec>& specs, int64_t max_context);
// Whether the batch can take the fixed-shape path: every sequence 1..limits.max_tokens_per_seq new
// tokens (no more than any per-slot ring holds), at most limits.max_tokens tokens and the last
// decode bucket of sequences, candidate counts within the caps, logits and hidden rows within the
// batch.
bool fixed_eligible(const std::vector<kv::LayerCacheSpec>& specs, const ForwardBatch& b,
                    const std::vector<int64_t>& caps, const FixedLimits& limits = {});
// The fixed-shape plan of a decode or verify batch padded to `padded` tokens (b.num_tokens() <=
// padded; an empty batch gives the all-pad lists, used to size buffers). Token t of a sequence
// reads its window and compressor rows from the slot's rings for positions before the step and
// from this step's rows for the sequence's earlier tokens. logits_rows / hidden_rows have
// `padded` rows: the batch's indices first, then 0. A one-token-per-sequence batch gives exactly
// the decode lists.
StepPlan build_fixed_step_plan(const std::vector<kv::LayerCacheSpec>& specs, const StepPlanDims& dims,
                               const kv::CacheGeometry& g, const ForwardBatch& b, int64_t padded,
                               const std::vector<int64_t>& caps);

}  // namespace deepinfer::model
