// A per-row stand-in for the experts in ep_device_test: y[j] = w_j * x[src_j] * (1 + e_j / 8)
// + e_j / 1000 in f32 with explicit roundings (no contraction), so any row sent to the wrong
// rank, slot or weight changes the result, and one rank and the exchange compute the same bits.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer::model::ds::test {

__global__ void fake_expert_kernel(const void* x, int bf16, const int64_t* src, const int32_t* e, const float* w,
                                   int64_t D, float* y) {
  const int64_t j = blockIdx.x, row = src ? src[j] : j;
  const float scale = __fadd_rn(1.f, __fmul_rn(0.125f, float(e[j]))), bias = __fmul_rn(0.001f, float(e[j]));
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v;
    if (bf16) {
      const uint16_t b = static_cast<const uint16_t*>(x)[row * D + d];
      v = __uint_as_float(uint32_t(b) << 16);
    } else {
      v = static_cast<const float*>(x)[row * D + d];
    }
    y[j * D + d] = __fadd_rn(__fmul_rn(__fmul_rn(w[j], v), scale), bias);
  }
}

void fake_expert(const void* x, bool bf16, const int64_t* src, const int32_t* e, const float* w, int64_t rows,
                 int64_t D, float* y, cudaStream_t st) {
  if (rows > 0) fake_expert_kernel<<<unsigned(rows), 64, 0, st>>>(x, bf16 ? 1 : 0, src, e, w, D, y);
}

}  // namespace deepinfer::model::ds::test
