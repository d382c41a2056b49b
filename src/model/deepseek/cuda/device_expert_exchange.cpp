#include "model/deepseek/cuda/device_expert_exchange.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/ep_plan.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;

DeviceExpertExchange::DeviceExpertExchange(parallel::DeviceAllToAllV& a2a, int device) : a2a_(a2a), device_(device) {
  const int W = a2a_.size();
  // Device counts: [0, W] this rank's sends + bad ids, [W+1, 2W] what each rank sends here,
  // [2W+1] received rows with a bad slot (accumulated; checked at each dispatch).
  counts_ = dc::DeviceBuffer(size_t(2 * W + 2) * 8, device_);
  DI_CUDA_CHECK(cudaMemset(counts_.data(), 0, counts_.size_bytes()));
  host_counts_.assign(size_t(2 * W + 2), 0);
}

void DeviceExpertExchange::grow(dc::DeviceBuffer& b, size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (b.size_bytes() >= bytes) return;
  b = dc::DeviceBuffer();
  b = dc::DeviceBuffer(bytes + bytes / 4, device_);
}

// Uploaded once per layer and placement (the host copy of the placement tells a change).
const EpTableView& DeviceExpertExchange::table(int64_t layer, const parallel::ExpertPlacement& L) {
  auto it = tables_.find(layer);
  if (it != tables_.end() && it->second.placement == L) return it->second.view;
  if (L.num_ranks != size())
    DI_THROW(InvalidArgument, "device expert exchange: layer ", layer, " placed over ", L.num_ranks, " ranks, group of ",
             size());
  const EpRouteTable t = make_route_table(L, rank());
  std::vector<int32_t> flat;
  for (const std::vector<int32_t>* v : {&t.local_phys, &t.rep_off, &t.reps, &t.slot_logical})
    flat.insert(flat.end(), v->begin(), v->end());
  Table& T = tables_[layer];
  T.placement = L;
  T.buf = dc::DeviceBuffer(flat.size() * 4, device_);
  DI_CUDA_CHECK(cudaMemcpy(T.buf.data(), flat.data(), flat.size() * 4, cudaMemcpyHostToDevice));
  const int32_t* p = T.buf.as<int32_t>();
  T.view = {.local_phys = p, .rep_off = p + t.local_phys.size(), .reps = p + t.local_phys.size() + t.rep_off.size(),
            .slot_logical = p + t.local_phys.size() + t.rep_off.size() + t.reps.size(), .rank = t.rank,
            .ranks = t.ranks, .slots = t.slots, .experts = t.experts};
  return T.view;
}

DeviceExpertExchange::Received DeviceExpertExchange::dispatch(int64_t layer, const parallel::ExpertPlacement& L,
                                                              const void* h, DType act, int64_t T, int64_t D,
                                                              const int32_t* ids, const float* weights, int64_t K,
                                                              cudaStream_t st) {
  const int W = size();
  const int64_t P = T * K, rb = ep_row_bytes(D, act), ab = int64_t(dtype_bits(act) / 8);
  const EpTableView& tv = table(layer, L);
  D_ = D, P_ = P, ++calls_;
  grow(dest_, size_t(P) * 4), grow(slot_, size_t(P) * 4), grow(pos_, size_t(P) * 8);
  grow(scratch_, size_t(ep_plan_scratch(P, W)) * 8);
  int64_t* counts = counts_.as<int64_t>();
  ep_plan({.table = tv, .ids = ids, .tokens = T, .topk = K, .dest = dest_.as<int32_t>(), .slot = slot_.as<int32_t>(),
           .pos = pos_.as<int64_t>(), .counts = counts, .scratch = scratch_.as<int64_t>()},
          st);
  parallel::exchange_device_counts(a2a_, st, counts, counts + W + 1);
  // The one read-back: the sizes NCCL needs on the host (and the error counters).
  DI_CUDA_CHECK(cudaMemcpyAsync(host_counts_.data(), counts, host_counts_.size() * 8, cudaMemcpyDeviceToHost, st));
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  if (host_counts_[size_t(W)] > 0) {  // error path only: name the first bad pair
    std::vector<int32_t> hid(static_cast<size_t>(P));
    DI_CUDA_CHECK(cudaMemcpy(hid.data(), ids, size_t(P) * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < P; ++i)
      if (hid[size_t(i)] < 0 || hid[size_t(i)] >= L.num_logical)
        DI_THROW(InternalError, "moe dispatch (device exchange): expert id ", hid[size_t(i)], " at pair ", i, " of layer ",
                 layer, " (experts: ", L.num_logical, ")");
  }
  if (host_counts_[size_t(2 * W + 1)] > 0)
    DI_THROW(InternalError, "moe dispatch (device exchange): rank ", rank(), " received ", host_counts_[size_t(2 * W + 1)],
             " rows with a slot outside [0, ", L.slots_per_rank, ") before layer ", layer);
  send_rows_.assign(host_counts_.begin(), host_counts_.begin() + W);
  recv_rows_.assign(host_counts_.begin() + W + 1, host_counts_.begin() + 2 * W + 1);
  int64_t sent = 0, m = 0;
  std::vector<int64_t> sb(static_cast<size_t>(W)), rbytes(static_cast<size_t>(W));
  for (int q = 0; q < W; ++q) {
    sent += send_rows_[size_t(q)], m += recv_rows_[size_t(q)];
    sb[size_t(q)] = send_rows_[size_t(q)] * rb, rbytes[size_t(q)] = recv_rows_[size_t(q)] * rb;
  }
  DI_CHECK(sent == P, "device exchange: planned ", sent, " rows for ", P, " pairs");
  rows_sent_ += sent, rows_received_ += m;
  grow(send_, size_t(P * rb)), grow(recv_, size_t(m * rb));
  grow(x_, size_t(m * D * ab)), grow(logical_, size_t(m) * 4), grow(weight_, size_t(m) * 4);
  ep_pack({.slot = slot_.as<int32_t>(), .pos = pos_.as<int64_t>(), .h = h, .weights = weights, .tokens = T, .topk = K,
           .dim = D, .act = act, .send = send_.as<uint8_t>()},
          st);
  a2a_.all_to_all_v(st, send_.data(), sb, recv_.data(), rbytes);
  ep_unpack({.table = tv, .recv = recv_.as<uint8_t>(), .rows = m, .dim = D, .act = act, .x = x_.data(),
             .logical = logical_.as<int32_t>(), .weight = weight_.as<float>(), .bad = counts + 2 * W + 1},
            st);
  return {.x = x_.data(), .logical = logical_.as<int32_t>(), .weight = weight_.as<float>(), .rows = m};
}

void DeviceExpertExchange::give_back(const float* outputs, cudaStream_t st) {
  const int W = size();
  DI_CHECK(int64_t(send_rows_.size()) == W, "device exchange: give_back before dispatch");
  std::vector<int64_t> sb(static_cast<size_t>(W)), rbytes(static_cast<size_t>(W));
  for (int q = 0; q < W; ++q) sb[size_t(q)] = recv_rows_[size_t(q)] * D_ * 4, rbytes[size_t(q)] = send_rows_[size_t(q)] * D_ * 4;
  grow(out_, size_t(P_ * D_) * 4);
  a2a_.all_to_all_v(st, outputs, sb, out_.data(), rbytes);
}

}  // namespace deepinfer::model::ds::cuda
