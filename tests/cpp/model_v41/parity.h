// Logit comparisons shared by the DeepSeek-V4.1 parity tests (the CPU's forward_test.cc, the GPU's
// tests/cpp/cuda_model/v41_gpu_test.cc and v41_slice_test.cc): the per-row difference summary, the
// sequences on which the QAT roundings cascade, the strict and loose bounds, the odd chunking.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace v41_parity {

struct Diff {
  double max = 0;
  int64_t rows_over = 0;  // rows with some |Δlogit| > 1e-4
  int64_t flips = 0;      // rows whose argmax differs
  bool finite = true;     // every value of `a` finite
};

// a, b: [rows, V] logits.
inline Diff diff(const float* a, const float* b, int64_t rows, int64_t V) {
  Diff d;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ia = 0, ib = 0;
    double row_max = 0;
    for (int64_t v = 0; v < V; ++v) {
      d.finite = d.finite && std::isfinite(a[r * V + v]);
      row_max = std::max(row_max, double(std::fabs(a[r * V + v] - b[r * V + v])));
      if (a[r * V + v] > a[r * V + ia]) ia = v;
      if (b[r * V + v] > b[r * V + ib]) ib = v;
    }
    d.max = std::max(d.max, row_max);
    d.rows_over += row_max > 1e-4;
    d.flips += ia != ib;
  }
  return d;
}

// Sequences on which the QAT roundings cascade depending on the engine's kernels: v41_b t37 and
// t161 meet the golden within 1e-4 with the CPU's AVX2 kernels but, with AVX-512 kernels (measured
// 2026-12-02: t161 one-shot 0.543 on 143 of 161 rows, 5 argmax; t37 0.294 on 3 rows) and on the
// GPU, a last-bit difference crosses an FP4/FP8 step early and moves every later row. For them
// only the loose bound holds; every other sequence keeps its strict bound.
inline bool cascades(const std::string& fixture, const std::string& seq) {
  return (fixture == "v41_b" || fixture == "v41_b_release") && (seq == "t37" || seq == "t161");
}

// The CPU's version: the kernels OpenBLAS runs decide which sequences cascade, so the test suite
// pins them (tools/openblas_coretype.sh: SkylakeX with AVX-512, Haswell with AVX2; measured
// 2026-12-03, one machine, every fixture under both). SkylakeX: the sequences above. Haswell:
// also v41_a t37, whose one-shot forward crosses one FP4 step (8 of 37 rows move by 3.2e-3, no
// argmax changes; the same flip SkylakeX shows in the chunked and token-by-token runs). Prescott
// (OpenBLAS's fallback on CPUs it does not recognise) cascades v41_a t161 token by token (1.3, 18
// argmax): not a kernel the suite runs with.
inline bool cpu_cascades(const std::string& fixture, const std::string& seq) {
  if (cascades(fixture, seq)) return true;
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  const bool haswell = core != nullptr && std::string(core) == "Haswell";
  return haswell && (fixture == "v41_a" || fixture == "v41_a_release") && seq == "t37";
}

// The loose bound: finite, max |Δ| <= 1, argmax changed on at most 4% of the rows.
inline void expect_loose(const Diff& d, int64_t T, const std::string& what) {
  EXPECT_TRUE(d.finite) << what;
  EXPECT_LE(d.max, 1.0) << what;
  EXPECT_LE(d.flips * 25, std::max<int64_t>(T, 25)) << what << ": " << d.flips << " of " << T << " argmax changed";
}

// Finite, no argmax changed, max |Δ| <= bound.
inline void expect_strict(const Diff& d, double bound, const std::string& what) {
  EXPECT_TRUE(d.finite) << what;
  EXPECT_EQ(d.flips, 0) << what;
  EXPECT_LE(d.max, bound) << what;
}

// 3, 5, 7, 3, 5, 7, ... summing to T (odd cuts split ratio-2 pairs across steps).
inline std::vector<int64_t> odd_chunks(int64_t T) {
  std::vector<int64_t> c;
  const int64_t sizes[] = {3, 5, 7};
  for (int64_t done = 0, i = 0; done < T; ++i) {
    const int64_t n = std::min(sizes[i % 3], T - done);
    c.push_back(n);
    done += n;
  }
  return c;
}

}  // namespace v41_parity
