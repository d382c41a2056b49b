#include "ops/cpu/compressor.h"
#include "ops/cuda/compressor.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

constexpr double kTol = 2e-6;  // fp32 both sides, same slot order

void run_case(int64_t m, bool overlap, int64_t d, int64_t first_block, int64_t n_blocks, int64_t pad, uint64_t seed) {
  const int64_t width = overlap ? 2 * d : d, ld = width + pad;
  const int64_t row0 = std::max<int64_t>(overlap ? m * (first_block - 1) : m * first_block, 0);
  const int64_t n_rows = m * (first_block + n_blocks) - row0 + 3;  // a few pending rows past the last block
  std::vector<float> a = randn(n_rows * ld, seed), z = randn(n_rows * ld, seed + 1, 2.0f);
  std::vector<float> ref(n_blocks * d);
  ops::cpu::CompressorPoolArgs args{.a = a.data(), .z = z.data(), .row0 = row0, .n_rows = n_rows, .width = width,
                                    .row_stride = ld, .ratio = m, .overlap = overlap, .first_block = first_block,
                                    .n_blocks = n_blocks, .out = ref.data()};
  ops::cpu::compressor_pool(args);
  DevArray<float> da(a), dz(z), dout(n_blocks * d);
  dout.poison();
  oc::compressor_pool({.a = da.get(), .z = dz.get(), .row0 = row0, .n_rows = n_rows, .width = width,
                       .row_stride = ld, .ratio = m, .overlap = overlap, .first_block = first_block,
                       .n_blocks = n_blocks, .out = dout.get()},
                      nullptr);
  const std::string cs = std::string(overlap ? "CSA" : "HCA") + " m=" + std::to_string(m) + " d=" + std::to_string(d) +
                         " blocks " + std::to_string(first_block) + "+" + std::to_string(n_blocks);
  report("compressor_pool", cs, max_rel_err(dout.download(), ref), kTol);
}

TEST(CudaCompressor, PoolMatchesCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 6000;
  for (int64_t nb : {int64_t(1), int64_t(7), int64_t(133)}) {
    run_case(4, true, 512, 0, nb, 0, ++seed);    // CSA from the start (block 0 has no A-slots)
    run_case(4, true, 512, 5, nb, 8, ++seed);    // CSA chunk boundary, strided rows
    run_case(4, true, 128, 3, nb, 0, ++seed);    // indexer compressor
    run_case(128, false, 512, 2, std::min<int64_t>(nb, 7), 0, ++seed);  // HCA
  }
}

TEST(CudaCompressor, RejectsMissingTokens) {
  float f = 0;
  EXPECT_THROW(oc::compressor_pool({.a = &f, .z = &f, .row0 = 4, .n_rows = 8, .width = 16, .ratio = 4,
                                    .overlap = true, .first_block = 1, .n_blocks = 1, .out = &f},
                                   nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
