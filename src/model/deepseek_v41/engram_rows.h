// Host side of Engram for one step (MODEL-DEEPSEEK-V41.md §5: tables on the host, rows gathered for
// a step's tokens as soon as they are known): the row ids of every new token of every sequence from
// its EngramHistory (advanced in place; rebuild it with EngramHasher::history_after on rollback or a
// prefix hit), then each Engram layer's rows read from its table in stored form and widened to f32:
// rows[i] is [T, columns * head_dim] for Engram layer i, the input of that layer's wkv.
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
std::vector<std::vector<float>> engram_step_rows(const EngramHasher& hasher, const std::vector<const ds::EngramRef*>& tables,
                                                 const std::vector<EngramStepSeq>& seqs);

}  // namespace deepinfer::model::v41
