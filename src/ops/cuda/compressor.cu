#include "ops/cuda/common.cuh"
#include "ops/cuda/compressor.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::ceil_div;
constexpr int kThreads = 128;

// One thread per (block, dim): threads of a warp read consecutive columns of the same rows.
__global__ void __launch_bounds__(kThreads) compressor_pool_kernel(const __grid_constant__ CompressorPoolParams p,
                                                                   int64_t d, int64_t ld) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= d) return;
  const int64_t b = p.first_block + blockIdx.y, m = p.ratio;
  // Slot ranges as (first token, count, column offset); absent A-slots (token < 0) are skipped.
  const int64_t a_first = p.overlap ? max(m * (b - 1), int64_t(0)) : 0;
  const int64_t a_count = p.overlap ? m * b - a_first : 0;
  const int64_t b_col = p.overlap ? d : 0;
  float mx = -INFINITY;
  for (int64_t t = a_first; t < a_first + a_count; ++t) mx = fmaxf(mx, p.z[(t - p.row0) * ld + e]);
  for (int64_t t = m * b; t < m * b + m; ++t) mx = fmaxf(mx, p.z[(t - p.row0) * ld + b_col + e]);
  float sum = 0.f, acc = 0.f;
  for (int64_t t = a_first; t < a_first + a_count; ++t) {
    const int64_t i = (t - p.row0) * ld + e;
    const float w = expf(p.z[i] - mx);
    sum += w;
    acc += w * p.a[i];
  }
  for (int64_t t = m * b; t < m * b + m; ++t) {
    const int64_t i = (t - p.row0) * ld + b_col + e;
    const float w = expf(p.z[i] - mx);
    sum += w;
    acc += w * p.a[i];
  }
  p.out[int64_t(blockIdx.y) * d + e] = acc / sum;
}
}  // namespace

void compressor_pool(const CompressorPoolParams& p, cudaStream_t stream) {
  if (p.ratio <= 0 || p.width <= 0 || (p.overlap && p.width % 2))
    DI_THROW(InvalidArgument, "compressor_pool: ratio ", p.ratio, " / width ", p.width, " invalid");
  if (!p.a || !p.z || !p.out) DI_THROW(InvalidArgument, "compressor_pool: null a, z or out");
  const int64_t ld = p.row_stride ? p.row_stride : p.width;
  if (ld < p.width) DI_THROW(InvalidArgument, "compressor_pool: row_stride ", ld, " < width ", p.width);
  if (p.n_blocks < 0 || p.first_block < 0) DI_THROW(InvalidArgument, "compressor_pool: negative block range");
  if (p.n_blocks == 0) return;
  // Every block's tokens must be present (blocks are consecutive: check the two ends).
  const int64_t m = p.ratio, b0 = p.first_block, b1 = p.first_block + p.n_blocks - 1;
  const int64_t lo = std::max<int64_t>(p.overlap ? m * (b0 - 1) : m * b0, 0), hi = m * b1 + m;
  if (lo < p.row0 || hi > p.row0 + p.n_rows)
    DI_THROW(InvalidArgument, "compressor_pool: blocks ", b0, "..", b1, " need tokens [", lo, ",", hi,
             ") but rows cover [", p.row0, ",", p.row0 + p.n_rows, ")");
  if (p.n_blocks > 65535) DI_THROW(InvalidArgument, "compressor_pool: ", p.n_blocks, " blocks > 65535 per launch");
  const int64_t d = p.overlap ? p.width / 2 : p.width;
  compressor_pool_kernel<<<dim3(unsigned(ceil_div(d, kThreads)), unsigned(p.n_blocks)), kThreads, 0, stream>>>(p, d, ld);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
