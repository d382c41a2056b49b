// Runtime layer: owners, allocator hook, copies, graphs, typed errors, memory plan.
#include "ops/cuda/norm.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;

TEST(CudaRuntime, MemoryPlanFitsAndNamesTermsWhenNot) {
  // Pure host logic: runs without a GPU.
  MemoryPlanRequest req{.weight_bytes = size_t(100) << 30, .activation_bytes = size_t(4) << 30,
                        .graph_pool_bytes = size_t(1) << 30, .min_cache_bytes = size_t(2) << 30};
  const size_t total = size_t(140) << 30;
  MemoryPlan p = plan_device_memory(req, total, total);
  EXPECT_EQ(p.cache_bytes, p.usable_bytes - (size_t(105) << 30));
  req.weight_bytes = size_t(156) << 30;  // V4-Flash main weights on one H200
  try {
    plan_device_memory(req, total, total);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("weights 159744 MiB"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_device_memory({.utilization = 1.5}, total, total), InvalidArgument);
}

TEST(CudaRuntime, DeviceCountNeverThrows) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(cuda_unavailable_reason().empty());
  }
}

TEST(CudaRuntime, LaunchersRejectBadArgumentsBeforeTouchingTheDevice) {
  ops::cuda::RmsNormParams p;
  p.rows = 3;
  p.dim = 0;
  EXPECT_THROW(ops::cuda::rmsnorm(p, nullptr), InvalidArgument);
}

TEST(CudaRuntime, TensorOnDeviceRoundTrip) {
  DI_REQUIRE_GPU();
  register_cuda_allocator();
  std::vector<float> v = randn(133 * 7, 1);
  Tensor h = Tensor::from_vector(v, {133, 7});
  Tensor d = to_device(h);
  EXPECT_EQ(d.device(), Device::cuda());
  Tensor back = to_host(d);
  EXPECT_EQ(0, std::memcmp(back.raw_data(), h.raw_data(), h.nbytes()));
  Tensor e = Tensor::empty({5, 3}, DType::kBF16, Device::cuda());
  EXPECT_EQ(e.nbytes(), 30u);
}

TEST(CudaRuntime, OutOfMemoryIsTyped) {
  DI_REQUIRE_GPU();
  EXPECT_THROW(DeviceBuffer(size_t(1) << 52), OutOfMemory);
  // The failed allocation must not poison later calls.
  DeviceBuffer ok(1024);
  EXPECT_NE(ok.data(), nullptr);
}

TEST(CudaRuntime, OwnersMoveAndGraphReplayMatchesDirectLaunch) {
  DI_REQUIRE_GPU();
  Stream s;
  Stream s2 = std::move(s);
  const int64_t rows = 7, dim = 4096;
  std::vector<float> x = randn(rows * dim, 2);
  DevArray<float> dx(x), dy1(rows * dim), dy2(rows * dim);
  ops::cuda::RmsNormParams p{.x = dx.get(), .x_dtype = DType::kF32, .x_stride = dim, .w = nullptr,
                             .y = dy1.get(), .y_dtype = DType::kF32, .y_stride = dim, .rows = rows, .dim = dim};
  dy1.poison();
  dy2.poison();
  ops::cuda::rmsnorm(p, s2.get());
  CudaGraph g;
  p.y = dy2.get();
  g.begin_capture(s2.get());
  ops::cuda::rmsnorm(p, s2.get());
  g.end_capture();
  Event t0(true), t1(true);
  t0.record(s2.get());
  for (int i = 0; i < 3; ++i) g.replay(s2.get());
  t1.record(s2.get());
  s2.synchronize();
  EXPECT_GE(t1.elapsed_ms_since(t0), 0.f);
  EXPECT_EQ(dy1.download(), dy2.download());
  PinnedBuffer pin(1 << 20);
  PinnedBuffer pin2 = std::move(pin);
  EXPECT_EQ(pin.data(), nullptr);
  EXPECT_NE(pin2.data(), nullptr);
}

}  // namespace
}  // namespace deepinfer::cuda
