// Kernels of the device-side expert-parallel exchange (device_expert_exchange.h); their host
// twins and the row format are model/deepseek/ep_plan.h. All take device pointers and launch on
// the given stream; zero pairs / rows is a no-op apart from zeroed counts.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::model::ds::cuda {

// EpRouteTable on the device.
struct EpTableView {
  const int32_t* local_phys = nullptr;    // [experts]
  const int32_t* rep_off = nullptr;       // [experts + 1]
  const int32_t* reps = nullptr;
  const int32_t* slot_logical = nullptr;  // [slots]
  int32_t rank = 0, ranks = 1, slots = 0, experts = 0;
};

inline constexpr int kEpChunk = 256;  // pairs per planning block
// int64 scratch elements ep_plan needs for P pairs over `ranks` ranks.
int64_t ep_plan_scratch(int64_t pairs, int32_t ranks);

struct EpPlanParams {
  EpTableView table;
  const int32_t* ids = nullptr;  // [T*K]
  int64_t tokens = 0, topk = 0;
  int32_t* dest = nullptr;       // [P] out (-1: bad id)
  int32_t* slot = nullptr;       // [P] out
  int64_t* pos = nullptr;        // [P] out (-1: bad id)
  int64_t* counts = nullptr;     // [ranks + 1] out (counts[ranks]: bad ids)
  int64_t* scratch = nullptr;    // [ep_plan_scratch]
};
// Per chunk of kEpChunk pairs: destinations and a histogram; one block scans the chunks per
// destination; per chunk again: each pair's rank among earlier pairs of its destination in the
// chunk. Stable (pairs ascending within a destination), as ep_plan_host.
void ep_plan(const EpPlanParams& p, cudaStream_t st);

struct EpPackParams {
  const int32_t* slot = nullptr;
  const int64_t* pos = nullptr;
  const void* h = nullptr;          // [T, D] act
  const float* weights = nullptr;   // [T*K]
  int64_t tokens = 0, topk = 0, dim = 0;
  DType act = DType::kBF16;
  uint8_t* send = nullptr;          // [rows * ep_row_bytes]
};
void ep_pack(const EpPackParams& p, cudaStream_t st);

struct EpUnpackParams {
  EpTableView table;
  const uint8_t* recv = nullptr;    // [m * ep_row_bytes]
  int64_t rows = 0, dim = 0;
  DType act = DType::kBF16;
  void* x = nullptr;                // [m, D] act
  int32_t* logical = nullptr;       // [m] (-1: bad slot)
  float* weight = nullptr;          // [m]
  int64_t* bad = nullptr;           // [1] += rows with a bad slot (not reset here)
};
void ep_unpack(const EpUnpackParams& p, cudaStream_t st);

// out[j] = ye[index[j]] (f32 rows of `dim`), zeros where index[j] < 0.
void ep_gather_f32(const float* ye, const int64_t* index, int64_t rows, int64_t dim, float* out, cudaStream_t st);

}  // namespace deepinfer::model::ds::cuda
