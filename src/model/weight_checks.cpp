#include "model/weight_checks.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "io/safetensors.h"

namespace deepinfer::model {
namespace {

// Bit pattern test per dtype: `mask` selects the bits, a value is bad when (x & mask) == bad.
// For F32/BF16/F16 that is "exponent all ones" (NaN or Inf); for e4m3fn and e8m0 the NaN codes.
struct Code {
  uint32_t mask, bad;
  int bytes;
};

bool code_for(DType t, Code* c) {
  switch (t) {
    case DType::kF32: *c = {0x7F800000u, 0x7F800000u, 4}; return true;
    case DType::kBF16: *c = {0x7F80u, 0x7F80u, 2}; return true;
    case DType::kF16: *c = {0x7C00u, 0x7C00u, 2}; return true;
    case DType::kF8E4M3: *c = {0x7Fu, 0x7Fu, 1}; return true;
    case DType::kE8M0: *c = {0xFFu, 0xFFu, 1}; return true;
    default: return false;
  }
}

// Element i of a possibly unaligned array (a shard's data section need not be aligned).
template <typename U>
U load(const char* p, int64_t i) {
  U x;
  std::memcpy(&x, p + i * int64_t(sizeof(U)), sizeof(U));
  return x;
}

template <typename U>
int64_t first_bad_in(const char* p, int64_t n, U mask, U bad) {
  // Branch-free OR over blocks (vectorises), exact position only inside a flagged block.
  constexpr int64_t kBlock = 1024;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    unsigned any = 0;
    for (int64_t i = b; i < e; ++i) any |= unsigned((load<U>(p, i) & mask) == bad);
    if (!any) continue;
    for (int64_t i = b; i < e; ++i)
      if ((load<U>(p, i) & mask) == bad) return i;
  }
  return -1;
}

int64_t first_bad(const char* data, int64_t n, const Code& c) {
  switch (c.bytes) {
    case 4: return first_bad_in<uint32_t>(data, n, c.mask, c.bad);
    case 2: return first_bad_in<uint16_t>(data, n, uint16_t(c.mask), uint16_t(c.bad));
    default: return first_bad_in<uint8_t>(data, n, uint8_t(c.mask), uint8_t(c.bad));
  }
}

// First non-finite element of a contiguous tensor, chunks scanned in parallel; -1 if none.
int64_t scan(const void* data, int64_t n, const Code& c) {
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const char* base = static_cast<const char*>(data);
  if (chunks <= 1) return first_bad(base, n, c);
  std::vector<int64_t> hit(size_t(chunks), -1);
  parallel_for(0, chunks, [&](int64_t k) {
    const int64_t b = k * kChunk, len = std::min(kChunk, n - b);
    const int64_t i = first_bad(base + b * c.bytes, len, c);
    if (i >= 0) hit[size_t(k)] = b + i;
  });
  for (int64_t h : hit)
    if (h >= 0) return h;
  return -1;
}

const char* what_bad(DType t, const void* data, int64_t i) {
  if (t == DType::kF8E4M3 || t == DType::kE8M0) return "NaN";
  const char* p = static_cast<const char*>(data);
  uint32_t bits = 0, frac_mask = 0;
  if (t == DType::kF32) bits = load<uint32_t>(p, i), frac_mask = 0x7FFFFF;
  else if (t == DType::kBF16) bits = load<uint16_t>(p, i), frac_mask = 0x7F;
  else bits = load<uint16_t>(p, i), frac_mask = 0x3FF;
  return (bits & frac_mask) ? "NaN" : "Inf";
}
}  // namespace

void check_finite_weights(const io::Checkpoint& ck) {
  for (const std::string& name : ck.names()) {
    Code c;
    const io::TensorInfo& info = ck.info(name);
    if (!code_for(info.dtype, &c)) continue;
    const Tensor t = ck.get(name);  // a contiguous view of the mapped shard
    const int64_t n = t.numel();
    if (n == 0) continue;
    const int64_t i = scan(t.raw_data(), n, c);
    if (i >= 0)
      DI_THROW(CheckpointError, ck.file_of(name), ": tensor '", name, "' holds ", what_bad(info.dtype, t.raw_data(), i),
               " at element ", i, " (of ", n, ", shape ", shape_str(info.shape), ")");
  }
}

}  // namespace deepinfer::model
