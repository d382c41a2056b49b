#include "model/deepseek_v4/cuda/glue_kernels.h"

#include <cuda_bf16.h>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"

namespace deepinfer::model::v4::gpu {
namespace {
using deepinfer::cuda::ceil_div;

constexpr int kThreads = 256;

bool float_dtype(DType d) { return d == DType::kF32 || d == DType::kBF16; }

template <typename S, typename D>
__global__ void gather_rows_kernel(const __grid_constant__ GatherRowsParams p) {
  for (int64_t i = blockIdx.x; i < p.rows; i += gridDim.x) {
    const int64_t si = p.src_index ? p.src_index[i] : i;
    const S* src = si >= 0 ? static_cast<const S*>(p.src_a) + si * p.a_stride
                           : static_cast<const S*>(p.src_b) + (-si - 1) * p.b_stride;
    const int64_t di = p.dst_index ? p.dst_index[i] : i;
    D* dst = static_cast<D*>(p.dst) + di * p.dst_stride;
    for (int64_t e = threadIdx.x; e < p.width; e += blockDim.x)
      dst[e] = deepinfer::cuda::from_f32<D>(deepinfer::cuda::to_f32(src[e]));
  }
}

__global__ void position_bias_kernel(const __grid_constant__ PositionBiasParams p) {
  for (int64_t t = blockIdx.x; t < p.rows; t += gridDim.x) {
    const float* b = p.bias + (p.pos[t] % p.m) * p.width;
    float* z = p.z + t * p.z_stride;
    for (int64_t e = threadIdx.x; e < p.width; e += blockDim.x) z[e] += b[e];
  }
}

__global__ void moe_combine_kernel(const __grid_constant__ MoeCombineParams p) {
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

unsigned grid_for(int64_t rows) { return unsigned(rows < 65535 * 16 ? rows : 65535 * 16); }

template <typename S, typename D>
void launch_gather(const GatherRowsParams& p, cudaStream_t stream) {
  gather_rows_kernel<S, D><<<grid_for(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

float load_host(const void* base, DType dt, int64_t idx) {
  return dt == DType::kF32 ? static_cast<const float*>(base)[idx] : bf16_to_f32(static_cast<const uint16_t*>(base)[idx]);
}
void store_host(void* base, DType dt, int64_t idx, float v) {
  if (dt == DType::kF32)
    static_cast<float*>(base)[idx] = v;
  else
    static_cast<uint16_t*>(base)[idx] = f32_to_bf16(v);
}

void validate_gather(const GatherRowsParams& p) {
  if (p.rows < 0 || p.width < 0) DI_THROW(InvalidArgument, "gather_rows: bad shape rows=", p.rows, " width=", p.width);
  if (!float_dtype(p.src_dtype) || !float_dtype(p.dst_dtype))
    DI_THROW(InvalidArgument, "gather_rows: dtypes ", dtype_name(p.src_dtype), " -> ", dtype_name(p.dst_dtype),
             " (f32 or bf16 only)");
  if (p.rows == 0 || p.width == 0) return;
  if (!p.src_a || !p.dst) DI_THROW(InvalidArgument, "gather_rows: null src_a or dst");
  if (p.a_stride < p.width || p.dst_stride < p.width || (p.src_b && p.b_stride < p.width))
    DI_THROW(InvalidArgument, "gather_rows: row strides (a ", p.a_stride, ", b ", p.b_stride, ", dst ", p.dst_stride,
             ") < width ", p.width);
}
}  // namespace

void gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  validate_gather(p);
  if (p.rows == 0 || p.width == 0) return;
  const bool s32 = p.src_dtype == DType::kF32, d32 = p.dst_dtype == DType::kF32;
  if (s32 && d32) launch_gather<float, float>(p, stream);
  else if (s32) launch_gather<float, __nv_bfloat16>(p, stream);
  else if (d32) launch_gather<__nv_bfloat16, float>(p, stream);
  else launch_gather<__nv_bfloat16, __nv_bfloat16>(p, stream);
}

void add_position_bias(const PositionBiasParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.width < 0 || p.m <= 0)
    DI_THROW(InvalidArgument, "add_position_bias: bad shape rows=", p.rows, " width=", p.width, " m=", p.m);
  if (p.rows == 0 || p.width == 0) return;
  if (!p.z || !p.bias || !p.pos) DI_THROW(InvalidArgument, "add_position_bias: null z, bias or pos");
  if (p.z_stride < p.width) DI_THROW(InvalidArgument, "add_position_bias: z_stride ", p.z_stride, " < width ", p.width);
  position_bias_kernel<<<grid_for(p.rows), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens < 0 || p.topk < 0 || p.dim <= 0)
    DI_THROW(InvalidArgument, "moe_combine: bad shape tokens=", p.tokens, " topk=", p.topk, " dim=", p.dim);
  if (p.tokens == 0) return;
  if (!p.out || (p.topk > 0 && (!p.ye || !p.rows))) DI_THROW(InvalidArgument, "moe_combine: null ye, rows or out");
  moe_combine_kernel<<<grid_for(p.tokens), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void gather_rows_host(const GatherRowsParams& p) {
  validate_gather(p);
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t si = p.src_index ? p.src_index[i] : i;
    const bool a = si >= 0;
    const int64_t row = a ? si : -si - 1;
    const void* src = a ? p.src_a : p.src_b;
    const int64_t stride = a ? p.a_stride : p.b_stride;
    const int64_t di = p.dst_index ? p.dst_index[i] : i;
    for (int64_t e = 0; e < p.width; ++e)
      store_host(p.dst, p.dst_dtype, di * p.dst_stride + e, load_host(src, p.src_dtype, row * stride + e));
  }
}

void add_position_bias_host(const PositionBiasParams& p) {
  for (int64_t t = 0; t < p.rows; ++t)
    for (int64_t e = 0; e < p.width; ++e) p.z[t * p.z_stride + e] += p.bias[(p.pos[t] % p.m) * p.width + e];
}

void moe_combine_host(const MoeCombineParams& p) {
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t e = 0; e < p.dim; ++e) {
      float acc = 0.f;
      for (int64_t k = 0; k < p.topk; ++k) {
        const int64_t r = p.rows[t * p.topk + k];
        if (r >= 0) acc += p.ye[r * p.dim + e];
      }
      if (p.shared) acc += p.shared[t * p.dim + e];
      p.out[t * p.dim + e] = acc;
    }
}

}  // namespace deepinfer::model::v4::gpu
