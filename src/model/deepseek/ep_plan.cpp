#include "model/deepseek/ep_plan.h"

#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::model::ds {

EpRouteTable make_route_table(const parallel::ExpertPlacement& L, int32_t rank) {
  L.validate();
  if (rank < 0 || rank >= L.num_ranks)
    DI_THROW(InvalidArgument, "expert-parallel route table: rank ", rank, " outside a placement of ", L.num_ranks,
             " ranks");
  EpRouteTable t;
  t.rank = rank, t.ranks = L.num_ranks, t.slots = L.slots_per_rank, t.experts = L.num_logical;
  t.local_phys.assign(size_t(L.num_logical), -1);
  t.rep_off.assign(size_t(L.num_logical) + 1, 0);
  for (int32_t e = 0; e < L.num_logical; ++e) {
    for (int32_t p : L.logical_to_physical[size_t(e)]) {
      t.reps.push_back(p);
      if (t.local_phys[size_t(e)] < 0 && p / L.slots_per_rank == rank) t.local_phys[size_t(e)] = p;
    }
    t.rep_off[size_t(e) + 1] = int32_t(t.reps.size());
  }
  t.slot_logical.assign(L.physical_to_logical.begin() + int64_t(rank) * L.slots_per_rank,
                        L.physical_to_logical.begin() + int64_t(rank + 1) * L.slots_per_rank);
  return t;
}

int64_t ep_row_bytes(int64_t D, DType act) {
  if (act != DType::kBF16 && act != DType::kF32)
    DI_THROW(InvalidArgument, "expert-parallel rows: activation dtype must be bf16 or f32");
  if (D <= 0) DI_THROW(InvalidArgument, "expert-parallel rows: hidden size ", D, " must be > 0");
  return 16 + (D * int64_t(dtype_bits(act) / 8) + 15) / 16 * 16;
}

EpPlan ep_plan_host(const EpRouteTable& t, const int32_t* ids, int64_t T, int64_t K) {
  const int64_t P = T * K;
  EpPlan p;
  p.dest.assign(size_t(P), -1);
  p.slot.assign(size_t(P), 0);
  p.pos.assign(size_t(P), -1);
  p.counts.assign(size_t(t.ranks) + 1, 0);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= t.experts) {
      p.counts[size_t(t.ranks)]++;
      continue;
    }
    int32_t phys = t.local_phys[size_t(e)];
    if (phys < 0) {
      const int32_t n = t.rep_off[size_t(e) + 1] - t.rep_off[size_t(e)];
      phys = t.reps[size_t(t.rep_off[size_t(e)] + int32_t((i / K) % n))];
    }
    p.dest[size_t(i)] = phys / t.slots;
    p.slot[size_t(i)] = phys % t.slots;
    p.counts[size_t(p.dest[size_t(i)])]++;
  }
  std::vector<int64_t> next(size_t(t.ranks), 0);
  for (int32_t q = 1; q < t.ranks; ++q) next[size_t(q)] = next[size_t(q - 1)] + p.counts[size_t(q - 1)];
  for (int64_t i = 0; i < P; ++i)
    if (p.dest[size_t(i)] >= 0) p.pos[size_t(i)] = next[size_t(p.dest[size_t(i)])]++;
  return p;
}

void ep_pack_host(const EpPlan& plan, const void* h, DType act, int64_t D, int64_t K, const float* weights,
                  uint8_t* send) {
  const int64_t rb = ep_row_bytes(D, act), vb = D * int64_t(dtype_bits(act) / 8);
  for (size_t i = 0; i < plan.pos.size(); ++i) {
    if (plan.pos[i] < 0) continue;
    uint8_t* r = send + plan.pos[i] * rb;
    std::memset(r, 0, size_t(rb));
    std::memcpy(r, &plan.slot[i], 4);
    std::memcpy(r + 4, &weights[i], 4);
    std::memcpy(r + 16, static_cast<const uint8_t*>(h) + (int64_t(i) / K) * vb, size_t(vb));
  }
}

int64_t ep_unpack_host(const EpRouteTable& t, const uint8_t* recv, int64_t m, int64_t D, DType act, void* x,
                       int32_t* logical, float* weight) {
  const int64_t rb = ep_row_bytes(D, act), vb = D * int64_t(dtype_bits(act) / 8);
  int64_t bad = 0;
  for (int64_t j = 0; j < m; ++j) {
    const uint8_t* r = recv + j * rb;
    int32_t s;
    std::memcpy(&s, r, 4);
    std::memcpy(&weight[j], r + 4, 4);
    const bool ok = s >= 0 && s < t.slots;
    logical[j] = ok ? t.slot_logical[size_t(s)] : -1;
    bad += ok ? 0 : 1;
    std::memcpy(static_cast<uint8_t*>(x) + j * vb, r + 16, size_t(vb));
  }
  return bad;
}

}  // namespace deepinfer::model::ds
