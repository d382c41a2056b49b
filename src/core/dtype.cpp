#include "core/dtype.h"

#include "core/check.h"

namespace deepinfer {
namespace {
struct DTypeInfo {
  DType t;
  size_t bits;
  std::string_view name, st_name;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, 32, "f32", "F32"},          {DType::kBF16, 16, "bf16", "BF16"},
    {DType::kF16, 16, "f16", "F16"},          {DType::kF8E4M3, 8, "fp8_e4m3", "F8_E4M3"},
    {DType::kE8M0, 8, "e8m0", "F8_E8M0"},     {DType::kFP4E2M1, 4, "fp4_e2m1", "F4"},
    {DType::kI8, 8, "i8", "I8"},              {DType::kU8, 8, "u8", "U8"},
    {DType::kI32, 32, "i32", "I32"},          {DType::kI64, 64, "i64", "I64"},
    {DType::kBool, 8, "bool", "BOOL"},
};
const DTypeInfo& info(DType t) {
  for (const auto& d : kDTypes)
    if (d.t == t) return d;
  DI_CHECK(false, "unknown dtype ", int(t));
}
}  // namespace

size_t dtype_bits(DType t) { return info(t).bits; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view dtype_to_safetensors(DType t) { return info(t).st_name; }
std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (const auto& d : kDTypes)
    if (d.st_name == s) return d.t;
  if (s == "F8_E4M3FN") return DType::kF8E4M3;
  return std::nullopt;
}
}  // namespace deepinfer
