// V4.1 QAT round trips on the GPU (qat.h). One thread per element; the `block` lanes of a group
// (16 or 32, aligned inside a warp because n is a multiple of the block) reduce the block's amax
// with shuffles, NaN tracked separately (fmaxf drops NaN; the reference's amax keeps it).
// Elements are numbered e = row * n + col, so a group never straddles two rows.
#include "ops/cuda/common.cuh"
#include "ops/cuda/qat.h"

namespace deepinfer::ops::cuda {
namespace {
namespace q = ops::cpu::qat;
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::to_f32;
using ops::cpu::qat_block;
using ops::cpu::qat_code_bytes;
using ops::cpu::qat_is_fp8;
using ops::cpu::qat_packed_row_bytes;

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

// amax of the lane group of `width` lanes (a power of two dividing 32); NaN if any lane had one.
__device__ __forceinline__ float group_amax(float v, int width) {
  float a = fabsf(v);
  int nan = v != v;
  for (int o = width / 2; o > 0; o >>= 1) {
    a = fmaxf(a, __shfl_xor_sync(kFull, a, o));
    nan |= __shfl_xor_sync(kFull, nan, o);
  }
  return nan ? __int_as_float(0x7fc00000) : a;
}

struct Elem {
  int64_t row, col;
  bool live;
};
__device__ __forceinline__ Elem element(int64_t rows, int64_t n) {
  const int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  return {e / n, e % n, e < rows * n};
}

template <typename T>
__global__ void __launch_bounds__(kThreads) round_trip_kernel(const __grid_constant__ QatRoundTripParams p) {
  const Elem el = element(p.rows, p.n);
  T* x = static_cast<T*>(p.x) + el.row * p.ld + el.col;
  const float v = el.live ? to_f32(*x) : 0.f;            // dead lanes still join the shuffles
  uint8_t sb;
  const float s = q::block_scale(p.format, group_amax(v, qat_block(p.format)), &sb);
  if (el.live) *x = from_f32<T>(q::element_value(p.format, q::element_code(p.format, v, s), s));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) pack_kernel(const __grid_constant__ QatPackParams p) {
  const Elem el = element(p.rows, p.n);
  const int b = qat_block(p.format);
  const float v = el.live ? to_f32(static_cast<const T*>(p.x)[el.row * p.ld + el.col]) : 0.f;
  uint8_t sb;
  const float s = q::block_scale(p.format, group_amax(v, b), &sb);
  const uint8_t code = q::element_code(p.format, v, s);
  const uint8_t next = uint8_t(__shfl_down_sync(kFull, unsigned(code), 1));  // FP4: element 2k+1 -> high nibble
  if (!el.live) return;
  uint8_t* o = p.out + el.row * qat_packed_row_bytes(p.format, p.n);
  if (qat_is_fp8(p.format)) o[el.col] = code;
  else if (el.col % 2 == 0) o[el.col / 2] = uint8_t(code | (next << 4));
  if (el.col % b == 0) o[qat_code_bytes(p.format, p.n) + el.col / b] = sb;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) unpack_kernel(const __grid_constant__ QatUnpackParams p) {
  const Elem el = element(p.rows, p.n);
  if (!el.live) return;
  const uint8_t* in = p.in + el.row * qat_packed_row_bytes(p.format, p.n);
  const float s = q::scale_of_byte(p.format, in[qat_code_bytes(p.format, p.n) + el.col / qat_block(p.format)]);
  const uint8_t c = qat_is_fp8(p.format) ? in[el.col] : uint8_t((in[el.col / 2] >> (4 * (el.col % 2))) & 0xf);
  static_cast<T*>(p.x)[el.row * p.ld + el.col] = from_f32<T>(q::element_value(p.format, c, s));
}

void check(const char* what, QatFormat f, const void* a, const void* b, int64_t rows, int64_t n, int64_t ld,
           bool whole_blocks) {
  if (!a || !b || rows < 0 || n < 0 || ld < n)
    DI_THROW(InvalidArgument, what, ": null pointer or bad shape rows=", rows, " n=", n, " ld=", ld);
  if (whole_blocks && n % qat_block(f))
    DI_THROW(InvalidArgument, what, ": row length ", n, " is not a multiple of the block ", qat_block(f),
             " (packed storage needs whole blocks)");
}

unsigned grid(int64_t rows, int64_t n) { return unsigned(ceil_div(rows * n, kThreads)); }
}  // namespace

void qat_round_trip(const QatRoundTripParams& p, cudaStream_t stream) {
  check("qat_round_trip", p.format, p.x, p.x, p.rows, p.n, p.ld, false);
  if (p.rows == 0 || p.n == 0 || p.n % qat_block(p.format)) return;  // the reference leaves such rows as they are
  DI_DISPATCH_FLOAT(p.dtype, T, "qat_round_trip x", [&] {
    round_trip_kernel<T><<<grid(p.rows, p.n), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

void qat_pack(const QatPackParams& p, cudaStream_t stream) {
  check("qat_pack", p.format, p.x, p.out, p.rows, p.n, p.ld, true);
  if (p.rows == 0 || p.n == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "qat_pack x", [&] {
    pack_kernel<T><<<grid(p.rows, p.n), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

void qat_unpack(const QatUnpackParams& p, cudaStream_t stream) {
  check("qat_unpack", p.format, p.in, p.x, p.rows, p.n, p.ld, true);
  if (p.rows == 0 || p.n == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "qat_unpack x", [&] {
    unpack_kernel<T><<<grid(p.rows, p.n), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace deepinfer::ops::cuda
