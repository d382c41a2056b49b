#include "model/deepseek/expert_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::model::ds {

ExpertParallel::ExpertParallel(parallel::ProcessGroup& group, std::vector<parallel::ExpertPlacement> layers,
                               EplbOptions eplb)
    : group_(group), layers_(std::move(layers)), eplb_(eplb) {
  DI_CHECK(group_.memory() == parallel::Memory::kHost, "CPU expert parallelism needs a host group, not ",
           group_.describe());
  for (parallel::ExpertPlacement& L : layers_) {
    if (L.num_ranks != group_.size())
      DI_THROW(InvalidArgument, "expert placement for ", L.num_ranks, " ranks in a group of ", group_.size());
    L.validate();
    load_.emplace_back(size_t(L.num_logical), 0);
    since_window_.emplace_back(size_t(L.num_logical), 0);
  }
}


void ExpertParallel::begin_step() {
  if (!eplb_.enabled || layers_.empty()) return;
  if (!window_) {
    if (eplb_.window_steps < 1 || eplb_.step_interval < 1)
      DI_THROW(InvalidArgument, "EPLB: window_steps (", eplb_.window_steps, ") and step_interval (",
               eplb_.step_interval, ") must be >= 1");
    window_ = std::make_unique<parallel::ExpertLoadWindow>(int32_t(layers_.size()), layers_[0].num_logical,
                                                           eplb_.window_steps);
  }
  if (steps_ > 0) {  // the previous step's counts join this rank's window
    const int32_t L = int32_t(layers_.size()), E = layers_[0].num_logical;
    std::vector<int64_t> counts(static_cast<size_t>(int64_t(L) * E));
    for (int32_t l = 0; l < L; ++l) {
      if (layers_[size_t(l)].num_logical != E)
        DI_THROW(InternalError, "EPLB: layer ", l, " has ", layers_[size_t(l)].num_logical, " experts, layer 0 ", E);
      std::vector<int64_t>& c = since_window_[size_t(l)];
      std::copy(c.begin(), c.end(), counts.begin() + int64_t(l) * E);
      std::fill(c.begin(), c.end(), 0);
    }
    window_->add_step(counts);
  }
  if (++steps_ % eplb_.step_interval == 0) rebalance();
}

// Every rank sums its window (its own tokens of the last window_steps steps) with the others'
// by one all-reduce, in rank order, so every rank plans from identical loads and gets the same
// placement.
void ExpertParallel::rebalance() {
  const int32_t L = int32_t(layers_.size()), E = layers_[0].num_logical;
  std::vector<int64_t> counts(static_cast<size_t>(int64_t(L) * E));
  for (int32_t l = 0; l < L; ++l) {
    const std::vector<double> w = window_->layer_load(l);  // exact integers
    for (int32_t e = 0; e < E; ++e) counts[size_t(int64_t(l) * E + e)] = int64_t(w[size_t(e)]);
  }
  group_.all_reduce(counts.data(), int64_t(counts.size()), parallel::ReduceType::kI64, parallel::ReduceOp::kSum);
  int32_t moved = 0;
  for (int32_t l = 0; l < L; ++l) {
    const std::vector<double> load(counts.begin() + int64_t(l) * E, counts.begin() + int64_t(l + 1) * E);
    parallel::Rebalance r = parallel::plan_rebalance(layers_[size_t(l)], load, eplb_.min_gain);
    if (!r.worth_it) continue;
    moved += r.slots_changed;
    if (store_) move_weights(l, layers_[size_t(l)], r.placement);
    layers_[size_t(l)] = std::move(r.placement);
  }
  if (moved > 0) ++rebalances_, slots_moved_ += moved;
}

void ExpertParallel::set_device_exchange(std::shared_ptr<parallel::DeviceAllToAllV> a2a) {
  if (a2a && (a2a->size() != size() || a2a->rank() != rank()))
    DI_THROW(InvalidArgument, "expert parallelism: device exchange ", a2a->describe(), " is rank ", a2a->rank(), " of ",
             a2a->size(), ", the group (", group_.describe(), ") rank ", rank(), " of ", size());
  if (a2a && eplb_.enabled)
    DI_THROW(InvalidArgument, "expert parallelism: EPLB with the device exchange is not built (use the host-staged "
             "exchange, or EPLB off)");
  device_a2a_ = std::move(a2a);
}

void ExpertParallel::set_weight_store(ExpertWeightStore* store) {
  if (store)
    for (size_t l = 0; l < layers_.size(); ++l)
      for (int32_t e : layers_[l].local_logical(rank()))
        if (!store->holds_expert(int64_t(l), e))
          DI_THROW(InvalidArgument, "expert parallelism: rank ", rank(), " serves expert ", e, " of layer ", l,
                   " but does not hold its weights");
  store_ = store;
}

namespace {
// [rank][logical]: whether the rank's slots hold the expert.
std::vector<std::vector<bool>> holders(const parallel::ExpertPlacement& p) {
  std::vector<std::vector<bool>> h(static_cast<size_t>(p.num_ranks), std::vector<bool>(static_cast<size_t>(p.num_logical), false));
  for (int32_t q = 0; q < p.num_ranks; ++q)
    for (int32_t e : p.local_logical(q)) h[size_t(q)][size_t(e)] = true;
  return h;
}
}  // namespace

// Every rank derives the same transfer list from the two placements (no counts exchanged): rank r
// gains e when e is in its new slots and not its old ones; the lowest old holder sends it. Sends
// to each rank go in ascending expert order, so the receiver knows where each one starts.
void ExpertParallel::move_weights(int64_t layer, const parallel::ExpertPlacement& before,
                                  const parallel::ExpertPlacement& after) {
  const int n = size(), me = rank();
  const int32_t E = before.num_logical;
  const std::vector<std::vector<bool>> had = holders(before), will = holders(after);
  auto source = [&](int32_t e) -> int {
    for (int q = 0; q < n; ++q)
      if (had[size_t(q)][size_t(e)]) return q;
    DI_THROW(InternalError, "EPLB: layer ", layer, " expert ", e, " had no replica");
  };
  const int64_t B = store_->expert_bytes(layer);
  std::vector<int64_t> send_bytes(static_cast<size_t>(n), 0), recv_bytes(static_cast<size_t>(n), 0);
  std::vector<std::vector<int32_t>> to(static_cast<size_t>(n)), from(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q)
    for (int32_t e = 0; e < E; ++e) {
      if (!will[size_t(q)][size_t(e)] || had[size_t(q)][size_t(e)]) continue;
      const int src = source(e);
      if (src == me) to[size_t(q)].push_back(e), send_bytes[size_t(q)] += B;
      if (q == me) from[size_t(src)].push_back(e), recv_bytes[size_t(src)] += B;
    }
  int64_t total_send = 0, total_recv = 0;
  for (int q = 0; q < n; ++q) total_send += send_bytes[size_t(q)], total_recv += recv_bytes[size_t(q)];
  std::vector<std::byte> send(static_cast<size_t>(total_send)), recv(static_cast<size_t>(total_recv));
  int64_t at = 0;
  for (int q = 0; q < n; ++q)
    for (int32_t e : to[size_t(q)]) {
      store_->pack_expert(layer, e, std::span<std::byte>(send.data() + at, size_t(B)));
      at += B;
    }
  group_.all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
  at = 0;
  for (int q = 0; q < n; ++q)
    for (int32_t e : from[size_t(q)]) {
      store_->adopt_expert(layer, e, std::span<const std::byte>(recv.data() + at, size_t(B)));
      at += B, ++experts_received_, bytes_received_ += B;
    }
  for (int32_t e = 0; e < E; ++e)
    if (had[size_t(me)][size_t(e)] && !will[size_t(me)][size_t(e)]) store_->release_expert(layer, e), ++experts_released_;
}

void ExpertParallel::dispatch(int64_t layer, const float* h, int64_t T, int64_t D, const int32_t* ids, int64_t K,
                              const float* pair_weights) {
  const parallel::ExpertPlacement& L = layout(layer);
  const int n = size(), me = rank();
  // A sent row: [local slot as bits][routed weight, when given][D values]. Every rank of a step
  // passes weights or none (the backends are the same on every rank).
  const int64_t w = pair_weights != nullptr ? 1 : 0, P = T * K, row = D + 1 + w;
  D_ = D, pairs_ = P, row_ = row;
  replicated_ = false;
  // Destination of each pair: a replica on this rank when there is one, else one chosen by the
  // token index (spreads a hot expert's replicas; any replica computes the same function).
  std::vector<int32_t> dest(static_cast<size_t>(P)), slot(static_cast<size_t>(P));
  std::vector<int64_t>& load = load_.at(size_t(layer));
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= L.num_logical) DI_THROW(InternalError, "moe dispatch: expert id ", e, " at pair ", i);
    load[size_t(e)]++;
    since_window_[size_t(layer)][size_t(e)]++;
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
    if (w) r[1] = pair_weights[i];
    std::memcpy(r + 1 + w, h + (i / K) * D, size_t(D) * sizeof(float));
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
  recv_weight_.resize(size_t(w * m));
  for (int64_t j = 0; j < m; ++j) {
    std::memcpy(&recv_slot_[size_t(j)], got.data() + j * row, sizeof(int32_t));
    if (recv_slot_[size_t(j)] < 0 || recv_slot_[size_t(j)] >= L.slots_per_rank)
      DI_THROW(InternalError, "moe dispatch: received slot ", recv_slot_[size_t(j)], " of ", L.slots_per_rank);
    if (w) recv_weight_[size_t(j)] = got[size_t(j * row + 1)];
    std::memcpy(recv_rows_.data() + j * D, got.data() + j * row + 1 + w, size_t(D) * sizeof(float));
  }
}

namespace {
// Which rank computes each logical expert of a replicated (split) step, and in which of its slots:
// see dispatch_replicated. -1 for experts without pairs.
struct ExpertOwners {
  std::vector<int32_t> rank, slot;  // [E]
};

ExpertOwners assign_owners(const parallel::ExpertPlacement& L, std::span<const int64_t> count, int n) {
  const int32_t E = L.num_logical, S = L.slots_per_rank;
  ExpertOwners o{std::vector<int32_t>(size_t(E), -1), std::vector<int32_t>(size_t(E), -1)};
  std::vector<int64_t> load(size_t(n), 0);
  // The first slot of e on rank q, or -1.
  auto slot_on = [&](int32_t e, int32_t q) {
    for (int32_t p : L.logical_to_physical[size_t(e)])
      if (p / S == q) return p % S;
    return -1;
  };
  std::vector<int32_t> shared;  // experts held by several ranks
  for (int32_t e = 0; e < E; ++e) {
    if (count[size_t(e)] == 0) continue;
    const std::vector<int32_t>& reps = L.logical_to_physical[size_t(e)];
    if (reps.empty()) DI_THROW(InternalError, "moe dispatch: expert ", e, " has no replica");
    const int32_t q0 = reps[0] / S;
    bool one_rank = true;
    for (int32_t p : reps) one_rank = one_rank && p / S == q0;
    if (!one_rank) {
      shared.push_back(e);
      continue;
    }
    o.rank[size_t(e)] = q0, o.slot[size_t(e)] = slot_on(e, q0);
    load[size_t(q0)] += count[size_t(e)];
  }
  std::stable_sort(shared.begin(), shared.end(), [&](int32_t a, int32_t b) { return count[size_t(a)] > count[size_t(b)]; });
  for (int32_t e : shared) {
    int32_t best = -1;
    for (int32_t q = 0; q < n; ++q)
      if (slot_on(e, q) >= 0 && (best < 0 || load[size_t(q)] < load[size_t(best)])) best = q;
    o.rank[size_t(e)] = best, o.slot[size_t(e)] = slot_on(e, best);
    load[size_t(best)] += count[size_t(e)];
  }
  return o;
}
}  // namespace

void ExpertParallel::dispatch_replicated(int64_t layer, const float* h, int64_t T, int64_t D, const int32_t* ids,
                                         int64_t K, const float* pair_weights) {
  const parallel::ExpertPlacement& L = layout(layer);
  const int n = size(), me = rank();
  const int64_t P = T * K;
  D_ = D, pairs_ = P, row_ = 0;
  replicated_ = true;
  std::vector<int64_t> count(size_t(L.num_logical), 0);
  for (int64_t i = 0; i < P; ++i) {
    if (ids[i] < 0 || ids[i] >= L.num_logical) DI_THROW(InternalError, "moe dispatch: expert id ", ids[i], " at pair ", i);
    count[size_t(ids[i])]++;
  }
  const ExpertOwners own = assign_owners(L, count, n);
  // Pairs grouped by computing rank (stable: ascending pair index within a rank): the order in
  // which the all-gather lays the ranks' outputs out.
  gather_rows_.assign(size_t(n), 0);
  for (int64_t i = 0; i < P; ++i) gather_rows_[size_t(own.rank[size_t(ids[i])])]++;
  std::vector<int64_t> fill(size_t(n), 0);
  for (int q = 1; q < n; ++q) fill[size_t(q)] = fill[size_t(q - 1)] + gather_rows_[size_t(q - 1)];
  const int64_t first = fill[size_t(me)], m = gather_rows_[size_t(me)];
  gather_order_.assign(size_t(P), 0);
  for (int64_t i = 0; i < P; ++i) gather_order_[size_t(fill[size_t(own.rank[size_t(ids[i])])]++)] = i;
  recv_rows_.resize(size_t(m * D));
  recv_slot_.resize(size_t(m));
  recv_weight_.resize(pair_weights ? size_t(m) : 0);
  std::vector<int64_t>& load = load_.at(size_t(layer));
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = gather_order_[size_t(first + j)];
    const int32_t e = ids[i];
    std::memcpy(recv_rows_.data() + j * D, h + (i / K) * D, size_t(D) * sizeof(float));
    recv_slot_[size_t(j)] = own.slot[size_t(e)];
    if (pair_weights) recv_weight_[size_t(j)] = pair_weights[i];
    load[size_t(e)]++;
    since_window_[size_t(layer)][size_t(e)]++;
  }
  ++replicated_calls_, replicated_pairs_ += m;
}

ExpertParallel::Received ExpertParallel::received() const { return {recv_rows_, recv_slot_, recv_weight_}; }

void ExpertParallel::give_back(const float* outputs, float* out) {
  if (replicated_) {
    const int64_t D = D_, bytes_per_row = D * int64_t(sizeof(float));
    std::vector<int64_t> recv_bytes(gather_rows_.size());
    for (size_t q = 0; q < gather_rows_.size(); ++q) recv_bytes[q] = gather_rows_[q] * bytes_per_row;
    std::vector<float> all(static_cast<size_t>(pairs_ * D));
    const int64_t mine = recv_bytes[size_t(rank())];
    group_.all_gather_v(outputs, mine, all.data(), recv_bytes);
    for (int64_t at = 0; at < pairs_; ++at)
      std::memcpy(out + gather_order_[size_t(at)] * D, all.data() + at * D, size_t(bytes_per_row));
    replicated_bytes_ += pairs_ * bytes_per_row - mine;
    return;
  }
  const int64_t D = D_, bytes_per_row = D * int64_t(sizeof(float)), row = row_ * int64_t(sizeof(float));
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
