// Quantisation numerics of the DeepSeek reference ("production" mode), spec §3.3/§3.4/§11:
//  * fp8_round_trip: the cached KV's non-rope dims (and compressed entries) go through an FP8
//    e4m3 round trip in blocks of 64 along the row, scale = amax/448 (amax floored at 1e-4),
//    snapped up to a power of two when pow2_scale (ue8m0, the release setting); x ← e4m3(x/s)·s.
//  * fp4_round_trip: e2m1 in blocks of 32, scale = pow2ceil(amax/6) (amax floored at 6·2^-126);
//    with `hadamard`, each row of 128 is first rotated by the normalised Walsh–Hadamard matrix
//    (H_128/√128, Sylvester order) and rounded to the tensor's dtype, as the indexer does for q/k.
//  * dequant_fp8_blockwise: checkpoint FP8 weights (128×128 blocks, e8m0 or f32 scales) → bf16.
// Rounding: RNE with saturation (core/numeric.h encoders). pow2ceil is exact (frexp), where the
// reference computes 2^ceil(log2 s) in fp32; the two differ only for s within ~1e-7 relative
// above a power of two, where the reference's clamp to ±max then absorbs the difference.
// The exact (parity) mode simply does not call these.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

struct Fp8RoundTripParams {
  void* x = nullptr;           // [rows, >= quant_dims] in place; row stride (elements)
  DType dtype = DType::kBF16;
  int64_t row_stride = 0;
  int64_t rows = 0;
  int64_t quant_dims = 448;    // leading dims rounded (head_dim - rope_dim); multiple of block
  int block = 64;              // multiple of 32, <= 1024
  bool pow2_scale = true;
};

struct Fp4RoundTripParams {
  void* x = nullptr;           // [rows, dim] in place; row stride (elements)
  DType dtype = DType::kBF16;
  int64_t row_stride = 0;
  int64_t rows = 0;
  int64_t dim = 128;           // multiple of 32; must be 128 with hadamard
  bool hadamard = true;
};

struct Fp8DequantParams {
  const uint8_t* w = nullptr;  // [N, K] e4m3 bytes, row-major
  const void* scale = nullptr; // [ceil(N/128), ceil(K/128)] e8m0 bytes or f32
  DType scale_dtype = DType::kE8M0;
  void* out = nullptr;         // [N, K] bf16
  int64_t N = 0, K = 0;
};

// Activation quantisation for the block-scaled FP8 GEMM (gemm.h gemm_fp8_block), as the
// reference's act_quant before every FP8 linear: blocks of 128 along K, scale = amax/448 (amax
// floored at 1e-4), pow2-ceiled when pow2_scale; q = e4m3(clamp(x/scale)). Scales are written
// [K/128, scale_stride] with the token index contiguous: the layout cuBLASLt's VEC128_32F mode
// reads for the activation operand (found on the H200: the [M, K/128] layout gives wrong results).
struct Fp8ActQuantParams {
  const void* x = nullptr;     // [M, K] bf16 or f32, row stride ldx
  DType dtype = DType::kBF16;
  int64_t ldx = 0;
  uint8_t* q = nullptr;        // [M, K] e4m3, contiguous
  float* scale = nullptr;      // [K/128, scale_stride] f32, element (k-block b, row r) at b*scale_stride + r
  int64_t scale_stride = 0;    // >= M (0 = M); the GEMM reads it as its M, so pad both together
  int64_t M = 0, K = 0;        // K multiple of 128
  bool pow2_scale = true;
};

// e8m0 scale bytes -> f32 (the checkpoint's [ceil(N/128), ceil(K/128)] weight scales, once at load).
void e8m0_scales_to_f32(const uint8_t* in, float* out, int64_t n, cudaStream_t stream);
void quantize_fp8_act(const Fp8ActQuantParams& p, cudaStream_t stream);

void fp8_round_trip(const Fp8RoundTripParams& p, cudaStream_t stream);
void fp4_round_trip(const Fp4RoundTripParams& p, cudaStream_t stream);
void dequant_fp8_blockwise(const Fp8DequantParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
