// CPU reference of the V4.1 QAT round trips (qat.h): one block at a time, the reference's steps.
#include "ops/cpu/qat.h"

#include <cmath>

#include "core/check.h"
#include "core/parallel.h"

namespace deepinfer::ops::cpu {
namespace {

// max |v| over the block; NaN if any element is NaN (torch's amax propagates it).
float block_amax(const float* v, int b) {
  float m = 0.0f;
  for (int i = 0; i < b; ++i) {
    const float a = std::fabs(v[i]);
    if (a != a) return a;
    if (a > m) m = a;
  }
  return m;
}

void check_args(QatFormat f, int64_t rows, int64_t n, int64_t ld, bool need_blocks, const char* what) {
  if (rows < 0 || n < 0 || ld < n)
    DI_THROW(InvalidArgument, what, " (", qat_format_name(f), "): bad shape rows=", rows, " n=", n, " ld=", ld);
  if (need_blocks && n % qat_block(f) != 0)
    DI_THROW(InvalidArgument, what, " (", qat_format_name(f), "): row length ", n, " is not a multiple of the block ",
             qat_block(f), " (packed storage needs whole blocks)");
}

// One block: codes and scale byte (for packing) and the decoded values (for the round trip).
void quantize_block(QatFormat f, const float* v, int b, uint8_t* codes, uint8_t* scale_byte, float* out) {
  const float s = qat::block_scale(f, block_amax(v, b), scale_byte);
  for (int i = 0; i < b; ++i) {
    const uint8_t c = qat::element_code(f, v[i], s);
    if (codes) codes[i] = c;
    if (out) out[i] = qat::element_value(f, c, s);
  }
}
}  // namespace

const char* qat_format_name(QatFormat f) {
  switch (f) {
    case QatFormat::kFp8Ue8m0Block32: return "fp8 e4m3, ue8m0 scale per 32";
    case QatFormat::kFp4E4m3Block16: return "fp4 e2m1, e4m3 scale per 16";
    case QatFormat::kFp4Ue8m0Block32: return "fp4 e2m1, ue8m0 scale per 32";
  }
  return "?";
}

void qat_round_trip(QatFormat f, float* x, int64_t rows, int64_t n, int64_t ld) {
  check_args(f, rows, n, ld, false, "qat_round_trip");
  const int b = qat_block(f);
  if (n == 0 || n % b != 0) return;  // the reference leaves shapes it cannot block unrounded
  parallel_for(0, rows, [&](int64_t r) {
    uint8_t sb;
    for (int64_t j = 0; j < n; j += b) quantize_block(f, x + r * ld + j, b, nullptr, &sb, x + r * ld + j);
  }, 64);
}

void qat_pack(QatFormat f, const float* x, int64_t rows, int64_t n, int64_t ld, uint8_t* out) {
  check_args(f, rows, n, ld, true, "qat_pack");
  const int b = qat_block(f);
  const int64_t row_bytes = qat_packed_row_bytes(f, n), code_bytes = qat_code_bytes(f, n);
  parallel_for(0, rows, [&](int64_t r) {
    uint8_t codes[32];
    uint8_t* o = out + r * row_bytes;
    for (int64_t j = 0; j < n; j += b) {
      quantize_block(f, x + r * ld + j, b, codes, o + code_bytes + j / b, nullptr);
      for (int i = 0; i < b; ++i) {
        if (qat_is_fp8(f)) o[j + i] = codes[i];
        else if (i % 2 == 0) o[(j + i) / 2] = uint8_t(codes[i] | (codes[i + 1] << 4));  // element 2k low
      }
    }
  }, 64);
}

void qat_unpack(QatFormat f, const uint8_t* in, int64_t rows, int64_t n, float* x, int64_t ld) {
  check_args(f, rows, n, ld, true, "qat_unpack");
  const int b = qat_block(f);
  const int64_t row_bytes = qat_packed_row_bytes(f, n), code_bytes = qat_code_bytes(f, n);
  parallel_for(0, rows, [&](int64_t r) {
    const uint8_t* p = in + r * row_bytes;
    for (int64_t j = 0; j < n; ++j) {
      const float s = qat::scale_of_byte(f, p[code_bytes + j / b]);
      const uint8_t c = qat_is_fp8(f) ? p[j] : uint8_t((p[j / 2] >> (4 * (j % 2))) & 0xf);
      x[r * ld + j] = qat::element_value(f, c, s);
    }
  }, 64);
}

}  // namespace deepinfer::ops::cpu
