// The DeepSeek families on the CUDA backend: which formats their weights take on the device, the
// upload of a tensor table into one ModelRef, and the device memory plan, all from the same table
// (deepseek_v4/tensors.h; V4.1 builds one over its own entries, deepseek_v41/targets.h) so the plan
// and the upload cannot disagree. One uploader serves both families; what differs is described by
// DeviceFormats (V4: 128x128 FP8 blocks; V4.1: 32x32), and each part is converted and uploaded on
// its own (no whole-model host copy: the peak host memory is one entry, or one layer's experts).
//  * routed experts in their release format when the mode allows (FP4 e2m1 bytes [out, in/2] +
//    e8m0 [out, in/32], or FP8 e4m3 bytes [out, in] + e8m0 [out, ceil(in/128)] — the 128x128 block
//    scale repeated per row so W1|W3 fuse by rows); all experts of a layer in one allocation;
//  * dense FP8 linears (attention, indexer wq_b, shared expert, MTP projections, V4.1's Engram wkv)
//    in the bf16 modes as stored: e4m3 bytes [out, in] + the e8m0 grid
//    [ceil(out/scale_rows), ceil(in/block)] (block 128 or 32; scale_rows = block, or 16 for a stacked
//    W1|W3 whose halves are not block-row aligned), read by ops/cuda/gemm_fp8w (f32 power-of-two
//    checkpoint scales become e8m0 bytes);
//  * every other linear as bf16 [out, in], or f32 in exact numerics (FP8/FP4 that cannot stay as
//    stored are dequantised on the host at upload, with a warning naming them);
//  * compressor Wkv|Wgate fused [2c, D]; expert W1|W3 fused [2I, D] (one GEMM gives gate|up);
//  * f32: mHC, router bias, sinks, ape, norm weights, rope tables; hash tables as i32.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/deepseek/cuda/options.h"
#include "model/deepseek/prepared.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/tensors.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {

// What a family's checkpoint stores, as far as the device's storage choices go.
struct DeviceFormats {
  v4::WeightFormat dense = v4::WeightFormat::kBF16;    // attention / shared-expert linears as released
  v4::WeightFormat experts = v4::WeightFormat::kBF16;  // routed experts as released
  int64_t fp8_block = 128;   // square FP8 block edge (V4 128, V4.1 32)
  int64_t fp4_block = 32;    // inputs per FP4 expert scale
  int64_t hidden = 0, moe_inter = 0;
  int64_t n_experts = 0;     // routed experts per layer (pointer tables)
  int64_t rope_dim = 0;      // the two rope tables hold rope_dim/2 floats each
  const char* family = "deepseek_v4";  // log messages
};
DeviceFormats v4_device_formats(const v4::DeepseekV4Config& cfg);

// How routed experts are stored on the device: kFP4 / kFP8Block as released when the checkpoint
// has them, the mode is not kExact, widths are multiples of 32, FP4 scales per 32 / FP8 blocks of
// 128 (the expert kernels' formats) and `experts` is kNative; else dequantised (kBF16 here meaning
// "the storage dtype").
v4::WeightFormat device_expert_format(const DeviceFormats& f, Numerics numerics, ExpertPath experts);
// Whether dense FP8 linears stay FP8 (blocks of 128 or 32, not kExact, `dense` kNative).
bool device_dense_fp8(const DeviceFormats& f, Numerics numerics, DensePath dense);
// What the upload of `table` will take on the device (the memory plan), from the shapes alone.
size_t device_weight_bytes(const DeviceFormats& f, const v4::TensorTable& table, const CudaModelOptions& o);
// The largest dense-FP8 workspace a step of `tokens` tokens needs (K-split f32 workspace at or
// below kDenseFp8PrefillM tokens, bf16 dequantisation scratch above), 0 when no linear stays FP8.
void device_fp8_workspace(const DeviceFormats& f, const v4::TensorTable& table, const CudaModelOptions& o,
                          int64_t tokens, size_t* fp8_ws_bytes, size_t* wdq_bytes);

// The same for V4's config (v4_device_formats).
v4::WeightFormat v4_expert_format(const v4::DeepseekV4Config& cfg, Numerics numerics, ExpertPath experts);
bool v4_dense_fp8(const v4::DeepseekV4Config& cfg, Numerics numerics, DensePath dense);
// Bytes of one routed-expert matrix [n, k] in `f` (kFP4: n*k/2 + n*k/32 scale bytes; kFP8Block:
// n*k + n*ceil(k/128); else n*k*elem_bytes).
int64_t expert_matrix_bytes(v4::WeightFormat f, int64_t n, int64_t k, int64_t elem_bytes);

// Device storage behind a ModelRef.
struct GpuWeightStore {
  std::vector<deepinfer::cuda::DeviceBuffer> buffers;
  ModelRef refs;
  size_t bytes = 0;         // uploaded in total
  size_t expert_bytes = 0;  // of which routed experts
  int64_t dense_fp8 = 0;    // dense linears kept FP8
  int64_t dense_fp8_dequantised = 0;  // FP8 dense linears the mode wanted FP8 but had to dequantise
};

class Uploader;
// Uploads a table's entries (parts' views -> the entries' targets, which point into `st.refs`),
// then the routed experts' device pointer tables (`moe_of(layer)` names a layer's MoeRef) and sets
// every MoeRef's host_routed flag; floats the caller computes itself go through floats().
class DeviceUpload {
 public:
  DeviceUpload(const DeviceFormats& f, const CudaModelOptions& o, size_t planned_bytes, cudaStream_t stream,
               GpuWeightStore& st);
  ~DeviceUpload();
  void entries(const v4::TensorTable& table, const std::function<ds::MoeRef&(int32_t layer)>& moe_of,
               const std::vector<ds::MoeRef*>& all_moes);
  ds::VecRef floats(const float* p, int64_t n);
  // Closes the progress bar and records the bytes uploaded in the store.
  void finish();

 private:
  std::unique_ptr<Uploader> u_;
  const DeviceFormats f_;
  const CudaModelOptions& o_;
  GpuWeightStore& st_;
};

// V4's wrappers of device_weight_bytes / device_fp8_workspace.
size_t v4_device_weight_bytes(const v4::DeepseekV4Config& cfg, const v4::TensorTable& table, const CudaModelOptions& o);
void v4_fp8_workspace(const v4::DeepseekV4Config& cfg, const v4::TensorTable& table, const CudaModelOptions& o,
                      int64_t tokens, size_t* fp8_ws_bytes, size_t* wdq_bytes);

// Uploads every tensor of the table of (cfg, plan) from the loaded views `canon` to the device,
// with a progress bar against `planned_bytes`. Throws CudaError / OutOfMemory from the allocations.
std::unique_ptr<GpuWeightStore> upload_v4(const v4::DeepseekV4Config& cfg, const ModelPlan& plan,
                                          const v4::DeepseekV4Weights& canon, const CudaModelOptions& o,
                                          size_t planned_bytes, cudaStream_t stream);

}  // namespace deepinfer::model::ds::cuda
