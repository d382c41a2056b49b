// Element types of tensors. Sub-byte types (fp4) are packed two per byte along the
// innermost dimension: element 2k in the low nibble, 2k+1 in the high nibble.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
  kF32, kBF16, kF16,
  kF8E4M3,   // fp8 e4m3fn
  kE8M0,     // power-of-two scale, 2^(e-127)
  kFP4E2M1,  // packed fp4, two per byte
  kI8, kU8, kI32, kI64, kBool,
};

// Bits per element (4 for kFP4E2M1).
size_t dtype_bits(DType t);
std::string_view dtype_name(DType t);
// safetensors dtype strings: "F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", "I64", ...
std::optional<DType> dtype_from_safetensors(std::string_view s);
std::string_view dtype_to_safetensors(DType t);
// Bytes needed for `numel` elements (rounded up for packed types).
inline size_t dtype_nbytes(DType t, int64_t numel) { return (size_t(numel) * dtype_bits(t) + 7) / 8; }

}  // namespace deepinfer
