#include "ops/cpu/gemm.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/quant.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// bf16 operands are exact in fp32, so f32 outputs differ from the fp32 CPU GEMM only by the
// summation order; bf16 outputs add one rounding.
constexpr double kTolF32 = 1e-5, kTolBf16 = 8e-3;

void run_case(oc::CublasLt& lt, int64_t M, int64_t N, int64_t K, DType out_dt, int64_t batch, uint64_t seed) {
  std::vector<float> x = bf16_round(randn(batch * M * K, seed, 1.0f));
  std::vector<float> w = bf16_round(randn(batch * N * K, seed + 1, 1.0f / std::sqrt(float(K))));
  std::vector<float> ref(batch * M * N);
  for (int64_t b = 0; b < batch; ++b)
    ops::cpu::gemm(M, N, K, x.data() + b * M * K, K, w.data() + b * N * K, K, true, ref.data() + b * M * N, N);
  DevArray<uint16_t> dx(to_bf16(x)), dw(to_bf16(w));
  oc::GemmParams p{.x = dx.get(), .ldx = K, .w = dw.get(), .ldw = K, .ldy = N, .in_dtype = DType::kBF16,
                   .out_dtype = out_dt, .M = M, .N = N, .K = K, .batch = batch, .batch_stride_x = M * K,
                   .batch_stride_w = N * K, .batch_stride_y = M * N};
  std::vector<float> out;
  if (out_dt == DType::kF32) {
    DevArray<float> dy(batch * M * N);
    dy.poison();
    p.y = dy.get();
    lt.gemm(p, nullptr);
    out = dy.download();
  } else {
    DevArray<uint16_t> dy(batch * M * N);
    dy.poison();
    p.y = dy.get();
    lt.gemm(p, nullptr);
    out = from_bf16(dy.download());
  }
  const std::string cs = std::string(out_dt == DType::kF32 ? "bf16->f32" : "bf16->bf16") + " M=" + std::to_string(M) +
                         " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                         (batch > 1 ? " batch=" + std::to_string(batch) : "");
  report("gemm", cs, max_rel_err(out, ref), out_dt == DType::kF32 ? kTolF32 : kTolBf16);
}

TEST(CudaGemm, MatchesCpuTwin) {
  DI_REQUIRE_GPU();
  oc::CublasLt lt;
  uint64_t seed = 7000;
  for (int64_t M : {int64_t(1), int64_t(7), int64_t(64), int64_t(133)}) {
    run_case(lt, M, 1024, 4096, DType::kBF16, 1, ++seed);  // wq_a shape
    run_case(lt, M, 1024, 4096, DType::kF32, 1, ++seed);
    run_case(lt, M, 256, 4096, DType::kF32, 1, ++seed);    // router logits
    run_case(lt, M, 133, 136, DType::kF32, 1, ++seed);     // odd N (unaligned rows of y)
  }
  run_case(lt, 7, 1024, 4096, DType::kBF16, 8, ++seed);  // grouped wo_a: 8 groups of [1024, 4096]
}

TEST(CudaGemm, Fp8BlockDequantIsExact) {
  DI_REQUIRE_GPU();
  const int64_t N = 300, K = 520;  // partial 128-blocks on both axes
  std::mt19937_64 g(42);
  std::vector<uint8_t> w8(N * K), sc((N + 127) / 128 * ((K + 127) / 128));
  for (auto& b : w8) {
    b = uint8_t(g());
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
  }
  for (auto& s : sc) s = uint8_t(120 + g() % 8);  // 2^-7 .. 2^0
  std::vector<float> ref(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      ref[n * K + k] = bf16_to_f32(f32_to_bf16(fp8e4m3_to_f32(w8[n * K + k]) *
                                               e8m0_to_f32(sc[(n / 128) * ((K + 127) / 128) + k / 128])));
  DevArray<uint8_t> dw(w8), ds(sc);
  DevArray<uint16_t> dout(N * K);
  dout.poison();
  oc::dequant_fp8_blockwise({.w = dw.get(), .scale = ds.get(), .scale_dtype = DType::kE8M0, .out = dout.get(),
                             .N = N, .K = K},
                            nullptr);
  std::vector<float> out = from_bf16(dout.download());
  report("dequant_fp8", "e8m0 N=300 K=520", max_rel_err(out, ref), 0.0);
}

TEST(CudaGemm, RejectsBadLeadingDims) {
  DI_REQUIRE_GPU();  // the handle needs a device
  oc::CublasLt lt(1 << 20);
  int d = 0;
  EXPECT_THROW(lt.gemm({.x = &d, .ldx = 4, .w = &d, .ldw = 8, .y = &d, .ldy = 8, .M = 1, .N = 8, .K = 8}, nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
