// Helpers for the CUDA op tests: GPU skip, seeded random data, bf16 packing, device arrays that
// are poisoned (all 0xFF bytes: NaN for f32/bf16, -1 for ints) before each run, error metrics,
// and one machine-readable result line per check for tools/gpu_check.sh:
//   DI_CUDA_ERR|<op>|<case>|<max_rel_err>|<tolerance>|PASS or FAIL
// max_rel_err = max|out - ref| / max|ref| over the output (inf when any output is NaN/unwritten).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::cuda::test {

#define DI_REQUIRE_GPU()                                                                   \
  do {                                                                                     \
    if (::deepinfer::cuda::cuda_device_count() == 0)                                       \
      GTEST_SKIP() << "CUDA test skipped: " << ::deepinfer::cuda::cuda_unavailable_reason(); \
  } while (0)

inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(g);
    if (x == 0.0f) x = stddev * 1e-3f;  // never zeros
  }
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
// Round-trips values through bf16 (what the kernel actually sees).
inline std::vector<float> bf16_round(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

// A typed device array.
template <typename T>
struct DevArray {
  DeviceBuffer buf;
  size_t n = 0;
  DevArray() = default;
  explicit DevArray(size_t count) : buf(count > 0 ? count * sizeof(T) : 1), n(count) {}
  explicit DevArray(const std::vector<T>& h) : DevArray(h.size()) { upload(h); }
  void upload(const std::vector<T>& h) { copy_h2d(buf.data(), h.data(), h.size() * sizeof(T), nullptr); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    copy_d2h(h.data(), buf.data(), n * sizeof(T), nullptr);
    return h;
  }
  void poison() { DI_CUDA_CHECK(cudaMemset(buf.data(), 0xFF, n * sizeof(T))); }
  T* get() const { return buf.as<T>(); }
};

// A device copy of `v` (at least one byte, so an empty vector still gets a valid pointer) and a
// host copy of a device buffer's first `n` elements: for tests that hold plain DeviceBuffers.
template <typename T>
DeviceBuffer up(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(T));
  if (!v.empty()) copy_h2d(b.data(), v.data(), v.size() * sizeof(T), nullptr);
  return b;
}
template <typename T>
std::vector<T> down(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  copy_d2h(v.data(), b.data(), n * sizeof(T), nullptr);
  return v;
}

inline double max_rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double maxref = 0, maxdiff = 0;
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    maxref = std::max(maxref, std::fabs(double(ref[i])));
    maxdiff = std::max(maxdiff, std::fabs(double(out[i]) - double(ref[i])));
  }
  return maxref > 0 ? maxdiff / maxref : maxdiff;
}

// Prints the result line and fails the test when err > tol.
inline void report(const std::string& op, const std::string& cs, double err, double tol) {
  const bool pass = err <= tol;
  std::printf("DI_CUDA_ERR|%s|%s|%.3g|%.3g|%s\n", op.c_str(), cs.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << op << " " << cs;
}

// Timing line for gpu_check.sh: DI_CUDA_TIME|<op>|<shape>|<median us>|<GB/s or TFLOP/s text>
inline void report_time(const std::string& op, const std::string& shape, double us, const std::string& rate) {
  std::printf("DI_CUDA_TIME|%s|%s|%.2f|%s\n", op.c_str(), shape.c_str(), us, rate.c_str());
  std::fflush(stdout);
}

// Odd sizes the brief asks for.
inline const std::vector<int64_t>& token_counts() {
  static const std::vector<int64_t> v{1, 7, 133};
  return v;
}

// Median of 20 event-timed runs of fn on stream s, after 3 warm-up runs (µs).
inline double median_us(const std::function<void(cudaStream_t)>& fn, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) fn(s);
  std::vector<double> t;
  Event a(true), b(true);
  for (int i = 0; i < 20; ++i) {
    a.record(s);
    fn(s);
    b.record(s);
    b.synchronize();
    t.push_back(1e3 * b.elapsed_ms_since(a));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
// Per-launch time of `fn` replayed from a CUDA graph of `n` launches (no host launch gaps, like a
// captured decode step), median of 9 replays after one warm-up (us).
inline double graph_launch_us(const std::function<void(cudaStream_t)>& fn, cudaStream_t s, int n = 20) {
  CudaGraph g;
  g.begin_capture(s);
  for (int i = 0; i < n; ++i) fn(s);
  g.end_capture();
  g.replay(s);
  DI_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  Event a(true), b(true);
  for (int r = 0; r < 9; ++r) {
    a.record(s);
    g.replay(s);
    b.record(s);
    b.synchronize();
    t.push_back(1e3 * b.elapsed_ms_since(a) / n);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
inline std::string gbps(double bytes, double us) { return std::to_string(int(bytes / us / 1e3)) + " GB/s"; }
inline std::string tflops(double flop, double us) { return std::to_string(int(flop / us / 1e6)) + " TFLOP/s"; }

}  // namespace deepinfer::cuda::test
