// `deepinfer bench-cpu-gemm`: the CPU backend's fp32 products at the bundled default model's
// shapes (hidden 192, q_lora 128, 4 x 64 heads, o_groups 2 x 64, 8 experts of 96 + 1 shared,
// mHC 4 streams, vocabulary 8,192), per kernel: the packed kernel the backend runs
// (linear_packed), OpenBLAS sgemm (gemm, the backend's kernel before) and the batch-invariant
// gemm_fixed. For each (shape, kernel): the fastest single call's wall time (a call that was not
// preempted: what to read on a shared machine), its GFLOP/s and share of the fp32 FMA peak measured
// here the same way (24 independent zmm FMA chains), and the process CPU time per call; then the
// weighted total over one forward of --tokens tokens (each shape times its count per forward).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/parallel.h"
#include "ops/cpu/gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace {
namespace oc = deepinfer::ops::cpu;

struct Shape {
  const char* name;
  int64_t n, k;
  double m_per_token;  // rows per token of the prompt (routed experts: topk / experts)
  int64_t count;       // products of this shape in one forward of the model (6 layers)
};

// The default model's per-forward products (assets/default-model/config.json; layers
// S C H C H S = compress ratios 0 4 32 4 32 0). The lm head runs on the last row only.
const Shape kShapes[] = {
    {"wq_a", 128, 192, 1, 6},          {"wq_b", 256, 128, 1, 6},
    {"wkv", 64, 192, 1, 6},            {"wo_a (1 group)", 64, 128, 1, 12},
    {"wo_b", 192, 128, 1, 6},          {"hc_pre mix", 24, 768, 1, 12},
    {"gate", 8, 192, 1, 6},            {"shared w13", 192, 192, 1, 6},
    {"shared w2", 192, 96, 1, 6},      {"routed w13", 192, 192, 0.25, 48},
    {"routed w2", 192, 96, 0.25, 48},  {"cmp4 wkv_gate", 256, 192, 1, 2},
    {"cmp4 index keys", 128, 192, 1, 2}, {"index_wq_b", 512, 128, 1, 2},
    {"index_weights", 16, 192, 1, 2},  {"cmp32 wkv_gate", 128, 192, 1, 2},
};

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
double wall_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Best {
  double wall = 1e30, cpu = 1e30, one = 1e30;  // one: the fastest single call (wall), i.e. not preempted
};

// Best-of-`reps` per-call times; each rep repeats the call until it has run >= ~20 ms of wall.
template <class Fn>
Best time_it(Fn&& fn, int reps) {
  fn();  // warm caches and pools
  Best b;
  for (int r = 0; r < reps; ++r) {
    int iters = 0;
    const double w0 = wall_now(), c0 = cpu_now();
    double w1 = w0;
    do {
      const double t0 = wall_now();
      fn();
      ++iters;
      w1 = wall_now();
      b.one = std::min(b.one, w1 - t0);
    } while (w1 - w0 < 0.02);
    const double c1 = cpu_now();
    b.wall = std::min(b.wall, (w1 - w0) / iters);
    b.cpu = std::min(b.cpu, (c1 - c0) / iters);
  }
  return b;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The machine's fp32 FMA peak in the same clock: 24 independent 512-bit FMA chains held in
// registers (throughput-bound on any FMA latency <= 12), the fastest of many ~50k-FMA runs (one not
// preempted). 0 without AVX-512.
__attribute__((target("avx512f"))) double measured_peak_gflops() {
  if (!__builtin_cpu_supports("avx512f")) return 0;
  __m512 a[24];
  for (int i = 0; i < 24; ++i) a[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.99999f), c = _mm512_set1_ps(1e-6f);
  constexpr int64_t kIters = 2000;
  double best = 1e30;
  for (int r = 0; r < 400; ++r) {
    const double t0 = wall_now();
    for (int64_t i = 0; i < kIters; ++i) {
#pragma GCC unroll 24
      for (int j = 0; j < 24; ++j) a[j] = _mm512_fmadd_ps(a[j], m, c);
    }
    best = std::min(best, wall_now() - t0);
  }
  float sink = 0, lanes[16];
  for (int i = 0; i < 24; ++i) {
    _mm512_storeu_ps(lanes, a[i]);
    sink += lanes[0];
  }
  if (sink == 12345.f) std::printf(" ");
  return 2.0 * 16 * 24 * double(kIters) / best / 1e9;
}
#else
double measured_peak_gflops() { return 0; }
#endif

// One-core read bandwidth of a weight-sized buffer (16 MiB: the default model's decode weights
// fit the last-level cache): the fastest of 20 passes, GB/s.
double measured_read_gbps() {
  std::vector<float> buf(size_t(4) << 20, 1.0f);
  double best = 1e30;
  float sink = 0;
  for (int r = 0; r < 20; ++r) {
    const double t0 = wall_now();
    float acc[16] = {};
    for (size_t i = 0; i < buf.size(); i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += buf[i + l];
    best = std::min(best, wall_now() - t0);
    sink += acc[3];
  }
  if (sink == 12345.f) std::printf(" ");
  return double(buf.size() * sizeof(float)) / best / 1e9;
}

struct Row {
  const char* name;
  int64_t m, n, k, count;
};

// The products of one forward: a prefill of T tokens (lm head on the last row), or a decode step
// of B sequences (B > 0: every dense product M = B, the head M = B, routed experts: min(8, 2B) of
// them per layer touched, ceil(2B / 8) rows each).
std::vector<Row> rows_for(int64_t T, int64_t B) {
  std::vector<Row> rows;
  const int64_t M = B > 0 ? B : T;
  for (const Shape& s : kShapes) {
    if (s.m_per_token < 1 && B > 0) {
      rows.push_back({s.name, (2 * B + 7) / 8, s.n, s.k, 6 * std::min<int64_t>(8, 2 * B)});
      continue;
    }
    rows.push_back({s.name, std::max<int64_t>(1, int64_t(double(M) * s.m_per_token)), s.n, s.k, s.count});
  }
  rows.push_back({"lm head", B > 0 ? B : 1, 8192, 192, 1});
  return rows;
}

void run_table(const std::vector<Row>& rows, const std::vector<std::string>& kernels, int reps, double peak,
               double read_gbps, const char* what) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::printf("| M | N | K | product | kernel | best call us | GFLOP/s | share of peak | weight GB/s | CPU us per call |\n");
  std::printf("|---:|---:|---:|---|---|---:|---:|---:|---:|---:|\n");
  std::vector<double> total_cpu(kernels.size(), 0.0), total_wall(kernels.size(), 0.0);
  double total_flops = 0, total_bytes = 0;
  for (const Row& r : rows) {
    const int64_t M = r.m, N = r.n, K = r.k;
    std::vector<float> x(size_t(M * K)), w(size_t(N * K)), y(size_t(M * N));
    for (float& v : x) v = dist(gen);
    for (float& v : w) v = dist(gen);
    const oc::PackedWeight pw = oc::pack_weight(w.data(), N, K, K);
    const double flops = 2.0 * double(M) * double(N) * double(K), bytes = 4.0 * double(N) * double(K);
    total_flops += flops * double(r.count);
    total_bytes += bytes * double(r.count);
    for (size_t ki = 0; ki < kernels.size(); ++ki) {
      const std::string& kn = kernels[ki];
      Best b;
      if (kn == "packed") b = time_it([&] { oc::linear_packed(x.data(), M, K, pw, y.data(), N); }, reps);
      if (kn == "blas") b = time_it([&] { oc::gemm(M, N, K, x.data(), K, w.data(), K, true, y.data(), N); }, reps);
      if (kn == "fixed")
        b = time_it([&] { oc::gemm_fixed(M, N, K, x.data(), K, w.data(), K, true, y.data(), N); }, reps);
      total_cpu[ki] += b.cpu * double(r.count);
      total_wall[ki] += b.one * double(r.count);
      const double gf = flops / b.one / 1e9;
      std::printf("| %ld | %ld | %ld | %s | %s | %.1f | %.1f | %.0f%% | %.1f | %.1f |\n", long(M), long(N), long(K),
                  r.name, kn.c_str(), b.one * 1e6, gf, 100.0 * gf / peak, bytes / b.one / 1e9, b.cpu * 1e6);
    }
  }
  std::printf("\n%s: every product x its count (%.3f GFLOP, %.1f MB of weights read once each):\n", what,
              total_flops / 1e9, total_bytes / 1e6);
  for (size_t ki = 0; ki < kernels.size(); ++ki) {
    const double gf = total_flops / total_wall[ki] / 1e9;
    std::printf("  %-6s  best calls %.3f ms  %.1f GFLOP/s  %.0f%% of peak  weights at %.1f GB/s (%.0f%% of the %.1f GB/s "
                "read)  (CPU time %.3f ms)\n",
                kernels[ki].c_str(), total_wall[ki] * 1e3, gf, 100.0 * gf / peak, total_bytes / total_wall[ki] / 1e9,
                100.0 * total_bytes / total_wall[ki] / 1e9 / read_gbps, read_gbps, total_cpu[ki] * 1e3);
  }
  std::printf("\n");
}

int run_bench_cpu_gemm(int argc, char** argv) {
  CLI::App app{"fp32 GEMM kernels of the CPU backend at the default model's shapes", argv[0]};
  std::vector<int64_t> tokens{512, 2240}, decode;
  std::vector<std::string> kernels{"packed", "blas", "fixed"};
  int reps = 5;
  double peak = 0;
  int threads = 0;
  app.add_option("--tokens", tokens, "prompt tokens per forward (M of the dense products)");
  app.add_option("--decode-batch", decode, "also: decode steps of these many sequences");
  app.add_option("--kernels", kernels, "packed | blas | fixed")->check(CLI::IsMember({"packed", "blas", "fixed"}));
  app.add_option("--reps", reps, "best of this many timed repetitions")->check(CLI::PositiveNumber);
  app.add_option("--peak-gflops", peak, "fp32 FMA peak of one core to compare with (0: measure it here)");
  app.add_option("--threads", threads, "OpenMP threads (0: the default)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
#if defined(_OPENMP)
  if (threads > 0) omp_set_num_threads(threads);
#endif
  const double measured = measured_peak_gflops(), read_gbps = measured_read_gbps();
  std::printf("threads %d, packed kernel %s; peak: given %.1f GFLOP/s per core, measured %.1f (24 zmm FMA chains);\n"
              "one-core read of 16 MiB: %.1f GB/s. best call = the fastest single call's wall time (not preempted);\n"
              "GFLOP/s, share and GB/s from it; CPU = process CPU time per call over the timed loop (all threads)\n\n",
              deepinfer::num_threads(), oc::packed_kernel_is_avx512() ? "AVX-512 12x32" : "portable 8x16", peak,
              measured, read_gbps);
  if (peak <= 0) peak = measured > 0 ? measured : 1;
  for (int64_t T : tokens) {
    const std::string what = "prefill of " + std::to_string(T) + " tokens";
    run_table(rows_for(T, 0), kernels, reps, peak, read_gbps, what.c_str());
  }
  for (int64_t B : decode) {
    const std::string what = "decode step of " + std::to_string(B) + " sequences";
    run_table(rows_for(0, B), kernels, reps, peak, read_gbps, what.c_str());
  }
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("bench-cpu-gemm", "fp32 GEMM kernels of the CPU backend at the default model's shapes (GFLOP/s, share of peak)",
                    run_bench_cpu_gemm);
