// FP8 weight-only GEMM (ops/cuda/gemm_fp8w.h): against a host twin (dequantised weights, double
// sums) on random non-zero activations and random e4m3 bytes of every finite code (subnormals
// included) with random e8m0 scales, odd M/N/K, batched (wo_a-like) and K-split shapes, outputs
// poisoned first; bit-for-bit against the same weights dequantised to bf16 (dequant_fp8w_bf16,
// checked against the host and against quant.h's dequant_fp8_blockwise) through the kernel's bf16
// path; typed errors; and DI_CUDA_TIME lines at decode sizes next to the bf16 cuBLASLt GEMM.
#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemm_fp8w.h"
#include "ops/cuda/quant.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// Random e4m3 bytes over every finite code (0x7f / 0xff are NaN) and e8m0 exponents in [lo, hi].
std::vector<uint8_t> rand_fp8(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) {
    do b = uint8_t(g() & 0xff);
    while ((b & 0x7f) == 0x7f);
  }
  return v;
}
std::vector<uint8_t> rand_e8m0(size_t n, uint64_t seed, int lo = 112, int hi = oc::kFp8wMaxScaleExp) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(d(g));
  return v;
}
// Host dequantisation of [rows, K] (e8m0 grid [ceil(rows/sr), ceil(K/sk)]) to bf16 bits.
std::vector<uint16_t> host_dequant(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int64_t rows,
                                   int64_t K, int64_t sr = 128, int64_t sk = 128) {
  const int64_t kb = (K + sk - 1) / sk;
  std::vector<uint16_t> o(size_t(rows * K));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k)
      o[size_t(r * K + k)] =
          f32_to_bf16(fp8e4m3_to_f32(w[size_t(r * K + k)]) * e8m0_to_f32(s[size_t((r / sr) * kb + k / sk)]));
  return o;
}

struct Case {
  int64_t M, N, K, batch;
  DType out;
  int64_t sr = 128;  // scale rows
  int64_t sk = 128;  // inputs per scale column (V4.1: 32x32 blocks)
};
std::string name(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " batch=" + std::to_string(c.batch) + (c.out == DType::kF32 ? " f32" : " bf16") +
         (c.sr != 128 ? " scale_rows=" + std::to_string(c.sr) : "") +
         (c.sk != 128 ? " scale_k=" + std::to_string(c.sk) : "");
}

// x [M, batch*K] (ldx = batch*K + 8: padded rows), y [M, batch*N] (ldy = batch*N + 3), W [batch*N, K].
TEST(CudaGemmFp8w, MatchesHostTwinAndBf16PathBitForBit) {
  DI_REQUIRE_GPU();
  const int sms = device_info().num_sms;
  const std::vector<Case> cases = {{1, 333, 400, 1, DType::kF32},   {7, 1000, 1040, 1, DType::kBF16},
                                   {13, 200, 4096, 1, DType::kF32}, {64, 520, 256, 1, DType::kF32},
                                   {133, 96, 512, 1, DType::kBF16}, {5, 200, 384, 3, DType::kF32},
                                   {33, 130, 1024, 2, DType::kBF16}, {2, 4096, 128, 1, DType::kF32},
                                   {3, 96, 272, 2, DType::kF32, 16},
                                   // K split over a cluster of 8 (one row block) with 64 tokens; odd N,
                                   // K % 128 != 0, batched, with every token-tile variant
                                   {64, 130, 8192, 1, DType::kF32},  {40, 77, 1040, 3, DType::kF32},
                                   {17, 1000, 2048, 1, DType::kBF16, 32}, {11, 64, 4096, 1, DType::kBF16},
                                   // V4.1's 32x32 blocks (and 64 along K): K % 128 != 0, split K,
                                   // batched (wo_a), rows not a multiple of the block
                                   {1, 333, 416, 1, DType::kF32, 32, 32}, {9, 1000, 5120, 1, DType::kBF16, 32, 32},
                                   {64, 130, 8192, 1, DType::kF32, 32, 32}, {5, 200, 352, 3, DType::kF32, 32, 32},
                                   {3, 96, 272, 2, DType::kF32, 16, 32},   {70, 96, 320, 1, DType::kF32, 32, 64}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const int64_t rows = c.batch * c.N, ldx = c.batch * c.K + 8, ldy = c.batch * c.N + 3;
    const std::vector<float> xf = bf16_round(randn(size_t(c.M * ldx), ++seed));
    const std::vector<uint8_t> w = rand_fp8(size_t(rows * c.K), ++seed);
    const std::vector<uint8_t> s = rand_e8m0(size_t((rows + c.sr - 1) / c.sr * ((c.K + c.sk - 1) / c.sk)), ++seed);
    const std::vector<uint16_t> wd = host_dequant(w, s, rows, c.K, c.sr, c.sk);
    // host twin: y[m][b*N + n] = Σ_k x[m][b*K + k] · W[b*N + n][k]
    std::vector<float> ref(size_t(c.M * c.batch * c.N));
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t n = 0; n < c.N; ++n) {
          double a = 0;
          const uint16_t* wr = wd.data() + (b * c.N + n) * c.K;
          for (int64_t k = 0; k < c.K; ++k) a += double(xf[size_t(m * ldx + b * c.K + k)]) * bf16_to_f32(wr[k]);
          ref[size_t((m * c.batch + b) * c.N + n)] = float(a);
        }
    DevArray<uint16_t> dx(to_bf16(xf)), dwd(size_t(rows * c.K)), dwd2(size_t(rows * c.K));
    DevArray<uint8_t> dw(w), ds(s);
    const size_t ob = c.out == DType::kF32 ? 4 : 2;
    DevArray<uint8_t> y1(size_t(c.M * ldy) * ob), y2(size_t(c.M * ldy) * ob);
    const size_t wsb = oc::fp8w_workspace_bytes(c.M, c.N, c.K, c.batch, sms);
    DevArray<float> ws(wsb / 4 + 1);
    oc::Fp8wGemmParams p{.x = dx.get(), .ldx = ldx, .w = dw.get(), .scale = ds.get(), .scale_rows = c.sr,
                         .scale_k = c.sk, .y = y1.get(), .ldy = ldy,
                         .out_dtype = c.out, .M = c.M, .N = c.N, .K = c.K, .batch = c.batch,
                         .batch_stride_x = c.K, .batch_stride_y = c.N, .workspace = ws.get(),
                         .workspace_bytes = wsb, .num_sms = sms};
    y1.poison();
    ws.poison();
    oc::gemm_fp8w(p, nullptr);
    // The pipeline depth (default rule, session 14's fixed depth, shallowest, deepest) changes
    // nothing but timing: every token row has the default launch's bits.
    const std::vector<uint8_t> h_default = y1.download();
    const size_t row_bytes = size_t(c.batch * c.N) * ob;
    for (int stages : {-1, 2, 3, 16}) {
      oc::Fp8wGemmParams q = p;
      q.stages = stages;
      q.y = y2.get();
      y2.poison();
      oc::gemm_fp8w(q, nullptr);
      const std::vector<uint8_t> h = y2.download();
      int differ = 0;
      for (int64_t m = 0; m < c.M; ++m)
        differ += std::memcmp(h.data() + size_t(m * ldy) * ob, h_default.data() + size_t(m * ldy) * ob, row_bytes) != 0;
      EXPECT_EQ(differ, 0) << name(c) << ": stages=" << stages << " (depth " << oc::fp8w_stages(q) << " vs "
                           << oc::fp8w_stages(p) << ") changes " << differ << " of " << c.M << " token rows";
    }
    // dequantised weights: this module's kernel and quant.h's agree with the host bit for bit
    dwd.poison();
    dwd2.poison();
    oc::dequant_fp8w_bf16({.w = dw.get(), .scale = ds.get(), .out = dwd.get(), .N = rows, .K = c.K, .scale_rows = c.sr,
                           .scale_k = c.sk},
                          nullptr);
    EXPECT_TRUE(dwd.download() == wd) << name(c) << ": dequant_fp8w_bf16 differs from the host";
    if (c.sr == 128 && c.sk == 128) {
      oc::dequant_fp8_blockwise({.w = dw.get(), .scale = ds.get(), .scale_dtype = DType::kE8M0, .out = dwd2.get(),
                                 .N = rows, .K = c.K},
                                nullptr);
      EXPECT_TRUE(dwd2.download() == wd) << name(c) << ": dequant_fp8_blockwise differs from the host";
    }
    p.w = nullptr;
    p.scale = nullptr;
    p.w_bf16 = dwd.get();
    p.y = y2.get();
    y2.poison();
    oc::gemm_fp8w(p, nullptr);
    const std::vector<uint8_t> h1 = y1.download(), h2 = y2.download();
    std::vector<float> out;
    bool same = true;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t j = 0; j < c.batch * c.N; ++j) {
        const size_t o = size_t(m * ldy + j) * ob;
        same = same && std::memcmp(h1.data() + o, h2.data() + o, ob) == 0;
        float v;
        if (ob == 4) {
          std::memcpy(&v, h1.data() + o, 4);
        } else {
          uint16_t hb;
          std::memcpy(&hb, h1.data() + o, 2);
          v = bf16_to_f32(hb);
        }
        out.push_back(v);
      }
    EXPECT_TRUE(same) << name(c) << ": FP8 path differs from the bf16 path over the dequantised weights";
    report("gemm_fp8w", name(c), max_rel_err(out, ref), c.out == DType::kF32 ? 2e-5 : 8e-3);
    std::printf("DI_CUDA_ERR|gemm_fp8w_bitexact|%s|%d|0|%s\n", name(c).c_str(), same ? 0 : 1, same ? "PASS" : "FAIL");
  }
}

TEST(CudaGemmFp8w, TypedErrors) {
  // Validation runs before any launch: no GPU needed.
  alignas(16) static uint8_t buf[64];
  oc::Fp8wGemmParams p{.x = buf, .ldx = 32, .w = buf, .scale = buf, .y = buf, .ldy = 8, .M = 1, .N = 8, .K = 32};
  auto bad = p;
  bad.K = 40;
  bad.ldx = 40;
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);  // K % 16
  bad = p;
  bad.x = nullptr;
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  bad = p;
  bad.w_bf16 = buf;  // both weights
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  bad = p;
  bad.ldx = 36;  // not a multiple of 8
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  bad = p;
  bad.out_dtype = DType::kI32;
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  // K splits are summed inside the kernel's cluster: no workspace for any shape
  EXPECT_EQ(oc::fp8w_workspace_bytes(64, 64, 8192, 1, 132), 0u);
  EXPECT_GT(oc::fp8w_splits(1, 64, 8192, 1, 132), 1);
  EXPECT_LE(oc::fp8w_splits(1, 64, 8192, 1, 132), 8);
  bad = p;
  bad.scale_rows = 48;  // does not divide 128
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  bad = p;
  bad.scale_k = 16;  // 128, 64 or 32 only
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  for (int stages : {-2, 1, 17}) {  // 0, -1 or a depth of 2..16
    bad = p;
    bad.stages = stages;
    EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument) << "stages=" << stages;
  }
  EXPECT_THROW(oc::dequant_fp8w_bf16({.w = buf, .scale = buf, .out = buf, .N = 2, .K = 32, .scale_k = 48}, nullptr),
               InvalidArgument);
  EXPECT_THROW(oc::dequant_fp8w_bf16({.w = buf, .scale = buf, .out = buf, .N = 2, .K = 20}, nullptr), InvalidArgument);
}

// Batch invariance: a token's output bits do not depend on M or on its neighbours, for K-split
// (cluster) and unsplit shapes, every token-tile variant and M > 64 (chunks).
TEST(CudaGemmFp8w, BatchInvariant) {
  DI_REQUIRE_GPU();
  const int sms = device_info().num_sms;
  struct Shape {
    int64_t N, K, batch;
  };
  uint64_t seed = 900;
  for (const Shape& sh : {Shape{200, 4096, 1}, Shape{4096, 1024, 1}, Shape{96, 1040, 3}}) {
    for (DType out : {DType::kBF16, DType::kF32}) {
      const int64_t Mmax = 133, rows = sh.batch * sh.N, ldx = sh.batch * sh.K, ldy = sh.batch * sh.N;
      const size_t ob = out == DType::kF32 ? 4 : 2;
      DevArray<uint16_t> dx(to_bf16(randn(size_t(Mmax * ldx), ++seed)));
      DevArray<uint8_t> dw(rand_fp8(size_t(rows * sh.K), ++seed));
      DevArray<uint8_t> ds(rand_e8m0(size_t((rows + 127) / 128 * ((sh.K + 127) / 128)), ++seed));
      auto run = [&](int64_t m0, int64_t M) {
        DevArray<uint8_t> y(size_t(M * ldy) * ob);
        y.poison();
        oc::gemm_fp8w({.x = dx.get() + m0 * ldx, .ldx = ldx, .w = dw.get(), .scale = ds.get(), .y = y.get(),
                       .ldy = ldy, .out_dtype = out, .M = M, .N = sh.N, .K = sh.K, .batch = sh.batch,
                       .batch_stride_x = sh.K, .batch_stride_y = sh.N, .num_sms = sms},
                      nullptr);
        return y.download();
      };
      const std::vector<uint8_t> full = run(0, Mmax);
      const size_t row_bytes = size_t(ldy) * ob;
      int bad = 0, checked = 0;
      for (int64_t M : {int64_t(1), int64_t(3), int64_t(8), int64_t(13), int64_t(32), int64_t(64)}) {
        for (int64_t m0 : {int64_t(0), int64_t(5), Mmax - M}) {
          const std::vector<uint8_t> part = run(m0, M);
          for (int64_t m = 0; m < M; ++m, ++checked)
            bad += std::memcmp(part.data() + m * row_bytes, full.data() + (m0 + m) * row_bytes, row_bytes) != 0;
        }
      }
      const std::string cs = "N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K) + " batch=" +
                             std::to_string(sh.batch) + (out == DType::kF32 ? " f32" : " bf16") + " splits=" +
                             std::to_string(oc::fp8w_splits(1, sh.N, sh.K, sh.batch, sms));
      std::printf("DI_CUDA_ERR|gemm_fp8w_batch_invariant|%s|%d|0|%s\n", cs.c_str(), bad, bad ? "FAIL" : "PASS");
      EXPECT_EQ(bad, 0) << cs << ": " << bad << " of " << checked << " token rows differ from the M=133 run";
    }
  }
}

// Per-launch time of `fn` replayed from a CUDA graph of `n` launches (no host launch gaps, like a
// captured decode step), median of 9 replays after one warm-up (µs).
double graph_us(const std::function<void(cudaStream_t)>& fn, cudaStream_t s, int n = 20) {
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

// Decode-size timings at V4-Flash's dense shapes. Weights rotate over copies that together exceed
// L2 (50 MB on the H200), so every launch reads its weights from HBM; each figure is the per-launch
// time in a CUDA graph of 20 launches (gemm_fp8w_graph) and, for the record, the median of single
// event-timed launches (gemm_fp8w_single: includes the host's launch latency). GB/s counts weight
// bytes (+ scales) only; "floor" = those bytes / 4.3 TB/s. The peer is bf16 cuBLASLt on the
// dequantised weights, timed the same way.
TEST(CudaGemmFp8w, Timing) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int sms = device_info().num_sms;
  oc::CublasLt lt;
  struct Shape {
    int64_t N, K, batch;
    const char* what;
  };
  const Shape shapes[] = {{1024, 4096, 1, "wq_a 1024x4096"},       {32768, 1024, 1, "wq_b 32768x1024"},
                          {1024, 4096, 8, "wo_a 8x(1024x4096)"},   {4096, 8192, 1, "wo_b 4096x8192"},
                          {4096, 4096, 1, "shared W1|W3 4096x4096"}, {4096, 2048, 1, "shared W2 4096x2048"},
                          {8192, 1024, 1, "indexer wq_b 8192x1024"}};
  // The split rule: the K-split shapes again with the split capped (same kernel otherwise).
  std::printf("DI_FP8W_SPLITS|shape|M|max_splits|splits|fp8w us|GB/s\n");
  for (const Shape& sh : {shapes[0], shapes[3], shapes[4], shapes[5], shapes[6]}) {
    const int64_t N = sh.N, K = sh.K, rows = sh.batch * N, kb = (K + 127) / 128;
    const size_t wbytes = size_t(rows * K), sbytes = size_t((rows + 127) / 128 * kb);
    const int copies = int(std::max<size_t>(2, (size_t(160) << 20) / wbytes + 1));
    std::vector<DevArray<uint8_t>> w8, sc;
    for (int i = 0; i < copies; ++i) {
      w8.emplace_back(rand_fp8(wbytes, 50 + i));
      sc.emplace_back(rand_e8m0(sbytes, 60 + i, 115, 125));
    }
    for (int64_t M : {int64_t(1), int64_t(8), int64_t(32), int64_t(64)})
      for (int cap : {1, 2, 4, 8}) {
        DevArray<uint16_t> x(to_bf16(randn(size_t(M * K), 7))), y(size_t(M * N));
        int it = 0;
        const double t = graph_us([&](cudaStream_t q) {
          const int i = it++ % copies;
          oc::gemm_fp8w({.x = x.get(), .ldx = K, .w = w8[i].get(), .scale = sc[i].get(), .y = y.get(), .ldy = N,
                         .M = M, .N = N, .K = K, .num_sms = sms, .max_splits = cap},
                        q);
        }, s);
        std::printf("DI_FP8W_SPLITS|%s|%lld|%d|%d|%.2f|%.0f\n", sh.what, (long long)M, cap,
                    oc::fp8w_splits(M, N, K, 1, sms, cap), t, double(wbytes + sbytes) / t / 1e3);
      }
  }
  std::printf("DI_FP8W_TABLE|shape|M|splits|fp8w us|GB/s|%% of 4.3 TB/s|cuBLASLt bf16 us|bf16 / fp8w\n");
  std::printf("DI_FP8W_STAGES|shape|M|stages asked|depth|fp8w us|GB/s\n");
  for (const Shape& sh : shapes) {
    const int64_t N = sh.N, K = sh.K, B = sh.batch, rows = B * N, kb = (K + 127) / 128;
    const size_t wbytes = size_t(rows * K), sbytes = size_t((rows + 127) / 128 * kb);
    const int copies = int(std::max<size_t>(2, (size_t(160) << 20) / wbytes + 1));
    std::vector<DevArray<uint8_t>> w8, sc;
    std::vector<DevArray<uint16_t>> wb;
    for (int i = 0; i < copies; ++i) {
      w8.emplace_back(rand_fp8(wbytes, 50 + i));
      sc.emplace_back(rand_e8m0(sbytes, 60 + i, 115, 125));
      wb.emplace_back(wbytes);
      oc::dequant_fp8w_bf16({.w = w8.back().get(), .scale = sc.back().get(), .out = wb.back().get(), .N = rows, .K = K},
                            nullptr);
    }
    for (int64_t M : {int64_t(1), int64_t(2), int64_t(4), int64_t(8), int64_t(16), int64_t(32), int64_t(64),
                      int64_t(128)}) {
      DevArray<uint16_t> x(to_bf16(randn(size_t(M * B * K), 7))), y(size_t(M * B * N));
      const size_t wsb = oc::fp8w_workspace_bytes(M, N, K, B, sms);
      DevArray<float> ws(wsb / 4 + 1);
      int it = 0;
      auto fp8w = [&](cudaStream_t q) {
        const int i = it++ % copies;
        oc::gemm_fp8w({.x = x.get(), .ldx = B * K, .w = w8[i].get(), .scale = sc[i].get(), .y = y.get(), .ldy = B * N,
                       .M = M, .N = N, .K = K, .batch = B, .batch_stride_x = K, .batch_stride_y = N,
                       .workspace = ws.get(), .workspace_bytes = wsb, .num_sms = sms},
                      q);
      };
      auto bf16 = [&](cudaStream_t q) {
        const int i = it++ % copies;
        lt.gemm({.x = x.get(), .ldx = B * K, .w = wb[i].get(), .ldw = K, .y = y.get(), .ldy = B * N, .M = M, .N = N,
                 .K = K, .batch = B, .batch_stride_x = K, .batch_stride_w = N * K, .batch_stride_y = N},
                q);
      };
      // The pipeline depth (Fp8wGemmParams::stages; -1 = session 14's fixed depth), same kernel otherwise.
      if (M == 1 || M == 8 || M == 32 || M == 64)
        for (int stages : {-1, 0, 4, 6, 8, 12, 16}) {
          int it2 = 0;
          const oc::Fp8wGemmParams q{.x = x.get(), .ldx = B * K, .w = w8[0].get(), .scale = sc[0].get(), .y = y.get(),
                                     .ldy = B * N, .M = M, .N = N, .K = K, .batch = B, .batch_stride_x = K,
                                     .batch_stride_y = N, .num_sms = sms, .stages = stages};
          const double ts = graph_us([&](cudaStream_t qs) {
            oc::Fp8wGemmParams r = q;
            const int i = it2++ % copies;
            r.w = w8[i].get();
            r.scale = sc[i].get();
            oc::gemm_fp8w(r, qs);
          }, s);
          std::printf("DI_FP8W_STAGES|%s|%lld|%d|%d|%.2f|%.0f
", sh.what, (long long)M, stages, oc::fp8w_stages(q), ts,
                      double(wbytes + sbytes) / ts / 1e3);
        }
      const double t8 = graph_us(fp8w, s), t1 = median_us(fp8w, s), tb = graph_us(bf16, s);
      const std::string shape = std::string(sh.what) + " M=" + std::to_string(M);
      const int splits = oc::fp8w_splits(M, N, K, B, sms);
      const double gb = double(wbytes + sbytes) / t8 / 1e3;
      report_time("gemm_fp8w_graph", shape + " splits=" + std::to_string(splits), t8, gbps(double(wbytes + sbytes), t8));
      report_time("gemm_fp8w_single", shape, t1, gbps(double(wbytes + sbytes), t1));
      report_time("gemm_bf16_cublaslt_graph", shape, tb, gbps(2.0 * double(wbytes), tb));
      std::printf("DI_FP8W_TABLE|%s|%lld|%d|%.2f|%.0f|%.0f%%|%.2f|%.2fx\n", sh.what, (long long)M, splits, t8, gb,
                  100.0 * gb / 4300.0, tb, tb / t8);
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda
