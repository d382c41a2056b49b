#include "ops/cuda/attention_mma.h"

#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>

#include "ops/cuda/common.cuh"

namespace deepinfer::ops::cuda::detail {
namespace {

// Compile-time shape of the kernel (V4: 64 query heads x 512-wide latent, MQA). Two tilings:
// 32 keys x 3 stages (more, smaller splits: small batches) and 64 keys x 2 stages (Q fragments
// reloaded from shared memory once per 64 keys instead of per 32; 4 independent accumulator chains
// per warp in Q K^T). Both read a tile's compressed row ids from global memory one tile early,
// while the tensor cores work, and keep them in shared memory as row pointers: the first version
// read them when it issued the tile, a dependent global load that every tile waited for (68 vs
// 95 µs at b=128, docs/PERFORMANCE.md).
template <int kKeysT, int kStagesT>
struct Traits {
  static constexpr int kHeads = 64;                 // M: query heads per block
  static constexpr int kDim = 512;                  // head_dim: K of Q K^T, N of P V
  static constexpr int kKeys = kKeysT;              // keys per tile
  static constexpr int kStages = kStagesT;          // key tiles in flight (cp.async groups)
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kDim * 2 / 16;     // 16-byte chunks per bf16 row (64)
  static constexpr int kPStride = kKeys + 8;        // bf16 per P row: +16 bytes, conflict-free ldmatrix
  static constexpr int kColsPerWarp = kDim / kWarps;  // P V: output columns per warp (64)
  static constexpr int kKeyTilesPerWarp = kKeys / 16;  // Q K^T: n-tiles of 8 keys per warp (key half)
  static_assert(kHeads == 4 * 16 && kKeys % 32 == 0, "S = Q K^T is tiled 4 row groups x 2 key halves");
  static_assert(kThreads % kChunks == 0 && kKeys % (kThreads / kChunks) == 0, "tile copy mapping");
};

// Shared memory. q and k rows are 1024 bytes with the 16-byte chunk index XORed by (row & 7), so
// the 8 row addresses of each ldmatrix hit 8 different bank groups.
template <class Tr>
struct Smem {
  uint16_t q[Tr::kHeads * Tr::kDim];                // [64][512] bf16, swizzled
  uint16_t k[Tr::kStages][Tr::kKeys * Tr::kDim];    // [stage][keys][512] bf16, swizzled (K = V)
  uint16_t p[Tr::kHeads * Tr::kPStride];            // [64][keys + 8] bf16: this tile's probabilities
  float row_max[2][Tr::kHeads];                     // per key half: tile row maxima (log2 domain)
  float corr[Tr::kHeads];                           // per row: rescale of O for this tile
  float m[Tr::kHeads];                              // final row max (log2 domain)
  float l[2][Tr::kHeads];                           // final row sums, per key half
  int valid[Tr::kStages][Tr::kKeys];                // key present (in the list, id >= 0)
  const uint16_t* kptr[Tr::kStages][Tr::kKeys];     // row pointers of the tiles to issue next
};

constexpr int kDim = 512, kChunks = 64, kThreads = 256;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][512] bf16 buffer.
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row * (kDim * 2) + ((chunk ^ (row & 7)) << 4));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 zero-fills the chunk: absent keys read as 0, never as stale shared memory.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c += a · b, m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Where key j of this block's token lives; j < wc: window row wb + j, else compressed row rows[j - wc].
struct KeyList {
  const uint16_t* win;
  const uint16_t* cmp;
  const int32_t* rows;  // cmp_rows + cmp_offset[t]
  int64_t stride;
  int wb, wc;
  // Key j's row in two steps, so the id load overlaps other work: fetch() issues it (0 for window
  // keys and past `last`), resolve() turns it into the row pointer (nullptr: absent).
  __device__ int32_t fetch(int j, int last) const { return (j < last && j >= wc) ? rows[j - wc] : 0; }
  __device__ const uint16_t* resolve(int j, int last, int32_t id) const {
    if (j >= last) return nullptr;
    if (j < wc) return win + int64_t(wb + j) * stride;
    return id >= 0 ? cmp + int64_t(id) * stride : nullptr;
  }
};

// Gathers one tile of keys into stage buffer `kbuf` from row pointers in shared memory (nullptr:
// absent, zero-filled), one cp.async group's worth (the caller commits). Thread tid copies chunk
// tid % 64 of rows tid / 64 + 4i.
template <int kKeys>
__device__ __forceinline__ void issue_keys(const uint16_t* const* ptrs, const uint16_t* dummy, uint32_t kbuf, int* valid) {
  constexpr int kRowsPerPass = kThreads / kChunks;  // 4
  const int ch = threadIdx.x % kChunks;
#pragma unroll
  for (int i = 0; i < kKeys / kRowsPerPass; ++i) {
    const int r = int(threadIdx.x) / kChunks + kRowsPerPass * i;
    const uint16_t* row = ptrs[r];
    cp_async16(kbuf + swz(r, ch), row ? row + ch * 8 : dummy, row != nullptr);
    if (ch == 0) valid[r] = row != nullptr;
  }
}

// S = Q K^T for this warp's 16 rows x kKeys/2 keys over d = 512: sc[n-tile][c-fragment].
template <int kNT>
__device__ __forceinline__ void qk_tile(uint32_t qbuf, uint32_t kbuf, int rg, int kh, float (&sc)[kNT][4]) {
  const int lane = threadIdx.x % 32;
  const int a_row = 16 * rg + (lane % 8) + ((lane / 8) % 2) * 8, a_half = lane / 16;
  const int b_row = 8 * kNT * kh + (lane % 8) + (lane / 16) * 8, b_half = (lane / 8) % 2;
#pragma unroll
  for (int i = 0; i < kNT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[i][e] = 0.f;
#pragma unroll 8
  for (int kk = 0; kk < kDim / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(qbuf + swz(a_row, 2 * kk + a_half), a);
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t b[4];
      ldsm_x4(kbuf + swz(b_row + 16 * np, 2 * kk + b_half), b);
      mma_bf16(sc[2 * np], a, b[0], b[1]);
      mma_bf16(sc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// O[64 rows][this warp's 64 columns] += P[64][32] V[32][cols]; V = the key tile.
template <class Tr>
__device__ __forceinline__ void pv_tile(uint32_t pbuf, uint32_t kbuf, int warp, float (&acc)[4][8][4]) {
  using Traits = Tr;
  const int lane = threadIdx.x % 32;
  const int a_row = (lane % 8) + ((lane / 8) % 2) * 8, a_col = (lane / 16) * 8;
  const int v_row = (lane % 8) + ((lane / 8) % 2) * 8, v_half = lane / 16;
#pragma unroll
  for (int ks = 0; ks < Traits::kKeys / 16; ++ks) {
    uint32_t a[4][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
      ldsm_x4(pbuf + uint32_t(((16 * mt + a_row) * Traits::kPStride + 16 * ks + a_col) * 2), a[mt]);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ldsm_x4_trans(kbuf + swz(16 * ks + v_row, warp * (Traits::kColsPerWarp / 8) + 2 * np + v_half), b);
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        mma_bf16(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_bf16(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

template <class Traits, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1) sparse_attn_mma_kernel(const __grid_constant__ SparseAttnParams p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem<Traits>& sm = *reinterpret_cast<Smem<Traits>*>(smem_raw);
  constexpr int kNT = Traits::kKeyTilesPerWarp;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, c = lane % 4;  // mma fragment row / column pair
  const int rg = warp % 4, kh = warp / 4;  // Q K^T: row group, key half
  const int64_t t = blockIdx.x, h0 = int64_t(blockIdx.y) * Traits::kHeads;

  const int wc = p.win_count[t];
  const int cc = p.cmp_count ? p.cmp_count[t] : 0;
  const KeyList kl{static_cast<const uint16_t*>(p.win_kv), static_cast<const uint16_t*>(p.cmp_kv),
                   cc ? p.cmp_rows + p.cmp_offset[t] : nullptr, p.kv_stride, p.win_begin[t], wc};
  const int all = wc + cc;
  const int first = kSplit ? int(blockIdx.z) * p.split_keys : 0;
  const int last = kSplit ? min(all, first + p.split_keys) : all;
  const int ntiles = last > first ? (last - first + Traits::kKeys - 1) / Traits::kKeys : 0;

  const uint32_t qbuf = smem_u32(sm.q), pbuf = smem_u32(sm.p);
  auto kbuf = [&](int s) { return smem_u32(sm.k[s]); };
  {  // Q of the 64 heads joins the first cp.async group.
    const uint16_t* q = static_cast<const uint16_t*>(p.q) + t * p.q_stride + h0 * Traits::kDim;
    const int ch = int(threadIdx.x) % Traits::kChunks;
#pragma unroll
    for (int i = 0; i < Traits::kHeads * Traits::kChunks / Traits::kThreads; ++i) {
      const int r = int(threadIdx.x) / Traits::kChunks + (Traits::kThreads / Traits::kChunks) * i;
      cp_async16(qbuf + swz(r, ch), q + r * Traits::kDim + ch * 8, true);
    }
  }
  constexpr int kS = Traits::kStages, kK = Traits::kKeys;
  const int tid = int(threadIdx.x);
  if (tid < kK)  // row pointers of the first kS tiles (the prologue's and the first refill's)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const int j = first + s * kK + tid;
      sm.kptr[s][tid] = kl.resolve(j, last, kl.fetch(j, last));
    }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < ntiles) issue_keys<kK>(sm.kptr[s], kl.win, kbuf(s), sm.valid[s]);
    cp_async_commit();
  }

  const float scale_log2 = p.scale * 1.4426950408889634f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows 16rg + g and + 8, log2 domain
  float l_part[2] = {0.f, 0.f};             // this thread's share of those rows' sums
  float acc[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<Traits::kStages - 2>();  // this thread's copies of tile `it` landed
    __syncthreads();                        // everyone's; and P V of tile it-1 is done everywhere
    {
      const int nt = it + kS - 1;  // refill the stage tile it-1 used
      if (nt < ntiles) issue_keys<kK>(sm.kptr[nt % kS], kl.win, kbuf(nt % kS), sm.valid[nt % kS]);
      cp_async_commit();
    }
    // Ids of tile it + kS: loaded now, stored as pointers after this tile's math (slot it % kS,
    // whose tile was issued kS - 1 iterations ago); the next top barrier publishes them.
    const int j_next = first + (it + kS) * kK + tid;
    int32_t id_next = 0;
    if (tid < kK) id_next = kl.fetch(j_next, last);
    const int s = it % Traits::kStages;
    const int n_here = min(Traits::kKeys, last - first - it * Traits::kKeys);
    float sc[kNT][4];
    qk_tile<kNT>(qbuf, kbuf(s), rg, kh, sc);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 8 * kNT * kh + 8 * i + 2 * c + (e & 1);
        sc[i][e] = (key < n_here && sm.valid[s][key]) ? sc[i][e] * scale_log2 : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[i][e]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (c == 0) sm.row_max[kh][16 * rg + g + 8 * r] = mx[r];
    }
    __syncthreads();
    // Both key halves of a row compute the same m from the same values: no further exchange.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * rg + g + 8 * r;
      const float m_new = fmaxf(m_run[r], fmaxf(sm.row_max[0][row], sm.row_max[1][row]));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: p = 0, corr = 0 on zeros
      const float corr = exp2f(m_run[r] - m_use);
      l_part[r] *= corr;
#pragma unroll
      for (int i = 0; i < kNT; ++i) {
        const float p0 = exp2f(sc[i][2 * r] - m_use), p1 = exp2f(sc[i][2 * r + 1] - m_use);
        l_part[r] += p0 + p1;
        *reinterpret_cast<uint32_t*>(&sm.p[row * Traits::kPStride + 8 * kNT * kh + 8 * i + 2 * c]) = pack_bf16(p0, p1);
      }
      if (kh == 0 && c == 0) sm.corr[row] = corr;
      m_run[r] = m_new;
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      const float c0 = sm.corr[16 * mt + g], c1 = sm.corr[16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        acc[mt][nt][0] *= c0;
        acc[mt][nt][1] *= c0;
        acc[mt][nt][2] *= c1;
        acc[mt][nt][3] *= c1;
      }
    }
    pv_tile<Traits>(pbuf, kbuf(s), warp, acc);
    if (tid < kK) sm.kptr[it % kS][tid] = kl.resolve(j_next, last, id_next);
  }
  cp_async_wait<0>();  // no copy may still be in flight at exit (the last groups are empty or unused)

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_part[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = 16 * rg + g + 8 * r;
    if (c == 0) {
      sm.l[kh][row] = l;
      if (kh == 0) sm.m[row] = m_run[r];
    }
  }
  __syncthreads();

  const int col0 = warp * Traits::kColsPerWarp + 2 * c;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * mt + g + 8 * r;
      const int64_t h = h0 + row;
      const float m = sm.m[row], l = sm.l[0][row] + sm.l[1][row];
      if constexpr (kSplit) {
        // The combine's units: natural-log max, sums and acc scaled by e^{-m}.
        float* w = p.workspace + ((t * p.num_heads + h) * p.num_splits + blockIdx.z) * (p.head_dim + 2);
        if (warp == 0 && c == 0) {
          w[0] = m == -INFINITY ? -INFINITY : m * 0.6931471805599453f;
          w[1] = l;
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<float2*>(w + 2 + col0 + 8 * nt) = make_float2(acc[mt][nt][2 * r], acc[mt][nt][2 * r + 1]);
      } else {
        // No keys: o = 0 (as the CPU twin). Otherwise the sink joins the denominator at 2^{-m}.
        const bool none = m == -INFINITY;
        const float inv = none ? 0.f : 1.f / (l + exp2f(p.sink[h] * 1.4426950408889634f - m));
        uint16_t* o = static_cast<uint16_t*>(p.out) + t * p.out_stride + h * p.head_dim;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<uint32_t*>(o + col0 + 8 * nt) =
              pack_bf16(acc[mt][nt][2 * r] * inv, acc[mt][nt][2 * r + 1] * inv);
      }
    }
}

using Tile32 = Traits<32, 3>;
using Tile64 = Traits<64, 2>;
static_assert(sizeof(Smem<Tile32>) <= 227 * 1024 && sizeof(Smem<Tile64>) <= 227 * 1024, "one block per SM");

// Keys per tile for p (0: none fits): 64 when the splits allow it, else 32; pinned by p.kernel.
int mma_tile(const SparseAttnParams& p) {
  const bool split = p.num_splits > 1;
  const bool fits32 = !split || p.split_keys % 32 == 0, fits64 = !split || p.split_keys % 64 == 0;
  switch (p.kernel) {
    case AttnKernel::kTensorCoresTile32: return fits32 ? 32 : 0;
    case AttnKernel::kTensorCoresTile64: return fits64 ? 64 : 0;
    default: return fits64 ? 64 : fits32 ? 32 : 0;
  }
}

template <class Tr>
void launch(const SparseAttnParams& p, cudaStream_t stream) {
  const bool split = p.num_splits > 1;
  const size_t smem = sizeof(Smem<Tr>);
  const dim3 grid(unsigned(p.num_tokens), unsigned(p.num_heads / Tr::kHeads), split ? unsigned(p.num_splits) : 1u);
  auto* fn = split ? sparse_attn_mma_kernel<Tr, true> : sparse_attn_mma_kernel<Tr, false>;
  // The shared-memory limit is raised once per (device, variant): a decode step launches this per
  // layer, and the attribute call costs host time comparable to the b=1 kernel.
  static std::atomic<uint64_t> raised[2];
  int dev = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (!bit || !(raised[split].load(std::memory_order_relaxed) & bit)) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised[split].fetch_or(bit, std::memory_order_relaxed);
  }
  fn<<<grid, kThreads, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}
}  // namespace

bool sparse_attention_mma_supports_shape(int64_t num_heads, int64_t head_dim, DType dtype) {
  return dtype == DType::kBF16 && head_dim == kDim && num_heads > 0 && num_heads % Tile32::kHeads == 0;
}

bool sparse_attention_mma_supports(const SparseAttnParams& p) {
  if (!sparse_attention_mma_supports_shape(p.num_heads, p.head_dim, p.dtype) || mma_tile(p) == 0) return false;
  // Output pairs are written as 4-byte bf16x2 and Q rows copied as 16-byte chunks.
  auto aligned = [](const void* q, uintptr_t a) { return (reinterpret_cast<uintptr_t>(q) & (a - 1)) == 0; };
  return aligned(p.q, 16) && p.q_stride % 8 == 0 && aligned(p.out, 4) && p.out_stride % 2 == 0;
}

void sparse_attention_mma(const SparseAttnParams& p, cudaStream_t stream) {
  switch (mma_tile(p)) {
    case 64: launch<Tile64>(p, stream); return;
    default: launch<Tile32>(p, stream); return;
  }
}

}  // namespace deepinfer::ops::cuda::detail
