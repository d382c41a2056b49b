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
// Host dequantisation of [rows, K] (e8m0 grid [ceil(rows/sr), ceil(K/128)]) to bf16 bits.
std::vector<uint16_t> host_dequant(const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, int64_t rows,
                                   int64_t K, int64_t sr = 128) {
  const int64_t kb = (K + 127) / 128;
  std::vector<uint16_t> o(size_t(rows * K));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k)
      o[size_t(r * K + k)] =
          f32_to_bf16(fp8e4m3_to_f32(w[size_t(r * K + k)]) * e8m0_to_f32(s[size_t((r / sr) * kb + k / 128)]));
  return o;
}

struct Case {
  int64_t M, N, K, batch;
  DType out;
  int64_t sr = 128;  // scale rows
};
std::string name(const Case& c) {
  return "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " batch=" + std::to_string(c.batch) + (c.out == DType::kF32 ? " f32" : " bf16") +
         (c.sr != 128 ? " scale_rows=" + std::to_string(c.sr) : "");
}

// x [M, batch*K] (ldx = batch*K + 8: padded rows), y [M, batch*N] (ldy = batch*N + 3), W [batch*N, K].
TEST(CudaGemmFp8w, MatchesHostTwinAndBf16PathBitForBit) {
  DI_REQUIRE_GPU();
  const int sms = device_info().num_sms;
  const std::vector<Case> cases = {{1, 333, 400, 1, DType::kF32},   {7, 1000, 1040, 1, DType::kBF16},
                                   {13, 200, 4096, 1, DType::kF32}, {64, 520, 256, 1, DType::kF32},
                                   {133, 96, 512, 1, DType::kBF16}, {5, 200, 384, 3, DType::kF32},
                                   {33, 130, 1024, 2, DType::kBF16}, {2, 4096, 128, 1, DType::kF32},
                                   {3, 96, 272, 2, DType::kF32, 16}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const int64_t rows = c.batch * c.N, ldx = c.batch * c.K + 8, ldy = c.batch * c.N + 3;
    const std::vector<float> xf = bf16_round(randn(size_t(c.M * ldx), ++seed));
    const std::vector<uint8_t> w = rand_fp8(size_t(rows * c.K), ++seed);
    const std::vector<uint8_t> s = rand_e8m0(size_t((rows + c.sr - 1) / c.sr * ((c.K + 127) / 128)), ++seed);
    const std::vector<uint16_t> wd = host_dequant(w, s, rows, c.K, c.sr);
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
    oc::Fp8wGemmParams p{.x = dx.get(), .ldx = ldx, .w = dw.get(), .scale = ds.get(), .scale_rows = c.sr, .y = y1.get(), .ldy = ldy,
                         .out_dtype = c.out, .M = c.M, .N = c.N, .K = c.K, .batch = c.batch,
                         .batch_stride_x = c.K, .batch_stride_y = c.N, .workspace = ws.get(),
                         .workspace_bytes = wsb, .num_sms = sms};
    y1.poison();
    ws.poison();
    oc::gemm_fp8w(p, nullptr);
    // dequantised weights: this module's kernel and quant.h's agree with the host bit for bit
    dwd.poison();
    dwd2.poison();
    oc::dequant_fp8w_bf16({.w = dw.get(), .scale = ds.get(), .out = dwd.get(), .N = rows, .K = c.K, .scale_rows = c.sr},
                          nullptr);
    EXPECT_TRUE(dwd.download() == wd) << name(c) << ": dequant_fp8w_bf16 differs from the host";
    if (c.sr == 128) {
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
  bad = p;  // a K-split shape without a workspace
  bad.N = 64;
  bad.ldy = 64;
  bad.K = 8192;
  bad.ldx = 8192;
  ASSERT_GT(oc::fp8w_workspace_bytes(1, 64, 8192, 1, 132), 0u);
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  bad = p;
  bad.scale_rows = 48;  // does not divide 128
  EXPECT_THROW(oc::gemm_fp8w(bad, nullptr), InvalidArgument);
  EXPECT_THROW(oc::dequant_fp8w_bf16({.w = buf, .scale = buf, .out = buf, .N = 2, .K = 20}, nullptr), InvalidArgument);
}


// Decode-size timings. Weights rotate over copies that together exceed L2 (50 MB on the H200),
// so every launch reads its weights from HBM. GB/s counts weight bytes (+ scales) only.
TEST(CudaGemmFp8w, Timing) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int sms = device_info().num_sms;
  oc::CublasLt lt;
  struct Shape {
    int64_t N, K;
    const char* what;
  };
  for (const Shape& sh : {Shape{4096, 4096, "4096x4096"}, Shape{32768, 1024, "N=32768 K=1024 (wq_b)"},
                          Shape{1024, 32768, "N=1024 K=32768"}}) {
    const int64_t N = sh.N, K = sh.K, kb = (K + 127) / 128;
    const size_t wbytes = size_t(N * K), sbytes = size_t((N + 127) / 128 * kb);
    const int copies = int(std::max<size_t>(2, (size_t(160) << 20) / (2 * wbytes) + 1));
    std::vector<DevArray<uint8_t>> w8, sc;
    std::vector<DevArray<uint16_t>> wb;
    for (int i = 0; i < copies; ++i) {
      w8.emplace_back(rand_fp8(wbytes, 50 + i));
      sc.emplace_back(rand_e8m0(sbytes, 60 + i, 115, 125));
      wb.emplace_back(wbytes);
      oc::dequant_fp8w_bf16({.w = w8.back().get(), .scale = sc.back().get(), .out = wb.back().get(), .N = N, .K = K},
                            nullptr);
    }
    DevArray<uint16_t> scratch(wbytes);
    for (int64_t M : {int64_t(1), int64_t(8), int64_t(32), int64_t(64), int64_t(128), int64_t(256)}) {
      DevArray<uint16_t> x(to_bf16(randn(size_t(M * K), 7))), y(size_t(M * N));
      const size_t wsb = oc::fp8w_workspace_bytes(M, N, K, 1, sms);
      DevArray<float> ws(wsb / 4 + 1);
      int it = 0;
      const double t8 = median_us([&](cudaStream_t q) {
        const int i = it++ % copies;
        oc::gemm_fp8w({.x = x.get(), .ldx = K, .w = w8[i].get(), .scale = sc[i].get(), .y = y.get(), .ldy = N,
                       .M = M, .N = N, .K = K, .workspace = ws.get(), .workspace_bytes = wsb, .num_sms = sms},
                      q);
      }, s);
      it = 0;
      const double tb = median_us([&](cudaStream_t q) {
        const int i = it++ % copies;
        lt.gemm({.x = x.get(), .ldx = K, .w = wb[i].get(), .ldw = K, .y = y.get(), .ldy = N, .M = M, .N = N, .K = K}, q);
      }, s);
      it = 0;
      const double td = median_us([&](cudaStream_t q) {
        const int i = it++ % copies;
        oc::dequant_fp8w_bf16({.w = w8[i].get(), .scale = sc[i].get(), .out = scratch.get(), .N = N, .K = K}, q);
        lt.gemm({.x = x.get(), .ldx = K, .w = scratch.get(), .ldw = K, .y = y.get(), .ldy = N, .M = M, .N = N, .K = K},
                q);
      }, s);
      const std::string shape = std::string(sh.what) + " M=" + std::to_string(M);
      report_time("gemm_fp8w", shape + " splits=" + std::to_string(oc::fp8w_splits(M, N, K, 1, sms)), t8,
                  gbps(double(wbytes + sbytes), t8));
      report_time("gemm_bf16_cublaslt", shape, tb, gbps(2.0 * double(wbytes), tb));
      report_time("dequant+gemm_bf16", shape, td, gbps(double(wbytes + sbytes), td));
    }
  }
}

}  // namespace
}  // namespace deepinfer::cuda
