// Host-side data parallelism for the CPU backend: OpenMP when available, serial otherwise.
// Work is split into contiguous ranges so results never depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace deepinfer {

inline int num_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Calls fn(i) for i in [begin, end). `grain` is a hint: below it the loop runs serially.
template <typename F>
void parallel_for(int64_t begin, int64_t end, F&& fn, int64_t grain = 1) {
  int64_t n = end - begin;
  if (n <= 0) return;
#if defined(_OPENMP)
  if (n >= 2 * grain && num_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
#endif
  for (int64_t i = begin; i < end; ++i) fn(i);
}

}  // namespace deepinfer
