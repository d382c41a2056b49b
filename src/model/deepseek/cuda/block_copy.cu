#include "model/deepseek/cuda/block_copy.h"

#include <cstring>
#include <unordered_map>

#include "deepinfer/error.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {
namespace {
constexpr int kThreads = 256;

// blockIdx.x: the listed block i, blockIdx.y: the part. Each CTA moves one part's bytes of one
// block (a few KB: entries_per_block rows of one layer), strided over its threads in units of T.
template <typename T, bool kGather>
__global__ void block_copy_kernel(const BlockPart* parts, const int32_t* ids, char* staging, uint64_t block_bytes) {
  const BlockPart p = parts[blockIdx.y];
  const uint64_t i = blockIdx.x;
  T* pool = reinterpret_cast<T*>(p.base + uint64_t(ids[i]) * p.bytes);
  T* packed = reinterpret_cast<T*>(staging + i * block_bytes + p.offset);
  const uint64_t n = p.bytes / sizeof(T);
  for (uint64_t k = threadIdx.x; k < n; k += blockDim.x) {
    if constexpr (kGather) packed[k] = pool[k];
    else pool[k] = packed[k];
  }
}

template <typename T>
void launch_typed(const void* table, int num_parts, int64_t n, char* staging, size_t block_bytes, bool gather,
                  cudaStream_t stream) {
  const auto* parts = static_cast<const BlockPart*>(table);
  const auto* ids = reinterpret_cast<const int32_t*>(parts + num_parts);
  const dim3 grid{unsigned(n), unsigned(num_parts), 1u};
  if (gather) block_copy_kernel<T, true><<<grid, kThreads, 0, stream>>>(parts, ids, staging, block_bytes);
  else block_copy_kernel<T, false><<<grid, kThreads, 0, stream>>>(parts, ids, staging, block_bytes);
  DI_CUDA_CHECK_LAUNCH();
}
}  // namespace

void check_block_list(std::span<const int32_t> blocks, int64_t num_blocks, const char* what) {
  std::unordered_map<int32_t, size_t> seen;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t b = blocks[i];
    if (b < 0 || b >= num_blocks)
      DI_THROW(InvalidArgument, what, ": block id ", b, " at position ", i, " outside [0, ", num_blocks, ")");
    const auto [it, fresh] = seen.emplace(b, i);
    if (!fresh)
      DI_THROW(InvalidArgument, what, ": block id ", b, " at position ", i, " repeats position ", it->second,
               " (each block may be listed once)");
  }
}

int block_copy_unit(std::span<const BlockPart> parts, const void* staging, size_t block_bytes) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(staging)) | block_bytes;
  for (const BlockPart& p : parts) bits |= uint64_t(reinterpret_cast<uintptr_t>(p.base)) | p.bytes | p.offset;
  return bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 1;
}

std::vector<uint8_t> pack_block_copy_table(std::span<const BlockPart> parts, std::span<const int32_t> blocks) {
  static_assert(sizeof(BlockPart) % 8 == 0, "the ids follow the parts 8-byte aligned");
  std::vector<uint8_t> t(parts.size_bytes() + blocks.size_bytes());
  if (!parts.empty()) std::memcpy(t.data(), parts.data(), parts.size_bytes());
  if (!blocks.empty()) std::memcpy(t.data() + parts.size_bytes(), blocks.data(), blocks.size_bytes());
  return t;
}

void launch_block_copy(const void* table, int num_parts, int64_t n, char* staging, size_t block_bytes, int unit,
                       bool gather, cudaStream_t stream) {
  if (n == 0 || num_parts == 0) return;
  if (n > int64_t(INT32_MAX) || num_parts > 65535)
    DI_THROW(InvalidArgument, "block copy: ", n, " blocks x ", num_parts, " parts exceed one launch's grid");
  if (unit == 16) launch_typed<uint4>(table, num_parts, n, staging, block_bytes, gather, stream);
  else if (unit == 4) launch_typed<uint32_t>(table, num_parts, n, staging, block_bytes, gather, stream);
  else launch_typed<uint8_t>(table, num_parts, n, staging, block_bytes, gather, stream);
}

}  // namespace deepinfer::model::ds::cuda
