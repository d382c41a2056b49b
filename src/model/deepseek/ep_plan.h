// Planning and packing of the device-side expert-parallel exchange (cuda/device_expert_exchange.h),
// host twins of its kernels (cuda/ep_exchange.cu), and the tables both read. Same rules as the
// host-staged ExpertParallel::dispatch, so both paths send every (token, k) pair to the same
// rank and slot, in the same order, and every rank receives the same rows in the same order:
//   - destination of pair i (expert e = ids[i]): the first replica of e on this rank when there
//     is one, else replica (i / K) % replicas of logical_to_physical[e] (spreads a hot expert);
//   - the send buffer holds each destination's rows contiguously in rank order, pairs ascending
//     within a destination (pos[i] = the row of pair i);
//   - a sent row (row_bytes, 16-byte aligned): [slot int32][routed weight f32][8 pad][D values
//     in the activation dtype, padded to 16 bytes]. bf16 rows travel as bf16: the host-staged
//     path's bf16 -> f32 -> bf16 round trip is exact, so the expert inputs are the same bits.
// The returning outputs are f32 rows [D] in the same positions, so the combine gathers pair i's
// output at row pos[i] of what came back (no unpack on the way back).
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "parallel/eplb.h"

namespace deepinfer::model::ds {

// One rank's view of one layer's placement, flattened for a kernel.
struct EpRouteTable {
  int32_t rank = 0, ranks = 1, slots = 0, experts = 0;
  std::vector<int32_t> local_phys;    // [experts] first replica on this rank (physical id), or -1
  std::vector<int32_t> rep_off;       // [experts + 1] offsets into reps
  std::vector<int32_t> reps;          // every expert's replicas (physical ids, ascending)
  std::vector<int32_t> slot_logical;  // [slots] logical expert of this rank's slot s
};
// InvalidArgument for a rank outside the placement or a placement that does not validate.
EpRouteTable make_route_table(const parallel::ExpertPlacement& L, int32_t rank);

// Bytes of one sent row: 16 header bytes + D values of `act` (bf16 or f32) rounded up to 16.
int64_t ep_row_bytes(int64_t D, DType act);

struct EpPlan {
  std::vector<int32_t> dest, slot;  // [P] destination rank and its slot; dest -1 for a bad id
  std::vector<int64_t> pos;         // [P] row in the send buffer, -1 for a bad id
  std::vector<int64_t> counts;      // [ranks + 1] rows per destination; counts[ranks]: bad ids
};
// ids [T*K] (host). A bad id (outside [0, experts)) is counted, not thrown: the caller names it.
EpPlan ep_plan_host(const EpRouteTable& t, const int32_t* ids, int64_t T, int64_t K);

// send [sum(counts) * row_bytes]: pair i's row at pos[i] (h [T, D] in `act`, weights [T*K]).
void ep_pack_host(const EpPlan& plan, const void* h, DType act, int64_t D, int64_t K, const float* weights,
                  uint8_t* send);
// Received rows [m] (row_bytes each) to x [m, D] (act), logical [m] and weight [m]. A slot outside
// the table gives logical -1 and is counted in the return value.
int64_t ep_unpack_host(const EpRouteTable& t, const uint8_t* recv, int64_t m, int64_t D, DType act, void* x,
                       int32_t* logical, float* weight);

}  // namespace deepinfer::model::ds
