// KV state handed from a prefill engine to a decode engine (prefill/decode disaggregation,
// issue #18; docs/ROUTER.md). What moves is exactly what prefix caching keeps
// (engine/prefix_cache.h): the full paged blocks of a prompt's longest cached prefix [0, N) —
// N the last block boundary whose slot checkpoint exists, at most the prompt's last boundary
// before its last token — and that checkpoint (the slot's fixed state at N: window rings,
// compressor and indexer partials, drafter rings). The decode engine imports them into its own
// cache as cached blocks plus a checkpoint, so the request, submitted there as usual, gets a
// prefix-cache hit on [0, N) and computes only the tail [N, end) — at most one block's worth of
// tokens plus the last one. The output is the colocated one's, since a prefix hit restores
// byte for byte the state the same tokens leave (the prefix cache's exactness argument).
//
// Both engines must run the same model with the same numerics: the bundle carries the block
// hash seed (model identity, numerics, prefill mode), the block size and the block byte size,
// and import refuses a bundle whose values differ from its own (InvalidArgument naming which).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/causal_lm.h"

namespace deepinfer::engine {

struct KvBundle {
  uint64_t hash_seed = 0;        // the exporting cache's block hash seed
  int64_t block_tokens = 0;
  size_t block_bytes = 0;        // CausalLM::paged_block_bytes()
  std::vector<int32_t> tokens;   // [N] the prefix's token ids (N a multiple of block_tokens)
  std::vector<uint8_t> blocks;   // [N / block_tokens, block_bytes] backend-private rows
  model::SlotSnapshot checkpoint;  // the slot at N (checkpoint.num_tokens == N)
  // Device hop (export_prefix(prompt, /*device=*/true)): the block payload, the same bytes as
  // `blocks` would hold, in device memory of the exporting model's device; `blocks` is then
  // empty. Such a bundle does not encode (it is not on the host); import reads it directly.
  model::DeviceMemory device_blocks;
  bool on_device() const { return device_blocks.data != nullptr; }
  int64_t num_tokens() const { return int64_t(tokens.size()); }
  bool empty() const { return tokens.empty(); }
};

// Wire form: a versioned header, then the fields (little-endian as stored on x86/ARM hosts).
std::vector<uint8_t> encode_kv_bundle(const KvBundle& b);
// InvalidArgument naming the field when `bytes` is not a whole, consistent bundle.
KvBundle decode_kv_bundle(std::span<const uint8_t> bytes);

}  // namespace deepinfer::engine
