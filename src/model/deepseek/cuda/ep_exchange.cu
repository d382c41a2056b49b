// Device twins of ep_plan_host / ep_pack_host / ep_unpack_host (model/deepseek/ep_plan.h). Rows
// are moved in 2-byte units: a bf16 row of odd length is 2-byte aligned only, and the exchange
// is bound by the interconnect, not by these copies.
#include "model/deepseek/cuda/ep_exchange.h"

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/ep_plan.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {
namespace {

constexpr int32_t kMaxRanks = 4096;  // plan_hist keeps one int per rank in shared memory

__device__ int32_t choose_dest(const EpTableView& t, int32_t e, int64_t token, int32_t* slot) {
  if (e < 0 || e >= t.experts) return -1;
  int32_t phys = t.local_phys[e];
  if (phys < 0) {
    const int32_t n = t.rep_off[e + 1] - t.rep_off[e];
    phys = t.reps[t.rep_off[e] + int32_t(token % n)];
  }
  *slot = phys % t.slots;
  return phys / t.slots;
}

__global__ void plan_hist(EpTableView t, const int32_t* ids, int64_t P, int64_t K, int32_t* dest, int32_t* slot,
                          int64_t* hist) {
  extern __shared__ int32_t sh[];
  const int W1 = t.ranks + 1;
  for (int q = threadIdx.x; q < W1; q += blockDim.x) sh[q] = 0;
  __syncthreads();
  const int64_t i = int64_t(blockIdx.x) * kEpChunk + threadIdx.x;
  if (i < P) {
    int32_t s = 0;
    const int32_t d = choose_dest(t, ids[i], i / K, &s);
    dest[i] = d;
    slot[i] = s;
    atomicAdd(&sh[d < 0 ? t.ranks : d], 1);
  }
  __syncthreads();
  for (int q = threadIdx.x; q < W1; q += blockDim.x) hist[int64_t(blockIdx.x) * W1 + q] = sh[q];
}

// One block: hist[c][q] becomes the rows of destination q in chunks before c; counts[q] the
// total; row `chunks` of hist the first send row of each destination.
__global__ void plan_scan(int64_t* hist, int64_t chunks, int W1, int64_t* counts) {
  for (int q = threadIdx.x; q < W1; q += blockDim.x) {
    int64_t run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t v = hist[c * W1 + q];
      hist[c * W1 + q] = run;
      run += v;
    }
    counts[q] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t s = 0;
    for (int q = 0; q + 1 < W1; ++q) hist[chunks * W1 + q] = s, s += counts[q];
  }
}

__global__ void plan_pos(const int32_t* dest, int64_t P, const int64_t* hist, int64_t chunks, int W1, int64_t* pos) {
  __shared__ int32_t sd[kEpChunk];
  const int64_t i = int64_t(blockIdx.x) * kEpChunk + threadIdx.x;
  const int32_t d = i < P ? dest[i] : -1;
  sd[threadIdx.x] = d;
  __syncthreads();
  if (i >= P) return;
  if (d < 0) {
    pos[i] = -1;
    return;
  }
  int64_t local = 0;
  for (int j = 0; j < int(threadIdx.x); ++j) local += sd[j] == d;
  pos[i] = hist[chunks * W1 + d] + hist[int64_t(blockIdx.x) * W1 + d] + local;
}

__global__ void pack_rows(const int32_t* slot, const int64_t* pos, const uint16_t* h, const float* w, int64_t K,
                          int64_t units, int64_t row_units, uint8_t* send) {
  const int64_t i = blockIdx.x;
  const int64_t at = pos[i];
  if (at < 0) return;
  uint8_t* r = send + at * (8 + row_units) * 2;  // 16 header bytes = 8 units
  if (threadIdx.x == 0) {
    int32_t* hdr = reinterpret_cast<int32_t*>(r);
    hdr[0] = slot[i];
    hdr[1] = __float_as_int(w[i]);
    hdr[2] = 0, hdr[3] = 0;
  }
  const uint16_t* src = h + (i / K) * units;
  uint16_t* dst = reinterpret_cast<uint16_t*>(r + 16);
  for (int64_t u = threadIdx.x; u < row_units; u += blockDim.x) dst[u] = u < units ? src[u] : uint16_t(0);
}

__global__ void unpack_rows(EpTableView t, const uint8_t* recv, int64_t units, int64_t row_units, uint16_t* x,
                            int32_t* logical, float* weight, unsigned long long* bad) {
  const int64_t j = blockIdx.x;
  const uint8_t* r = recv + j * (8 + row_units) * 2;
  if (threadIdx.x == 0) {
    const int32_t* hdr = reinterpret_cast<const int32_t*>(r);
    const int32_t s = hdr[0];
    const bool ok = s >= 0 && s < t.slots;
    logical[j] = ok ? t.slot_logical[s] : -1;
    weight[j] = __int_as_float(hdr[1]);
    if (!ok) atomicAdd(bad, 1ull);
  }
  const uint16_t* src = reinterpret_cast<const uint16_t*>(r + 16);
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) x[j * units + u] = src[u];
}

__global__ void gather_f32(const float* ye, const int64_t* index, int64_t dim, float* out) {
  const int64_t j = blockIdx.x, s = index[j];
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) out[j * dim + d] = s < 0 ? 0.f : ye[s * dim + d];
}

void check_table(const EpTableView& t, const char* who) {
  if (t.ranks < 1 || t.ranks > kMaxRanks) DI_THROW(InvalidArgument, who, ": table.ranks ", t.ranks, " outside [1, ", kMaxRanks, "]");
  if (t.slots < 1 || t.experts < 1) DI_THROW(InvalidArgument, who, ": table.slots / table.experts must be >= 1");
  if (!t.local_phys || !t.rep_off || !t.reps || !t.slot_logical) DI_THROW(InvalidArgument, who, ": table pointer missing");
}
int64_t units_of(int64_t dim, DType act) { return dim * int64_t(dtype_bits(act) / 8) / 2; }

}  // namespace

int64_t ep_plan_scratch(int64_t pairs, int32_t ranks) {
  return ((pairs + kEpChunk - 1) / kEpChunk + 1) * int64_t(ranks + 1);
}

void ep_plan(const EpPlanParams& p, cudaStream_t st) {
  check_table(p.table, "ep_plan");
  if (p.tokens < 0 || p.topk < 1) DI_THROW(InvalidArgument, "ep_plan: tokens ", p.tokens, " / topk ", p.topk, " out of range");
  if (!p.counts) DI_THROW(InvalidArgument, "ep_plan: counts missing");
  const int64_t P = p.tokens * p.topk, W1 = p.table.ranks + 1;
  if (P == 0) {
    DI_CUDA_CHECK(cudaMemsetAsync(p.counts, 0, size_t(W1) * 8, st));
    return;
  }
  if (!p.ids || !p.dest || !p.slot || !p.pos || !p.scratch) DI_THROW(InvalidArgument, "ep_plan: ids/dest/slot/pos/scratch missing");
  const int64_t chunks = (P + kEpChunk - 1) / kEpChunk;
  plan_hist<<<unsigned(chunks), kEpChunk, size_t(W1) * 4, st>>>(p.table, p.ids, P, p.topk, p.dest, p.slot, p.scratch);
  DI_CUDA_CHECK_LAUNCH();
  plan_scan<<<1, 256, 0, st>>>(p.scratch, chunks, int(W1), p.counts);
  DI_CUDA_CHECK_LAUNCH();
  plan_pos<<<unsigned(chunks), kEpChunk, 0, st>>>(p.dest, P, p.scratch, chunks, int(W1), p.pos);
  DI_CUDA_CHECK_LAUNCH();
}

void ep_pack(const EpPackParams& p, cudaStream_t st) {
  const int64_t rb = ep_row_bytes(p.dim, p.act);  // validates dim and act
  const int64_t P = p.tokens * p.topk;
  if (P == 0) return;
  if (!p.slot || !p.pos || !p.h || !p.weights || !p.send) DI_THROW(InvalidArgument, "ep_pack: slot/pos/h/weights/send missing");
  pack_rows<<<unsigned(P), 128, 0, st>>>(p.slot, p.pos, static_cast<const uint16_t*>(p.h), p.weights, p.topk,
                                         units_of(p.dim, p.act), (rb - 16) / 2, p.send);
  DI_CUDA_CHECK_LAUNCH();
}

void ep_unpack(const EpUnpackParams& p, cudaStream_t st) {
  const int64_t rb = ep_row_bytes(p.dim, p.act);
  check_table(p.table, "ep_unpack");
  if (p.rows == 0) return;
  if (!p.recv || !p.x || !p.logical || !p.weight || !p.bad) DI_THROW(InvalidArgument, "ep_unpack: recv/x/logical/weight/bad missing");
  unpack_rows<<<unsigned(p.rows), 128, 0, st>>>(p.table, p.recv, units_of(p.dim, p.act), (rb - 16) / 2,
                                                static_cast<uint16_t*>(p.x), p.logical, p.weight,
                                                reinterpret_cast<unsigned long long*>(p.bad));
  DI_CUDA_CHECK_LAUNCH();
}

void ep_gather_f32(const float* ye, const int64_t* index, int64_t rows, int64_t dim, float* out, cudaStream_t st) {
  if (rows == 0) return;
  if (!ye || !index || !out || dim < 1) DI_THROW(InvalidArgument, "ep_gather_f32: ye/index/out missing or dim < 1");
  gather_f32<<<unsigned(rows), 128, 0, st>>>(ye, index, dim, out);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::model::ds::cuda
