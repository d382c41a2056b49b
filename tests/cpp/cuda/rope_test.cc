#include "ops/cpu/rope.h"
#include "ops/cuda/rope.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// f32: same fp32 angle, sincos to ~1 ulp on both sides; bf16: one output rounding.
constexpr double kTolBf16 = 8e-3, kTolF32 = 2e-6;

void run_case(int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, bool yarn, bool inverse, bool bf16,
              uint64_t seed) {
  ops::cpu::YarnScaling ys{.factor = 16, .original_max_position = 65536, .beta_fast = 32, .beta_slow = 1};
  std::vector<float> inv = ops::cpu::rope_inv_freq(yarn ? 160000.0 : 10000.0, rope_dim, yarn ? &ys : nullptr);
  std::vector<float> x = randn(rows * heads * head_dim, seed);
  if (bf16) x = bf16_round(x);
  std::mt19937_64 g(seed);
  std::vector<int64_t> pos(rows);
  for (auto& p : pos) p = int64_t(g() % 1048576);  // up to max_position_embeddings
  pos[0] = 0;
  std::vector<float> ref = x;
  ops::cpu::rope_apply(ref.data(), rows, heads, head_dim, rope_dim, pos.data(), inv.data(), inverse);

  DevArray<int64_t> dpos(pos);
  DevArray<float> dinv(inv);
  std::vector<float> out;
  oc::RopeParams p{.row_stride = heads * head_dim, .head_stride = head_dim, .rows = rows, .heads = heads,
                   .head_dim = head_dim, .rope_dim = rope_dim, .pos = dpos.get(), .inv_freq = dinv.get(),
                   .inverse = inverse};
  if (bf16) {
    DevArray<uint16_t> dx(to_bf16(x));
    p.x = dx.get();
    p.dtype = DType::kBF16;
    oc::rope(p, nullptr);
    out = from_bf16(dx.download());
  } else {
    DevArray<float> dx(x);
    p.x = dx.get();
    p.dtype = DType::kF32;
    oc::rope(p, nullptr);
    out = dx.download();
  }
  const std::string cs = std::string(bf16 ? "bf16" : "f32") + " rows=" + std::to_string(rows) + " heads=" +
                         std::to_string(heads) + (yarn ? " yarn" : " base") + (inverse ? " inverse" : "");
  report(inverse ? "rope_inverse" : "rope", cs, max_rel_err(out, ref), bf16 ? kTolBf16 : kTolF32);
}

TEST(CudaRope, MatchesCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 100;
  for (int64_t rows : token_counts())
    for (bool inverse : {false, true})
      for (bool bf16 : {false, true}) {
        run_case(rows, 64, 512, 64, true, inverse, bf16, ++seed);   // q / attention output
        run_case(rows, 1, 512, 64, false, inverse, bf16, ++seed);   // window kv, SWA layer
      }
  run_case(133, 64, 128, 64, true, false, true, ++seed);  // indexer q
  run_case(7, 3, 24, 6, false, false, false, ++seed);     // odd small geometry
}

TEST(CudaRope, RejectsOddRopeDim) {
  int d = 0;
  int64_t pos = 0;
  float f = 0;
  EXPECT_THROW(oc::rope({.x = &d, .row_stride = 8, .head_stride = 8, .rows = 1, .heads = 1, .head_dim = 8,
                         .rope_dim = 3, .pos = &pos, .inv_freq = &f},
                        nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
