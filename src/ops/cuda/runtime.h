// CUDA runtime layer: checked calls, typed errors and move-only RAII owners for device
// resources (DeviceBuffer, PinnedBuffer, Stream, Event, CudaGraph). Everything that can fail
// throws: CudaError for a failed CUDA call (names the call, file:line and the CUDA message),
// OutOfMemory when an allocation does not fit, InvalidArgument for bad arguments. Nothing here
// holds global mutable state except the allocator hook registered with core's Storage.
//
// No GPU (CI, the dev machine): every type still compiles and links; constructing one throws
// CudaError, and `cuda_device_count()` returns 0 so callers (tests) can skip first.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "core/tensor.h"
#include "deepinfer/error.h"

namespace deepinfer {
// A CUDA runtime, driver or library call failed. `code()` is the raw status.
class CudaError : public Error {
 public:
  CudaError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};
}  // namespace deepinfer

namespace deepinfer::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

// Checks a cudaError_t-returning call. A failed cudaMalloc is still a CudaError here; the
// allocation helpers below turn it into OutOfMemory with the sizes involved.
#define DI_CUDA_CHECK(call)                                                        \
  do {                                                                             \
    cudaError_t di_err_ = (call);                                                  \
    if (di_err_ != cudaSuccess) [[unlikely]]                                       \
      ::deepinfer::cuda::throw_cuda_error(di_err_, #call, __FILE__, __LINE__);     \
  } while (0)

// After a kernel launch: the launch itself (bad grid, too much smem) reports here.
#define DI_CUDA_CHECK_LAUNCH() DI_CUDA_CHECK(cudaGetLastError())

// Number of usable devices; 0 (not an exception) when there is no driver or no GPU.
int cuda_device_count();
// Why cuda_device_count() is 0, for skip messages ("no CUDA driver", ...); empty when >0.
std::string cuda_unavailable_reason();

// What the card reports, read once per query (never hard-code SM counts or smem limits).
struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int num_sms = 0;
  size_t total_bytes = 0, free_bytes = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // max dynamic smem a kernel may opt into
};
DeviceInfo device_info(int device = 0);

// Registers the CUDA allocator with core's Storage so Tensor::empty(shape, dt, Device::cuda())
// works. Idempotent; also done automatically when this library's runtime.cpp is linked in.
void register_cuda_allocator();

// ---- owners ----

// Device memory (cudaMalloc). Move-only; freed in the destructor.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t nbytes, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size_bytes() const { return nbytes_; }
  int device() const { return device_; }

 private:
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
  int device_ = 0;
};

// Page-locked host memory (cudaMallocHost) for async copies. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t nbytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size_bytes() const { return nbytes_; }

 private:
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
};

// A non-blocking stream. Launches always take their stream explicitly.
class Stream {
 public:
  Stream();  // cudaStreamNonBlocking
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) const;
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded with timing = true).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

// A captured and instantiated CUDA graph: begin_capture(stream) ... end_capture(), then
// replay(stream) any number of times. Kernel arguments are frozen at capture: capture only
// code whose pointers and sizes stay fixed (decode at one batch size over static buffers).
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(CudaGraph&& o) noexcept;
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void begin_capture(cudaStream_t s);
  void end_capture();  // instantiates; throws CudaError if capture was invalidated
  void replay(cudaStream_t s) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  void reset();
  cudaStream_t capturing_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// ---- copies between host and device tensors ----

// Contiguous copy of a host tensor onto `dev` (synchronous on `stream`, default: legacy stream).
Tensor to_device(const Tensor& host, Device dev = Device::cuda(), cudaStream_t stream = nullptr);
// Contiguous host copy of a device tensor (synchronous).
Tensor to_host(const Tensor& dev_tensor, cudaStream_t stream = nullptr);
// Raw copies; `sync` waits for the stream before returning.
void copy_h2d(void* dst_d, const void* src_h, size_t nbytes, cudaStream_t stream, bool sync = true);
void copy_d2h(void* dst_h, const void* src_d, size_t nbytes, cudaStream_t stream, bool sync = true);

// ---- memory plan ----

// How the card's memory is split. Decided side-effect free from what the card reports, then
// applied by the caller in one place (STYLE: plan, then commit).
struct MemoryPlanRequest {
  size_t weight_bytes = 0;       // everything loaded from the checkpoint
  size_t activation_bytes = 0;   // peak per-step workspace at the largest batch
  size_t graph_pool_bytes = 0;   // CUDA graph private pools
  size_t min_cache_bytes = 0;    // smallest KV/compressed cache pool worth running with
  double utilization = 0.92;     // share of total memory the engine may take
};
struct MemoryPlan {
  size_t total_bytes = 0, usable_bytes = 0;
  size_t weight_bytes = 0, activation_bytes = 0, graph_pool_bytes = 0;
  size_t cache_bytes = 0;  // what remains for the cache pool
};
// Throws OutOfMemory naming each term when weights + activations + graphs + min cache exceed
// `utilization` of `total_bytes` (or of the free memory, when less is free).
MemoryPlan plan_device_memory(const MemoryPlanRequest& req, size_t total_bytes, size_t free_bytes);

}  // namespace deepinfer::cuda
