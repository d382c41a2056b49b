// Work-based grain for parallel_for in the CPU ops: a parallel region costs microseconds when
// cores are idle and milliseconds when they are shared, so only loops with enough arithmetic
// are split. `work_per_item` is a rough flop count of one iteration.
#pragma once
#include <algorithm>
#include <cstdint>

namespace deepinfer::ops::cpu {

inline constexpr int64_t kMinParallelWork = int64_t(1) << 20;

inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(1, work_per_item));
}

}  // namespace deepinfer::ops::cpu
