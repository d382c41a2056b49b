// Drives a CausalLM outside the engine, for tests and tools (`deepinfer logits`, golden checks):
// one sequence in chunks through one cache slot, or several sequences in randomly sized
// interleaved chunks sharing each step. The engine's scheduler does the real batching; these
// exist so that every backend is checked through the same loops.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "model/causal_lm.h"

namespace deepinfer::model {

// Blocks of `slot` in a cache cut into num_slots equal contiguous ranges: slot*per_slot, ...
std::vector<int32_t> slot_block_table(const kv::CacheGeometry& geometry, int32_t slot);

// Called after each chunk's forward with its first position and length (e.g. to collect a
// backend's extra outputs of that step).
using ChunkHook = std::function<void(int64_t first, int64_t length)>;

// Runs `ids` through `model` in chunks of the given sizes (positive, summing to ids.size()) in
// cache slot `slot` (reset first, blocks from slot_block_table), returning f32 logits of every
// position [T, vocab]. One chunk = a full forward; all ones = token-by-token decode. With `hidden`
// non-null it also receives every position's final streams [T, hc_mult, D] (f32, host).
Tensor run_sequence(CausalLM& model, const kv::CacheGeometry& geometry, const std::vector<int32_t>& ids,
                    const std::vector<int64_t>& chunks, int32_t slot = 0, Tensor* hidden = nullptr,
                    const ChunkHook& after_chunk = {});

// Greedy continuation of `prompt` by `n` tokens (argmax, lowest id on ties): the prompt in one
// chunk, then one token per step, in cache slot `slot`.
std::vector<int32_t> greedy_continuation(CausalLM& model, const kv::CacheGeometry& geometry,
                                         const std::vector<int32_t>& prompt, size_t n, int32_t slot = 0);

// One sequence of an interleaved run: its ids, its slot and block table (set by the caller, e.g.
// scattered to exercise the block table) and the logits of every position (filled by the run).
struct InterleavedSequence {
  std::vector<int32_t> ids;
  SeqInBatch seq;
  std::vector<float> logits;  // [ids.size(), vocab]
};

// Every step gives each unfinished sequence a random chunk of 0..max_chunk new tokens (mt19937
// seeded with `seed`; a step whose draws are all 0 is skipped) and runs them as one batch, until
// all are done. Slots are reset first.
void run_interleaved(CausalLM& model, std::vector<InterleavedSequence>& seqs, uint32_t seed, int64_t max_chunk);

}  // namespace deepinfer::model
