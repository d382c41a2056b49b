// The one message the model runner hands the model each step: every scheduled sequence's
// new tokens packed back to back (varlen), with where each sequence's cache lives.
// Built fresh per step by the runner from a SchedulerOutput; read-only to the model.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"

namespace deepinfer::model {

struct SeqInBatch {
  int32_t cache_slot = -1;            // per-sequence fixed state (window ring, compressor partials)
  std::vector<int32_t> block_table;   // paged compressed-entry / indexer-key blocks, in order
  int64_t num_computed_tokens = 0;    // tokens already in the cache before this chunk (= first position)
  int32_t num_new_tokens = 0;         // tokens of this sequence in this batch
  // Bounded replay (CausalLM::replay_keep() > 0, V4.1 compact prefill): the first position of the
  // kept tail. Positions before it run only the layers up to the candidate source (no logits or
  // hidden rows there); the later layers run from it on and their windows start at it. The same
  // value for every step of a sequence; 0 = every layer over every position.
  int64_t decoder_from = 0;
};

// A token whose id the previous step sampled on the device and the host does not know yet
// (asynchronous scheduling): token_ids[token_index] is a placeholder (0) and the model reads
// ForwardBatch::sampled_ids[sample_row] on the device before the step uses the token.
struct DeviceInput {
  int32_t token_index = 0;
  int32_t sample_row = 0;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;       // [T] all sequences' new tokens, concatenated
  std::vector<SeqInBatch> seqs;         // [S] in the same order as token_ids
  std::vector<int32_t> logits_indices;  // indices into [0,T) whose logits are returned, in order
  std::vector<int32_t> hidden_indices;  // indices into [0,T) whose final streams are returned (drafting)
  // Only for models with CausalLM::supports_device_inputs(): tokens taken from device memory.
  std::vector<DeviceInput> device_inputs;  // token_index ascending, each at most once
  const int32_t* sampled_ids = nullptr;    // device int32 [> every sample_row], read in stream order

  int64_t num_tokens() const { return int64_t(token_ids.size()); }
};

// Checks a batch against the cache it will run on (every backend calls this first): token ids
// inside the vocabulary, slots in range and unique, enough valid blocks for each sequence's end,
// token counts consistent, logits indices in range. Throws InvalidArgument naming the field.
void validate_forward_batch(const ForwardBatch& batch, const kv::CacheGeometry& geometry, bool cache_allocated,
                            int64_t vocab_size);

}  // namespace deepinfer::model
