#include "model/deepseek/expert_parallel.h"

#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::model::ds {

ExpertParallel::ExpertParallel(parallel::ProcessGroup& group, std::vector<parallel::ExpertPlacement> layers)
    : group_(group), layers_(std::move(layers)) {
  DI_CHECK(group_.memory() == parallel::Memory::kHost, "CPU expert parallelism needs a host group, not ",
           group_.describe());
  for (parallel::ExpertPlacement& L : layers_) {
    if (L.num_ranks != group_.size())
      DI_THROW(InvalidArgument, "expert placement for ", L.num_ranks, " ranks in a group of ", group_.size());
    L.validate();
    load_.emplace_back(size_t(L.num_logical), 0);
  }
}

bool ExpertParallel::holds(int64_t layer, int32_t logical) const {
  const parallel::ExpertPlacement& L = layout(layer);
  for (int32_t p : L.logical_to_physical.at(size_t(logical)))
    if (L.physical_to_logical.size() > 0 && p / L.slots_per_rank == rank()) return true;
  return false;
}

void ExpertParallel::set_layout(int64_t layer, parallel::ExpertPlacement L) {
  if (L.num_ranks != group_.size())
    DI_THROW(InvalidArgument, "expert placement for ", L.num_ranks, " ranks in a group of ", group_.size());
  L.validate();
  layers_.at(size_t(layer)) = std::move(L);
}

void ExpertParallel::dispatch(int64_t layer, const float* h, int64_t T, int64_t D, const int32_t* ids, int64_t K) {
  const parallel::ExpertPlacement& L = layout(layer);
  const int n = size(), me = rank();
  const int64_t P = T * K, row = D + 1;  // a sent row: [local slot as bits][D values]
  D_ = D, pairs_ = P;
  // Destination of each pair: a replica on this rank when there is one, else one chosen by the
  // token index (spreads a hot expert's replicas; any replica computes the same function).
  std::vector<int32_t> dest(static_cast<size_t>(P)), slot(static_cast<size_t>(P));
  std::vector<int64_t>& load = load_.at(size_t(layer));
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= L.num_logical) DI_THROW(InternalError, "moe dispatch: expert id ", e, " at pair ", i);
    load[size_t(e)]++;
    const std::vector<int32_t>& reps = L.logical_to_physical[size_t(e)];
    int32_t p = reps[size_t((i / K) % int64_t(reps.size()))];
    for (int32_t q : reps)
      if (q / L.slots_per_rank == me) { p = q; break; }
    dest[size_t(i)] = p / L.slots_per_rank;
    slot[size_t(i)] = p % L.slots_per_rank;
  }
  // Pack by destination rank (stable: pair order within a rank).
  std::vector<int64_t> count(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < P; ++i) count[size_t(dest[size_t(i)])]++;
  std::vector<int64_t> start(size_t(n) + 1, 0);
  for (int q = 0; q < n; ++q) start[size_t(q) + 1] = start[size_t(q)] + count[size_t(q)];
  send_order_.assign(size_t(P), 0);
  std::vector<float> send(static_cast<size_t>(P * row));
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < P; ++i) {
    const int64_t at = fill[size_t(dest[size_t(i)])]++;
    send_order_[size_t(at)] = i;
    float* r = send.data() + at * row;
    std::memcpy(r, &slot[size_t(i)], sizeof(int32_t));
    std::memcpy(r + 1, h + (i / K) * D, size_t(D) * sizeof(float));
  }
  send_bytes_.assign(size_t(n), 0);
  for (int q = 0; q < n; ++q) send_bytes_[size_t(q)] = count[size_t(q)] * row * int64_t(sizeof(float));
  recv_bytes_ = parallel::exchange_counts(group_, send_bytes_);
  int64_t m = 0;
  for (int64_t b : recv_bytes_) m += b / (row * int64_t(sizeof(float)));
  std::vector<float> got(static_cast<size_t>(m * row));
  group_.all_to_all_v(send.data(), send_bytes_, got.data(), recv_bytes_);
  recv_rows_.resize(size_t(m * D));
  recv_slot_.resize(size_t(m));
  for (int64_t j = 0; j < m; ++j) {
    std::memcpy(&recv_slot_[size_t(j)], got.data() + j * row, sizeof(int32_t));
    if (recv_slot_[size_t(j)] < 0 || recv_slot_[size_t(j)] >= L.slots_per_rank)
      DI_THROW(InternalError, "moe dispatch: received slot ", recv_slot_[size_t(j)], " of ", L.slots_per_rank);
    std::memcpy(recv_rows_.data() + j * D, got.data() + j * row + 1, size_t(D) * sizeof(float));
  }
}

ExpertParallel::Received ExpertParallel::received() const { return {recv_rows_, recv_slot_}; }

void ExpertParallel::give_back(const float* outputs, float* out) {
  const int64_t D = D_, bytes_per_row = D * int64_t(sizeof(float)), row = (D + 1) * int64_t(sizeof(float));
  // The reverse exchange: what came from rank q (recv_bytes_[q]) returns to it, D values a row.
  std::vector<int64_t> back_send(recv_bytes_.size()), back_recv(send_bytes_.size());
  for (size_t q = 0; q < recv_bytes_.size(); ++q) back_send[q] = recv_bytes_[q] / row * bytes_per_row;
  for (size_t q = 0; q < send_bytes_.size(); ++q) back_recv[q] = send_bytes_[q] / row * bytes_per_row;
  std::vector<float> back(static_cast<size_t>(pairs_ * D));
  group_.all_to_all_v(outputs, back_send, back.data(), back_recv);
  for (int64_t at = 0; at < pairs_; ++at)
    std::memcpy(out + send_order_[size_t(at)] * D, back.data() + at * D, size_t(bytes_per_row));
}

std::vector<std::vector<int64_t>> ExpertParallel::take_load() {
  std::vector<std::vector<int64_t>> out = load_;
  for (auto& l : load_) std::fill(l.begin(), l.end(), 0);
  return out;
}

}  // namespace deepinfer::model::ds
