// CUDA twins of the V4.1 QAT round trips (ops/cpu/qat.h: formats, formulas, NaN policy, packed
// layout). Same scalar steps (ops::cpu::qat, IEEE-rounded intrinsics on the device), so the
// outputs equal the CPU reference bit for bit, for f32 and bf16 rows (every rounded value is
// exact in bf16). A row length that is not a multiple of the block is left untouched by the round
// trip and refused by pack/unpack, as on the CPU.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cpu/qat.h"

namespace deepinfer::ops::cuda {

using ops::cpu::QatFormat;

struct QatRoundTripParams {
  void* x = nullptr;             // [rows, n] in place, row stride ld (elements), f32 or bf16
  DType dtype = DType::kF32;
  QatFormat format = QatFormat::kFp8Ue8m0Block32;
  int64_t rows = 0, n = 0, ld = 0;
};

struct QatPackParams {
  const void* x = nullptr;       // [rows, n], row stride ld, f32 or bf16
  DType dtype = DType::kF32;
  QatFormat format = QatFormat::kFp8Ue8m0Block32;
  int64_t rows = 0, n = 0, ld = 0;
  uint8_t* out = nullptr;        // [rows, qat_packed_row_bytes(format, n)]: codes then scale bytes
};

struct QatUnpackParams {
  const uint8_t* in = nullptr;   // [rows, qat_packed_row_bytes(format, n)]
  void* x = nullptr;             // [rows, n], row stride ld, f32 or bf16
  DType dtype = DType::kF32;
  QatFormat format = QatFormat::kFp8Ue8m0Block32;
  int64_t rows = 0, n = 0, ld = 0;
};

// Throw InvalidArgument for null pointers, negative sizes, ld < n, other dtypes, and (pack /
// unpack) n not a multiple of the block.
void qat_round_trip(const QatRoundTripParams& p, cudaStream_t stream);
void qat_pack(const QatPackParams& p, cudaStream_t stream);
void qat_unpack(const QatUnpackParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
