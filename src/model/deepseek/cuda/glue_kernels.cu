#include "model/deepseek/cuda/glue_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"

namespace deepinfer::model::ds::cuda {
using ops::cpu::DecodePoolArgs;
using ops::cpu::GatherRowsArgs;
using ops::cpu::MoeCombineArgs;
using ops::cpu::PositionBiasArgs;
namespace {
using deepinfer::cuda::ceil_div;

constexpr int kThreads = 256;


template <typename S, typename D>
__global__ void gather_rows_kernel(const __grid_constant__ GatherRowsArgs p) {
  for (int64_t i = blockIdx.x; i < p.rows; i += gridDim.x) {
    const int64_t si = p.src_index ? p.src_index[i] : i;
    const S* src = si >= 0 ? static_cast<const S*>(p.src_a) + si * p.a_stride
                           : static_cast<const S*>(p.src_b) + (-si - 1) * p.b_stride;
    const int64_t di = p.dst_index ? p.dst_index[i] : i;
    if (di < 0) continue;  // skipped row (block-uniform)
    D* dst = static_cast<D*>(p.dst) + di * p.dst_stride;
    for (int64_t e = threadIdx.x; e < p.width; e += blockDim.x)
      dst[e] = deepinfer::cuda::from_f32<D>(deepinfer::cuda::to_f32(src[e]));
  }
}

__global__ void position_bias_kernel(const __grid_constant__ PositionBiasArgs p) {
  for (int64_t t = blockIdx.x; t < p.rows; t += gridDim.x) {
    const float* b = p.bias + (p.pos[t] % p.m) * p.width;
    float* z = p.z + t * p.z_stride;
    for (int64_t e = threadIdx.x; e < p.width; e += blockDim.x) z[e] += b[e];
  }
}

__global__ void moe_combine_kernel(const __grid_constant__ MoeCombineArgs p) {
  for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int64_t* r = p.rows + t * p.topk;
    for (int64_t e = threadIdx.x; e < p.dim; e += blockDim.x) {
      float acc = 0.f;
      for (int64_t k = 0; k < p.topk; ++k)
        if (r[k] >= 0) acc += p.ye[r[k] * p.dim + e];
      if (p.shared) acc += p.shared[t * p.dim + e];
      p.out[t * p.dim + e] = acc;
    }
  }
}

// One thread per (token, output dim); the same loops and order as compressor_pool_kernel.
__global__ void decode_pool_kernel(const __grid_constant__ DecodePoolArgs p, int64_t d) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, t = blockIdx.y;
  const int64_t b = p.block[t];
  if (e >= d || b < 0) return;
  const int64_t m = p.ratio, ld = p.ld, row0 = p.overlap ? m * (b - 1) : m * b;
  const float* a = p.stage + t * p.rows_per_token * ld;
  const float* z = a + p.width;
  const int64_t a_first = p.overlap ? max(m * (b - 1), int64_t(0)) : 0;
  const int64_t a_count = p.overlap ? m * b - a_first : 0;
  const int64_t b_col = p.overlap ? d : 0;
  float mx = -INFINITY;
  for (int64_t s = a_first; s < a_first + a_count; ++s) mx = fmaxf(mx, z[(s - row0) * ld + e]);
  for (int64_t s = m * b; s < m * b + m; ++s) mx = fmaxf(mx, z[(s - row0) * ld + b_col + e]);
  float sum = 0.f, acc = 0.f;
  for (int64_t s = a_first; s < a_first + a_count; ++s) {
    const int64_t i = (s - row0) * ld + e;
    const float w = expf(z[i] - mx);
    sum += w;
    acc += w * a[i];
  }
  for (int64_t s = m * b; s < m * b + m; ++s) {
    const int64_t i = (s - row0) * ld + b_col + e;
    const float w = expf(z[i] - mx);
    sum += w;
    acc += w * a[i];
  }
  p.out[t * d + e] = acc / sum;
}

unsigned grid_for(int64_t rows) { return unsigned(rows < 65535 * 16 ? rows : 65535 * 16); }

template <typename S, typename D>
void launch_gather(const GatherRowsArgs& p, cudaStream_t stream) {
  gather_rows_kernel<S, D><<<grid_for(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gather_rows(const GatherRowsArgs& p, cudaStream_t stream) {
  ops::cpu::validate_gather_rows(p);
  if (p.rows == 0 || p.width == 0) return;
  const bool s32 = p.src_dtype == DType::kF32, d32 = p.dst_dtype == DType::kF32;
  if (s32 && d32) launch_gather<float, float>(p, stream);
  else if (s32) launch_gather<float, __nv_bfloat16>(p, stream);
  else if (d32) launch_gather<__nv_bfloat16, float>(p, stream);
  else launch_gather<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

void add_position_bias(const PositionBiasArgs& p, cudaStream_t stream) {
  if (p.rows < 0 || p.width < 0 || p.m <= 0)
    DI_THROW(InvalidArgument, "add_position_bias: bad shape rows=", p.rows, " width=", p.width, " m=", p.m);
  if (p.rows == 0 || p.width == 0) return;
  if (!p.z || !p.bias || !p.pos) DI_THROW(InvalidArgument, "add_position_bias: null z, bias or pos");
  if (p.z_stride < p.width) DI_THROW(InvalidArgument, "add_position_bias: z_stride ", p.z_stride, " < width ", p.width);
  position_bias_kernel<<<grid_for(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void moe_combine(const MoeCombineArgs& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.topk < 0 || p.dim <= 0)
    DI_THROW(InvalidArgument, "moe_combine: bad shape tokens=", p.tokens, " topk=", p.topk, " dim=", p.dim);
  if (p.tokens == 0) return;
  if (!p.out || (p.topk > 0 && (!p.ye || !p.rows))) DI_THROW(InvalidArgument, "moe_combine: null ye, rows or out");
  moe_combine_kernel<<<grid_for(p.tokens), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void decode_pool(const DecodePoolArgs& p, cudaStream_t stream) {
  ops::cpu::validate_decode_pool(p);
  if (p.tokens == 0) return;
  if (p.tokens > 65535) DI_THROW(InvalidArgument, "decode_pool: ", p.tokens, " tokens > 65535");
  const int64_t d = p.overlap ? p.width / 2 : p.width;
  decode_pool_kernel<<<dim3(unsigned(ceil_div(d, 128)), unsigned(p.tokens)), 128, 0, stream>>>(p, d);
  DI_CUDA_CHECK_LAUNCH();
}

namespace {
__global__ void add_streams_kernel(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) {
  for (int64_t r = blockIdx.x; r < tokens * streams; r += gridDim.x) {
    const float* vt = v + (r / streams) * dim;
    float* xr = x + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += vt[i];
  }
}
}  // namespace

void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim, cudaStream_t stream) {
  if (tokens < 0 || streams <= 0 || dim <= 0)
    DI_THROW(InvalidArgument, "add_streams: bad shape tokens=", tokens, " streams=", streams, " dim=", dim);
  if (tokens == 0) return;
  if (!x || !v) DI_THROW(InvalidArgument, "add_streams: null x or v");
  add_streams_kernel<<<grid_for(tokens * streams), kThreads, 0, stream>>>(x, v, tokens, streams, dim);
  DI_CUDA_CHECK_LAUNCH();
}

namespace {
__global__ void stream_mean_kernel(const float* x, float* out, int64_t out_stride, int64_t tokens, int64_t streams,
                                   int64_t dim) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x)
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
      float s = 0.f;
      for (int64_t k = 0; k < streams; ++k) s = __fadd_rn(s, x[(t * streams + k) * dim + c]);
      out[t * out_stride + c] = __fdiv_rn(s, float(streams));
    }
}
}  // namespace

void stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens, int64_t streams, int64_t dim,
                 cudaStream_t stream) {
  if (tokens < 0 || streams <= 0 || dim <= 0 || out_stride < dim)
    DI_THROW(InvalidArgument, "stream_mean: bad shape tokens=", tokens, " streams=", streams, " dim=", dim,
             " out_stride=", out_stride);
  if (tokens == 0) return;
  if (!x || !out) DI_THROW(InvalidArgument, "stream_mean: null x or out");
  stream_mean_kernel<<<grid_for(tokens), kThreads, 0, stream>>>(x, out, out_stride, tokens, streams, dim);
  DI_CUDA_CHECK_LAUNCH();
}

namespace {
__global__ void patch_input_kernel(const __grid_constant__ ops::cpu::InputPatchArgs p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.count) return;
  const int64_t t = p.patch[2 * i];
  const int32_t id = p.sampled[p.patch[2 * i + 1]];
  p.token_ids[t] = id;
  for (int64_t j = 0; j < p.n_streams; ++j) p.embed_src[t * p.n_streams + j] = id;
}
}  // namespace

void patch_input_tokens(const ops::cpu::InputPatchArgs& p, cudaStream_t stream) {
  ops::cpu::validate_input_patch(p);
  if (p.count == 0) return;
  patch_input_kernel<<<unsigned(ceil_div(p.count, 128)), 128, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::model::ds::cuda

namespace deepinfer::model::ds::cuda {
namespace {
// One block per row: argmax (lowest id on ties, as std::max_element) then Σ exp(l - max) in fp64,
// in a fixed order (per-thread strided sums, then a tree), so results do not depend on the run.
__global__ void greedy_rows_kernel(const float* logits, int64_t stride, int64_t vocab, int32_t* tokens,
                                   float* logprobs) {
  __shared__ float best_v[kThreads];
  __shared__ int64_t best_i[kThreads];
  __shared__ double sums[kThreads];
  const float* row = logits + int64_t(blockIdx.x) * stride;
  float bv = -INFINITY;
  int64_t bi = vocab;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    if (row[v] > bv || (bi == vocab && !(row[v] < bv))) bv = row[v], bi = v;  // strided: first max per thread
  best_v[threadIdx.x] = bv, best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) {
      const float ov = best_v[threadIdx.x + s];
      const int64_t oi = best_i[threadIdx.x + s];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]))
        best_v[threadIdx.x] = ov, best_i[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  const double mx = double(best_v[0]);
  double sum = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) sum += exp(double(row[v]) - mx);
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = int32_t(best_i[0] < vocab ? best_i[0] : 0);
    logprobs[blockIdx.x] = float(-log(sums[0]));
  }
}
}  // namespace

void greedy_rows(const float* logits, int64_t row_stride, int64_t rows, int64_t vocab, int32_t* tokens,
                 float* logprobs, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || row_stride < vocab)
    DI_THROW(InvalidArgument, "greedy_rows: bad shape rows=", rows, " vocab=", vocab, " row_stride=", row_stride);
  if (rows == 0) return;
  if (!logits || !tokens || !logprobs) DI_THROW(InvalidArgument, "greedy_rows: null logits, tokens or logprobs");
  if (rows > 65535) DI_THROW(InvalidArgument, "greedy_rows: ", rows, " rows > 65535");
  greedy_rows_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, row_stride, vocab, tokens, logprobs);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::model::ds::cuda
