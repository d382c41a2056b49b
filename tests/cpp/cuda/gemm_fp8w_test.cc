// FP8 weight-only GEMM (ops/cuda/gemm_fp8w.h): against a host twin (dequantised weights, double
// sums) on random non-zero activations and random e4m3 bytes of every finite code (subnormals
// included) with random e8m0 scales, odd M/N/K, batched (wo_a-like) and K-split shapes, outputs
// poisoned first; bit-for-bit against the same weights dequantised to bf16 (dequant_fp8w_bf16,
// checked against the host and against quant.h's dequant_fp8_blockwise) through the kernel's bf16
// path; gemm_fp8w_multi (several weights, one launch) bit-identical to each weight's own launch;
// typed errors; and DI_CUDA_TIME lines at decode sizes next to the bf16 cuBLASLt GEMM, plus one
// launch against two for wq_a + wkv and the fixed cost of a tiny launch (MultiTiming).
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
  oc::Fp8wPart parts[oc::kFp8wMaxParts + 1];
  for (auto& q : parts) q = {.w = buf, .scale = buf, .y = buf, .ldy = 8, .N = 8};
  oc::Fp8wMultiParams mp{.x = buf, .ldx = 32, .M = 1, .K = 32, .parts = parts, .num_parts = 0};
  EXPECT_THROW(oc::gemm_fp8w_multi(mp, nullptr), InvalidArgument);  // no parts
  mp.num_parts = oc::kFp8wMaxParts + 1;
  EXPECT_THROW(oc::gemm_fp8w_multi(mp, nullptr), InvalidArgument);  // too many
  mp.num_parts = 2;
  parts[1].w = nullptr;
  EXPECT_THROW(oc::gemm_fp8w_multi(mp, nullptr), InvalidArgument);  // a part without its weight
  parts[1].w = buf;
  parts[1].ldy = 4;
  EXPECT_THROW(oc::gemm_fp8w_multi(mp, nullptr), InvalidArgument);  // ldy < N
  EXPECT_THROW(oc::dequant_fp8w_bf16({.w = buf, .scale = buf, .out = buf, .N = 2, .K = 32, .scale_k = 48}, nullptr),
               InvalidArgument);
  EXPECT_THROW(oc::dequant_fp8w_bf16({.w = buf, .scale = buf, .out = buf, .N = 2, .K = 20}, nullptr), InvalidArgument);
}

// gemm_fp8w_multi: parts that read the same x, fused into one launch when their splits agree,
// give every part's bits of gemm_fp8w alone (odd N, padded ldy, M over one 64-row chunk, both
// output types); parts whose splits differ fall back to one launch each.
TEST(CudaGemmFp8w, MultiMatchesSeparateLaunches) {
  DI_REQUIRE_GPU();
  const int sms = device_info().num_sms;
  struct MultiCase {
    int64_t K;
    std::vector<int64_t> N;
    bool fuses;
  };
  const std::vector<MultiCase> cases = {{1040, {333, 200, 520}, true},     // 3 splits each
                                        {4096, {1024, 512}, true},         // V4 wq_a + wkv: 8 splits
                                        {512, {96, 77, 130, 64}, true},    // 4 parts
                                        {1024, {32768, 200}, false}};      // 1 split vs 4
  uint64_t seed = 1300;
  for (const MultiCase& c : cases)
    for (DType out : {DType::kF32, DType::kBF16})
      for (int64_t M : {int64_t(1), int64_t(7), int64_t(64), int64_t(70)}) {
        const size_t ob = out == DType::kF32 ? 4 : 2;
        const int64_t ldx = c.K + 8;
        DevArray<uint16_t> dx(to_bf16(randn(size_t(M * ldx), ++seed)));
        std::vector<DevArray<uint8_t>> w, sc, yf, ys;
        std::vector<oc::Fp8wPart> parts;
        for (int64_t N : c.N) {
          w.emplace_back(rand_fp8(size_t(N * c.K), ++seed));
          sc.emplace_back(rand_e8m0(size_t((N + 127) / 128 * ((c.K + 127) / 128)), ++seed));
          yf.emplace_back(size_t(M * (N + 3)) * ob);
          ys.emplace_back(size_t(M * (N + 3)) * ob);
        }
        for (size_t i = 0; i < c.N.size(); ++i) {
          yf[i].poison();
          ys[i].poison();
          parts.push_back({.w = w[i].get(), .scale = sc[i].get(), .y = yf[i].get(), .ldy = c.N[i] + 3, .N = c.N[i]});
        }
        const oc::Fp8wMultiParams mp{.x = dx.get(), .ldx = ldx, .M = M, .K = c.K, .parts = parts.data(),
                                     .num_parts = int(parts.size()), .out_dtype = out, .num_sms = sms};
        EXPECT_EQ(oc::gemm_fp8w_multi_fuses(mp), c.fuses) << "K=" << c.K;
        oc::gemm_fp8w_multi(mp, nullptr);
        int bad = 0;
        for (size_t i = 0; i < c.N.size(); ++i) {
          oc::gemm_fp8w({.x = dx.get(), .ldx = ldx, .w = w[i].get(), .scale = sc[i].get(), .y = ys[i].get(),
                         .ldy = c.N[i] + 3, .out_dtype = out, .M = M, .N = c.N[i], .K = c.K, .num_sms = sms},
                        nullptr);
          const std::vector<uint8_t> a = yf[i].download(), b = ys[i].download();
          for (int64_t m = 0; m < M; ++m)
            bad += std::memcmp(a.data() + size_t(m * (c.N[i] + 3)) * ob, b.data() + size_t(m * (c.N[i] + 3)) * ob,
                               size_t(c.N[i]) * ob) != 0;
        }
        const std::string cs = "K=" + std::to_string(c.K) + " parts=" + std::to_string(c.N.size()) +
                               " M=" + std::to_string(M) + (out == DType::kF32 ? " f32" : " bf16");
        std::printf("DI_CUDA_ERR|gemm_fp8w_multi_bitexact|%s|%d|0|%s\n", cs.c_str(), bad, bad ? "FAIL" : "PASS");
        EXPECT_EQ(bad, 0) << cs << ": " << bad << " token rows differ from the part's own launch";
      }
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
        const double t = graph_launch_us([&](cudaStream_t q) {
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
      const double t8 = graph_launch_us(fp8w, s), t1 = median_us(fp8w, s), tb = graph_launch_us(bf16, s);
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

namespace deepinfer::cuda {
namespace {
// One launch of wq_a + wkv (V4's two projections of the attention-normed h, 1024 + 512 rows,
// K = 4096: both split 8) against the two launches, per pair of products, graph-timed, weights
// rotated beyond L2; and a tiny 128 x 1024 product whose time is the per-launch fixed cost.
TEST(CudaGemmFp8w, MultiTiming) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int sms = device_info().num_sms;
  const int64_t K = 4096, Na = 1024, Nb = 512;
  const size_t wa = size_t(Na * K), wb = size_t(Nb * K), kb = size_t((K + 127) / 128);
  const int copies = int((size_t(160) << 20) / (wa + wb) + 1);
  std::vector<DevArray<uint8_t>> A, B, SA, SB;
  for (int i = 0; i < copies; ++i) {
    A.emplace_back(rand_fp8(wa, 70 + i));
    B.emplace_back(rand_fp8(wb, 170 + i));
    SA.emplace_back(rand_e8m0(size_t(Na / 128) * kb, 270 + i, 115, 125));
    SB.emplace_back(rand_e8m0(size_t(Nb / 128) * kb, 370 + i, 115, 125));
  }
  const double bytes = double(wa + wb + (Na + Nb) / 128 * kb);
  std::printf("DI_FP8W_MULTI|M|two launches us|one launch us|saved us|GB/s one launch\n");
  for (int64_t M : {int64_t(1), int64_t(8), int64_t(32), int64_t(64)}) {
    DevArray<uint16_t> x(to_bf16(randn(size_t(M * K), 9)));
    DevArray<float> ya(size_t(M * Na)), yb(size_t(M * Nb));
    int it = 0;
    const double two = graph_launch_us([&](cudaStream_t q) {
      const int i = it++ % copies;
      oc::gemm_fp8w({.x = x.get(), .ldx = K, .w = A[i].get(), .scale = SA[i].get(), .y = ya.get(), .ldy = Na,
                     .out_dtype = DType::kF32, .M = M, .N = Na, .K = K, .num_sms = sms}, q);
      oc::gemm_fp8w({.x = x.get(), .ldx = K, .w = B[i].get(), .scale = SB[i].get(), .y = yb.get(), .ldy = Nb,
                     .out_dtype = DType::kF32, .M = M, .N = Nb, .K = K, .num_sms = sms}, q);
    }, s);
    const double one = graph_launch_us([&](cudaStream_t q) {
      const int i = it++ % copies;
      const oc::Fp8wPart parts[2] = {{.w = A[i].get(), .scale = SA[i].get(), .y = ya.get(), .ldy = Na, .N = Na},
                                     {.w = B[i].get(), .scale = SB[i].get(), .y = yb.get(), .ldy = Nb, .N = Nb}};
      oc::gemm_fp8w_multi({.x = x.get(), .ldx = K, .M = M, .K = K, .parts = parts, .num_parts = 2,
                           .out_dtype = DType::kF32, .num_sms = sms}, q);
    }, s);
    std::printf("DI_FP8W_MULTI|%lld|%.2f|%.2f|%.2f|%.0f\n", (long long)M, two, one, two - one, bytes / one / 1e3);
  }
  // The fixed cost: 128 x 1024 (128 KB, L2-resident), 20 launches in a graph, as a cluster of 4
  // (the split rule's) and as one plain block (max_splits = 1).
  const int64_t Nt = 128, Kt = 1024;
  DevArray<uint8_t> wt(rand_fp8(size_t(Nt * Kt), 5)), stt(rand_e8m0(size_t(Kt / 128), 6, 115, 125));
  DevArray<uint16_t> xt(to_bf16(randn(size_t(Kt), 8)));
  DevArray<float> yt(static_cast<size_t>(Nt));
  for (int cap : {0, 1}) {
    const double t = graph_launch_us([&](cudaStream_t q) {
      oc::gemm_fp8w({.x = xt.get(), .ldx = Kt, .w = wt.get(), .scale = stt.get(), .y = yt.get(), .ldy = Nt,
                     .out_dtype = DType::kF32, .M = 1, .N = Nt, .K = Kt, .num_sms = sms, .max_splits = cap}, q);
    }, s);
    std::printf("DI_FP8W_FIXED|128x1024 M=1 splits=%d|%.2f us\n", oc::fp8w_splits(1, Nt, Kt, 1, sms, cap), t);
  }
}
}  // namespace
}  // namespace deepinfer::cuda
