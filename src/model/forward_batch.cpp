// Batch validation shared by every backend's forward.
#include <unordered_set>

#include "core/check.h"
#include "model/forward_batch.h"

namespace deepinfer::model {

void validate_forward_batch(const ForwardBatch& b, const kv::CacheGeometry& g, bool cache_allocated,
                            int64_t vocab_size) {
  if (!cache_allocated) DI_THROW(InvalidArgument, "forward: cache not allocated (call allocate_cache first)");
  int64_t total = 0;
  std::unordered_set<int32_t> slots;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const SeqInBatch& s = b.seqs[i];
    if (s.num_new_tokens < 0 || s.num_computed_tokens < 0)
      DI_THROW(InvalidArgument, "forward: seqs[", i, "] has negative token counts");
    if (s.decoder_from < 0) DI_THROW(InvalidArgument, "forward: seqs[", i, "].decoder_from ", s.decoder_from, " < 0");
    if (s.cache_slot < 0 || s.cache_slot >= g.num_slots)
      DI_THROW(InvalidArgument, "forward: seqs[", i, "].cache_slot ", s.cache_slot, " outside [0,", g.num_slots, ")");
    if (!slots.insert(s.cache_slot).second)
      DI_THROW(InvalidArgument, "forward: seqs[", i, "] reuses cache_slot ", s.cache_slot, " within one batch");
    const int64_t end = s.num_computed_tokens + s.num_new_tokens;
    const int64_t need = (end + g.block_tokens - 1) / g.block_tokens;
    if (int64_t(s.block_table.size()) < need)
      DI_THROW(InvalidArgument, "forward: seqs[", i, "] needs ", need, " blocks for ", end, " tokens, block_table has ",
               s.block_table.size());
    for (int64_t j = 0; j < need; ++j)
      if (s.block_table[j] < 0 || s.block_table[j] >= g.num_blocks)
        DI_THROW(InvalidArgument, "forward: seqs[", i, "].block_table[", j, "] = ", s.block_table[j], " outside [0,",
                 g.num_blocks, ")");
    total += s.num_new_tokens;
  }
  if (total != b.num_tokens())
    DI_THROW(InvalidArgument, "forward: seqs cover ", total, " tokens but token_ids has ", b.num_tokens());
  for (size_t i = 0; i < b.token_ids.size(); ++i)
    if (b.token_ids[i] < 0 || b.token_ids[i] >= vocab_size)
      DI_THROW(InvalidArgument, "forward: token_ids[", i, "] = ", b.token_ids[i], " outside vocab [0,", vocab_size,
               ")");
  int64_t last = -1;
  for (size_t i = 0; i < b.device_inputs.size(); ++i) {
    const DeviceInput& d = b.device_inputs[i];
    if (d.token_index <= last || d.token_index >= b.num_tokens() || d.sample_row < 0)
      DI_THROW(InvalidArgument, "forward: device_inputs[", i, "] = (token ", d.token_index, ", row ", d.sample_row,
               ") is not an ascending token index in [0,", b.num_tokens(), ") with a row >= 0");
    last = d.token_index;
  }
  if (!b.device_inputs.empty() && !b.sampled_ids)
    DI_THROW(InvalidArgument, "forward: ", b.device_inputs.size(), " device_inputs without sampled_ids");
  for (size_t i = 0; i < b.logits_indices.size(); ++i)
    if (b.logits_indices[i] < 0 || b.logits_indices[i] >= b.num_tokens())
      DI_THROW(InvalidArgument, "forward: logits_indices[", i, "] = ", b.logits_indices[i], " outside [0,",
               b.num_tokens(), ")");
}

}  // namespace deepinfer::model
