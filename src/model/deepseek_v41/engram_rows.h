// Host side of Engram for one step (MODEL-DEEPSEEK-V41.md §5: tables on the host, rows gathered for
// a step's tokens as soon as they are known): the row ids of every new token of every sequence from
// its EngramHistory (advanced in place; rebuild it with EngramHasher::history_after on rollback or a
// prefix hit), then each Engram layer's rows read from its table, either widened to f32 on the host
// (the CPU path: rows[i] is [T, columns * head_dim] for Engram layer i, the input of that layer's
// wkv) or copied in stored form (FP8 codes + E8M0 scales) for a backend that widens on the device.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek/prepared.h"
#include "model/deepseek_v41/engram.h"

namespace deepinfer::model::v41 {

struct EngramStepSeq {
  EngramHistory* history = nullptr;  // the sequence's history before its first new token
  const int32_t* tokens = nullptr;   // its new tokens
  const uint8_t* dead = nullptr;     // optional DEAD flags of those tokens
  int64_t n = 0;
};

// tables[i]: the prepared Engram of hasher layer i (same order as EngramHasher::layer_id).
// ids[i] is [T * columns] (token-major) for Engram layer i, every id checked against its table
// (InternalError naming it otherwise).
std::vector<std::vector<int64_t>> engram_step_ids(const EngramHasher& hasher, const std::vector<const ds::EngramRef*>& tables,
                                                  const std::vector<EngramStepSeq>& seqs);

// Rows `ids` of table g widened to f32 on the host: [ids.size(), g.dim] (ops/cpu engram_widen_row,
// over the host's threads).
std::vector<float> engram_widen_rows(const ds::EngramRef& g, const std::vector<int64_t>& ids);

// Bytes of the stored form of n rows of g: values [n, dim] in g.table_dtype, then (FP8 only) the
// E8M0 scales [n, dim / 32].
size_t engram_stored_values_bytes(const ds::EngramRef& g, int64_t n);
size_t engram_stored_scales_bytes(const ds::EngramRef& g, int64_t n);
// Rows `ids` of g copied in stored form into values / scales (sizes above; scales unused unless
// FP8), over the host's threads. The ids must be in range (engram_step_ids checked them).
void engram_gather_stored(const ds::EngramRef& g, const int64_t* ids, int64_t n, void* values, uint8_t* scales);

// engram_step_ids then engram_widen_rows per layer.
std::vector<std::vector<float>> engram_step_rows(const EngramHasher& hasher, const std::vector<const ds::EngramRef*>& tables,
                                                 const std::vector<EngramStepSeq>& seqs);

}  // namespace deepinfer::model::v41
