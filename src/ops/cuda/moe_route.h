// Device-side MoE permutation (no host read-back): the router's (token, k) assignments sorted by
// expert — stable, tokens ascending within an expert, the same order as the host permutation the
// per-expert cuBLASLt path used — plus the tile list the grouped GEMM (grouped_gemm.h) runs over.
// One block: per-warp counts per expert, a column scan, then each warp scatters its range in order
// with __match_any_sync ranks. An expert id outside [0, experts) (a bad hash table entry) gets no
// segment: comb = -1 and its assignment contributes nothing (the combine skips negative rows).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer::ops::cuda {

struct MoeRouteParams {
  const int32_t* ids = nullptr;     // [tokens*topk] expert of assignment (t, k)
  const float* weights = nullptr;   // [tokens*topk] routed weight
  int64_t tokens = 0, topk = 0, experts = 0;
  int tile_m = 64;                  // rows per GEMM tile (kGroupedTileM)
  int32_t* seg = nullptr;           // [experts+1] out: first sorted row of expert e; seg[experts] = valid rows
  int64_t* perm_src = nullptr;      // [tokens*topk] out: token of sorted row a (rows >= seg[experts]: invalid ids)
  float* perm_w = nullptr;          // [tokens*topk] out: routed weight of sorted row a
  int64_t* comb = nullptr;          // [tokens*topk] out: sorted row of (t, k), -1 for an invalid id
  int32_t* tiles = nullptr;         // [max_tiles] out: expert << 16 | tile index within the expert
  int32_t* num_tiles = nullptr;     // [1] out
  int64_t max_tiles = 0;            // moe_route_max_tiles(tokens*topk, experts, tile_m)
};
// Upper bound of Σ_e ceil(rows_e / tile_m) over any routing of `rows` assignments.
int64_t moe_route_max_tiles(int64_t rows, int64_t experts, int tile_m);
void moe_route(const MoeRouteParams& p, cudaStream_t stream);
// Host twin (host pointers), same outputs bit for bit.
void moe_route_host(const MoeRouteParams& p);

}  // namespace deepinfer::ops::cuda
