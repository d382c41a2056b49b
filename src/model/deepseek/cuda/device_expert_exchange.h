// The device-side expert-parallel exchange of one rank (issue #14): a main MoE layer's (token, k)
// pairs travel to the ranks holding their experts and their outputs come back without touching
// host memory — only the per-peer row counts (W int64s each way, to size the transfers) are read
// back, one small copy and sync per layer.
//   dispatch:  ep_plan (destination, slot and send row of each pair, on the device; the rules
//              of the host-staged ExpertParallel::dispatch, ep_plan.h) -> counts all-to-all ->
//              ep_pack (rows + slot + routed weight, contiguous per destination) -> rows
//              all-to-all -> ep_unpack (x [m, D] in arrival order: rank 0's rows first, each
//              sender's pairs ascending — the host-staged path's order — logical ids, weights).
//   the caller runs its experts on the m rows (the single-rank kernels) into f32 [m, D] in
//   arrival order;
//   give_back: the reverse all-to-all lands pair i's output at row rows()[i] of out(), which the
//              single-rank moe_combine gathers (k order per token, the same additions as one rank).
// Lockstep like ExpertParallel: every rank calls dispatch and give_back for every layer of every
// step, also with zero tokens. EPLB is not built on this path (placements never change here).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <vector>

#include "core/dtype.h"
#include "model/deepseek/cuda/ep_exchange.h"
#include "ops/cuda/runtime.h"
#include "parallel/device_all_to_all.h"
#include "parallel/eplb.h"

namespace deepinfer::model::ds::cuda {

class DeviceExpertExchange {
 public:
  DeviceExpertExchange(parallel::DeviceAllToAllV& a2a, int device);
  int rank() const { return a2a_.rank(); }
  int size() const { return a2a_.size(); }
  std::string describe() const { return a2a_.describe(); }

  struct Received {
    const void* x = nullptr;          // [rows, D] activation dtype, arrival order
    const int32_t* logical = nullptr; // [rows] logical expert of each row
    const float* weight = nullptr;    // [rows] routed weight of each row
    int64_t rows = 0;
  };
  // h [T, D] (bf16 or f32), ids / weights [T*K]: device pointers on `st`. InternalError naming
  // the pair for an expert id outside the placement (as the host-staged path).
  Received dispatch(int64_t layer, const parallel::ExpertPlacement& L, const void* h, DType act, int64_t T, int64_t D,
                    const int32_t* ids, const float* weights, int64_t K, cudaStream_t st);
  // outputs [rows, D] f32 in arrival order -> out() [T*K, D]; rows() [T*K] = the row of pair i.
  void give_back(const float* outputs, cudaStream_t st);
  const float* out() const { return out_.as<float>(); }
  const int64_t* rows() const { return pos_.as<int64_t>(); }

  int64_t calls() const { return calls_; }
  int64_t rows_sent() const { return rows_sent_; }          // to other ranks and itself, since construction
  int64_t rows_received() const { return rows_received_; }

 private:
  struct Table {
    parallel::ExpertPlacement placement;
    deepinfer::cuda::DeviceBuffer buf;
    EpTableView view;
  };
  const EpTableView& table(int64_t layer, const parallel::ExpertPlacement& L);
  void grow(deepinfer::cuda::DeviceBuffer& b, size_t bytes);

  parallel::DeviceAllToAllV& a2a_;
  int device_;
  std::map<int64_t, Table> tables_;
  deepinfer::cuda::DeviceBuffer dest_, slot_, pos_, scratch_, counts_, send_, recv_, x_, logical_, weight_, out_;
  std::vector<int64_t> host_counts_;                       // [2W + 2]: send [W], bad ids, recv [W], bad slots
  std::vector<int64_t> send_rows_, recv_rows_;             // [W] rows of the step in flight
  int64_t D_ = 0, P_ = 0;
  int64_t calls_ = 0, rows_sent_ = 0, rows_received_ = 0;
};

}  // namespace deepinfer::model::ds::cuda
