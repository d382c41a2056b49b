// Work-based grain for parallel_for in the CPU ops: a parallel region costs microseconds when
// cores are idle and milliseconds when they are shared, so only loops with enough arithmetic
// are split. `work_per_item` is a rough flop count of one iteration.
// The threshold (a loop splits at >= 2 * 16 MFLOP, a few ms of one core) is set for a shared
// machine: with OpenMP's default active waiting, a worker that the OS has descheduled costs
// its team a spin of up to a few ms per region; at 1 MFLOP a 4-prompt prefill of the bundled
// model took 550 ms instead of 20 ms on a loaded 2-core box (docs/PERFORMANCE.md).
#pragma once
#include <algorithm>
#include <cstdint>

namespace deepinfer::ops::cpu {

inline constexpr int64_t kMinParallelWork = int64_t(1) << 24;

inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinParallelWork / std::max<int64_t>(1, work_per_item));
}

}  // namespace deepinfer::ops::cpu
