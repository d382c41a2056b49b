#include "ops/cuda/runtime.h"

#include <mutex>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/logging.h"

namespace deepinfer::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clear a sticky launch error so the next check reports its own failure, not this one.
  (void)cudaGetLastError();
  throw CudaError(detail::str_cat(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(err), " (",
                                  cudaGetErrorString(err), ")"),
                  int(err));
}

namespace {
cudaError_t query_count(int* n) {
  *n = 0;
  cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *n = 0;
  }
  return e;
}

std::string mib(size_t b) { return detail::str_cat(b / (1024 * 1024), " MiB"); }
}  // namespace

int cuda_device_count() {
  int n = 0;
  query_count(&n);
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  cudaError_t e = query_count(&n);
  if (e != cudaSuccess) return detail::str_cat("no usable CUDA device (", cudaGetErrorName(e), ": ", cudaGetErrorString(e), ")");
  if (n == 0) return "no CUDA device present";
  return "";
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.num_sms = p.multiProcessorCount;
  d.l2_bytes = size_t(p.l2CacheSize);
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  int prev = 0;
  DI_CUDA_CHECK(cudaGetDevice(&prev));
  DI_CUDA_CHECK(cudaSetDevice(device));
  DI_CUDA_CHECK(cudaMemGetInfo(&d.free_bytes, &d.total_bytes));
  DI_CUDA_CHECK(cudaSetDevice(prev));
  return d;
}

// ---- allocation ----

namespace {
// Allocates on `device`, turning an out-of-memory status into OutOfMemory with the sizes.
void* device_alloc(size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  int prev = 0;
  DI_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != device) DI_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, nbytes);
  if (prev != device) cudaSetDevice(prev);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    DI_THROW(OutOfMemory, "cudaMalloc of ", nbytes, " bytes (", mib(nbytes), ") on cuda:", device, " failed: ",
             mib(free_b), " free of ", mib(total_b));
  }
  if (e != cudaSuccess) throw_cuda_error(e, "cudaMalloc", __FILE__, __LINE__);
  return p;
}

std::shared_ptr<Storage> cuda_storage_alloc(size_t nbytes, Device dev) {
  void* p = device_alloc(nbytes, dev.index);
  return std::make_shared<Storage>(p, nbytes, dev, [](void* q) {
    if (q) cudaFree(q);  // destructor path: never throw
  });
}

// Linking runtime.cpp registers the allocator (any user of this library links it).
const bool g_registered = [] {
  register_cuda_allocator();
  return true;
}();
}  // namespace

void register_cuda_allocator() {
  static std::once_flag once;
  std::call_once(once, [] { Storage::register_allocator(DeviceType::kCUDA, &cuda_storage_alloc); });
}

DeviceBuffer::DeviceBuffer(size_t nbytes, int device) : nbytes_(nbytes), device_(device) {
  ptr_ = device_alloc(nbytes, device);
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), nbytes_(std::exchange(o.nbytes_, 0)), device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
    device_ = o.device_;
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(size_t nbytes) : nbytes_(nbytes) {
  if (nbytes == 0) return;
  cudaError_t e = cudaMallocHost(&ptr_, nbytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    DI_THROW(OutOfMemory, "cudaMallocHost of ", nbytes, " bytes (", mib(nbytes), ") failed");
  }
  if (e != cudaSuccess) throw_cuda_error(e, "cudaMallocHost", __FILE__, __LINE__);
}
PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), nbytes_(std::exchange(o.nbytes_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
  }
  return *this;
}

// ---- streams, events, graphs ----

Stream::Stream() { DI_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}
Stream::Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}
void Stream::synchronize() const { DI_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(bool timing) {
  DI_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}
Event::Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) cudaEventDestroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void Event::record(cudaStream_t s) const { DI_CUDA_CHECK(cudaEventRecord(e_, s)); }
void Event::synchronize() const { DI_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

namespace {
// The launch count of one replay (DEEPINFER_LOG_LEVEL=debug): kernels, copies, memsets, others.
void log_graph_nodes(cudaGraph_t g) {
  size_t n = 0;
  DI_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) DI_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  size_t kernels = 0, copies = 0, sets = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    DI_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    kernels += t == cudaGraphNodeTypeKernel;
    copies += t == cudaGraphNodeTypeMemcpy;
    sets += t == cudaGraphNodeTypeMemset;
  }
  DI_DEBUG("cuda graph captured: ", n, " nodes (", kernels, " kernels, ", copies, " memcpy, ", sets, " memset, ",
           n - kernels - copies - sets, " other)");
}
}  // namespace

CudaGraph::~CudaGraph() { reset(); }
void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}
CudaGraph::CudaGraph(CudaGraph&& o) noexcept
    : capturing_(std::exchange(o.capturing_, nullptr)),
      graph_(std::exchange(o.graph_, nullptr)),
      exec_(std::exchange(o.exec_, nullptr)) {}
CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    reset();
    capturing_ = std::exchange(o.capturing_, nullptr);
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}
void CudaGraph::begin_capture(cudaStream_t s) {
  DI_CHECK(s != nullptr, "CudaGraph: capture needs a non-default stream");
  DI_CHECK(capturing_ == nullptr, "CudaGraph: capture already in progress");
  reset();
  // Thread-local mode: other threads' unrelated CUDA calls do not invalidate this capture.
  DI_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  capturing_ = s;
}
void CudaGraph::end_capture() {
  DI_CHECK(capturing_ != nullptr, "CudaGraph: end_capture without begin_capture");
  cudaStream_t s = std::exchange(capturing_, nullptr);
  DI_CUDA_CHECK(cudaStreamEndCapture(s, &graph_));
  DI_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  if (log_level() >= LogLevel::kDebug) log_graph_nodes(graph_);
}
void CudaGraph::replay(cudaStream_t s) const {
  DI_CHECK(exec_ != nullptr, "CudaGraph: replay before a successful capture");
  DI_CUDA_CHECK(cudaGraphLaunch(exec_, s));
}

// ---- copies ----

void copy_h2d(void* dst_d, const void* src_h, size_t nbytes, cudaStream_t stream, bool sync) {
  if (nbytes == 0) return;
  DI_CUDA_CHECK(cudaMemcpyAsync(dst_d, src_h, nbytes, cudaMemcpyHostToDevice, stream));
  if (sync) DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}
void copy_d2h(void* dst_h, const void* src_d, size_t nbytes, cudaStream_t stream, bool sync) {
  if (nbytes == 0) return;
  DI_CUDA_CHECK(cudaMemcpyAsync(dst_h, src_d, nbytes, cudaMemcpyDeviceToHost, stream));
  if (sync) DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

Tensor to_device(const Tensor& host, Device dev, cudaStream_t stream) {
  if (!host.device().is_cpu()) DI_THROW(InvalidArgument, "to_device: source ", host.str(), " is not on the host");
  if (dev.is_cpu()) DI_THROW(InvalidArgument, "to_device: target must be a CUDA device, got ", dev.str());
  Tensor src = host.is_contiguous() ? host : host.contiguous();
  Tensor out = Tensor::empty(src.shape(), src.dtype(), dev);
  copy_h2d(out.raw_data(), src.raw_data(), src.nbytes(), stream);
  return out;
}

Tensor to_host(const Tensor& t, cudaStream_t stream) {
  if (t.device().is_cpu()) DI_THROW(InvalidArgument, "to_host: source ", t.str(), " is already on the host");
  if (!t.is_contiguous()) DI_THROW(InvalidArgument, "to_host: device tensor ", t.str(), " must be contiguous");
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  copy_d2h(out.raw_data(), t.raw_data(), t.nbytes(), stream);
  return out;
}

// ---- memory plan ----

MemoryPlan plan_device_memory(const MemoryPlanRequest& req, size_t total_bytes, size_t free_bytes) {
  if (req.utilization <= 0 || req.utilization > 1)
    DI_THROW(InvalidArgument, "memory plan: utilization must be in (0,1], got ", req.utilization);
  MemoryPlan p;
  p.total_bytes = total_bytes;
  size_t budget = size_t(double(total_bytes) * req.utilization);
  p.usable_bytes = budget < free_bytes ? budget : free_bytes;
  p.weight_bytes = req.weight_bytes;
  p.activation_bytes = req.activation_bytes;
  p.graph_pool_bytes = req.graph_pool_bytes;
  size_t fixed = req.weight_bytes + req.activation_bytes + req.graph_pool_bytes;
  if (fixed + req.min_cache_bytes > p.usable_bytes) {
    DI_THROW(OutOfMemory, "the model does not fit on the device: weights ", mib(req.weight_bytes), " + activations ",
             mib(req.activation_bytes), " + graph pools ", mib(req.graph_pool_bytes), " + minimum cache ",
             mib(req.min_cache_bytes), " = ", mib(fixed + req.min_cache_bytes), " > usable ", mib(p.usable_bytes),
             " (", mib(free_bytes), " free of ", mib(total_bytes), ", utilization ", req.utilization,
             "); use more GPUs (expert parallelism) or a smaller model");
  }
  p.cache_bytes = p.usable_bytes - fixed;
  return p;
}

}  // namespace deepinfer::cuda
