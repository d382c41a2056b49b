// bench/gpu_flash_bench.sh loads a 6-layer (or 8-layer) full-width V4-Flash stack on one H200 with
// the engine's default CudaModelOptions: the load-time memory plan must accept it (it once asked
// for 76 GB of activations, 69 GB of them split-KV partials sized max_tokens x 64 splits).
#include <gtest/gtest.h>

#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "ops/cuda/runtime.h"

namespace {
using namespace deepinfer;
using namespace deepinfer::model::v4;
}  // namespace

TEST(FlashStackPlan, SixAndEightLayersFitOneH200) {
  const size_t h200 = size_t(143771) << 20;
  for (int64_t layers : {6, 8}) {
    SCOPED_TRACE(layers);
    CudaModelOptions o;
    o.numerics = gpu::Numerics::kProduction;  // what the engine loads
    const CudaHostPlan p = CudaHostPlan::make(flash_stack_config(layers), o);
    EXPECT_LT(p.activation_bytes, size_t(16) << 30);
    const cuda::MemoryPlan m = cuda::plan_device_memory(
        {.weight_bytes = p.weight_bytes, .activation_bytes = p.activation_bytes,
         .min_cache_bytes = p.bytes_per_slot * 64 + p.bytes_per_block * 16, .utilization = o.utilization},
        h200, h200);
    EXPECT_GT(m.cache_bytes, size_t(4) << 30);
  }
}
