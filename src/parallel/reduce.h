// Element-wise reductions of gathered per-rank blocks, in rank order (what makes the groups'
// float reductions independent of the transport's own algorithm).
#pragma once
#include <cstdint>

#include "parallel/process_group.h"

namespace deepinfer::parallel {

int64_t reduce_elem_bytes(ReduceType type);
// out[i] = op over r = 0..ranks-1 of blocks[r][i]; blocks [ranks, count] back to back.
void reduce_in_rank_order(const void* blocks, int ranks, int64_t count, ReduceType type, ReduceOp op, void* out);

}  // namespace deepinfer::parallel
