// Shared by the expert-parallel exchange tests: random placements (with redundant replicas, slots
// shuffled over ranks) and random routings with the awkward cases forced in (ranks that receive
// nothing, tokens whose k experts all live on one rank).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "parallel/eplb.h"

namespace deepinfer::model::ds::test {

// Every logical expert once, then `redundant` extra copies of random experts, over W*S slots
// (W*S >= E + redundant), shuffled so that replica lists are not contiguous.
inline parallel::ExpertPlacement random_placement(std::mt19937& rng, int32_t E, int32_t W, int32_t S) {
  parallel::ExpertPlacement L;
  L.num_logical = E, L.num_ranks = W, L.slots_per_rank = S;
  std::vector<int32_t> p2l;
  for (int32_t e = 0; e < E; ++e) p2l.push_back(e);
  while (int32_t(p2l.size()) < W * S) p2l.push_back(int32_t(rng() % uint32_t(E)));
  std::shuffle(p2l.begin(), p2l.end(), rng);
  L.physical_to_logical = p2l;
  L.logical_to_physical.assign(size_t(E), {});
  for (int32_t p = 0; p < W * S; ++p) L.logical_to_physical[size_t(p2l[size_t(p)])].push_back(p);
  L.validate();
  return L;
}

// Experts held by no rank other than `rank` (logical ids all of whose replicas live there).
inline std::vector<int32_t> experts_only_on(const parallel::ExpertPlacement& L, int32_t rank) {
  std::vector<int32_t> out;
  for (int32_t e = 0; e < L.num_logical; ++e) {
    bool only = true;
    for (int32_t p : L.logical_to_physical[size_t(e)]) only = only && p / L.slots_per_rank == rank;
    if (only) out.push_back(e);
  }
  return out;
}

// Experts with a replica on `rank`: routing around them (from ranks with no tokens of their
// own) leaves `rank` with nothing to receive.
inline std::vector<int32_t> experts_on(const parallel::ExpertPlacement& L, int32_t rank) {
  std::vector<int32_t> out;
  for (int32_t e = 0; e < L.num_logical; ++e)
    for (int32_t p : L.logical_to_physical[size_t(e)])
      if (p / L.slots_per_rank == rank) {
        out.push_back(e);
        break;
      }
  return out;
}

// ids [T*K]: distinct experts per token (as a router gives), avoiding `avoid` (experts never
// chosen, so their rank may receive nothing); token 0's k experts all on `rank_all` when that
// rank holds >= K experts of its own.
inline std::vector<int32_t> random_ids(std::mt19937& rng, const parallel::ExpertPlacement& L, int64_t T, int64_t K,
                                       const std::vector<int32_t>& avoid, int32_t rank_all) {
  std::vector<int32_t> pool;
  for (int32_t e = 0; e < L.num_logical; ++e)
    if (std::find(avoid.begin(), avoid.end(), e) == avoid.end()) pool.push_back(e);
  std::vector<int32_t> ids(size_t(T * K));
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t k = 0; k < K; ++k) ids[size_t(t * K + k)] = pool[size_t(k % int64_t(pool.size()))];
  }
  const std::vector<int32_t> mine = experts_only_on(L, rank_all);
  if (T > 0 && int64_t(mine.size()) >= K)
    for (int64_t k = 0; k < K; ++k) ids[size_t(k)] = mine[size_t(k)];
  return ids;
}

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace deepinfer::model::ds::test
