#include "server/kv_ipc_device.h"

#include <unistd.h>

#include <cstring>
#include <fstream>

#include "deepinfer/error.h"

#if defined(DEEPINFER_HAVE_CUDA_IPC)
#include <cuda_runtime_api.h>

#include "ops/cuda/runtime.h"
#endif

namespace deepinfer::server {

std::string ipc_host_id() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(name) + "/" + boot;
}

#if defined(DEEPINFER_HAVE_CUDA_IPC)
static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes && sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes,
              "the hello carries CUDA's 64-byte IPC handles");

bool have_cuda_ipc() { return true; }

namespace {
std::array<uint8_t, 16> device_uuid(int device) {
  cudaDeviceProp p{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  std::array<uint8_t, 16> u{};
  std::memcpy(u.data(), &p.uuid, u.size());
  return u;
}
}  // namespace

struct IpcExporter::Impl {
  int device = 0;
  size_t bytes = 0;
  std::vector<deepinfer::cuda::DeviceBuffer> buffers;  // [kIpcBuffers] plain cudaMalloc: pool memory does not export
  std::vector<cudaEvent_t> events;                     // [kIpcBuffers] interprocess, no timing
  deepinfer::cuda::Stream stream;                      // the staging copies, apart from the engine's
  explicit Impl(int d) : device(d), stream(stream_on(d)) {}
  static deepinfer::cuda::Stream stream_on(int d) {
    DI_CUDA_CHECK(cudaSetDevice(d));  // a stream belongs to the device current at its creation
    return deepinfer::cuda::Stream();
  }
  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

IpcExporter::IpcExporter(int device, size_t buffer_bytes) : impl_(std::make_unique<Impl>(device)) {
  if (buffer_bytes == 0) DI_THROW(InvalidArgument, "IpcExporter: a staging buffer of 0 bytes");
  impl_->bytes = buffer_bytes;
  for (uint32_t i = 0; i < kIpcBuffers; ++i) {
    impl_->buffers.emplace_back(buffer_bytes, device);
    cudaEvent_t e = nullptr;
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming));
    impl_->events.push_back(e);
  }
}

IpcExporter::~IpcExporter() = default;

size_t IpcExporter::buffer_bytes() const { return impl_->bytes; }

IpcHello IpcExporter::hello() const {
  IpcHello h;
  h.offer = true;
  h.host_id = ipc_host_id();
  h.pid = int64_t(getpid());
  h.device_uuid = device_uuid(impl_->device);
  h.buffer_bytes = impl_->bytes;
  DI_CUDA_CHECK(cudaSetDevice(impl_->device));
  for (uint32_t i = 0; i < kIpcBuffers; ++i) {
    cudaIpcMemHandle_t m;
    DI_CUDA_CHECK(cudaIpcGetMemHandle(&m, impl_->buffers[i].data()));
    cudaIpcEventHandle_t e;
    DI_CUDA_CHECK(cudaIpcGetEventHandle(&e, impl_->events[i]));
    IpcHandle a, b;
    std::memcpy(a.data(), &m, a.size());
    std::memcpy(b.data(), &e, b.size());
    h.mem_handles.push_back(a);
    h.event_handles.push_back(b);
  }
  return h;
}

void IpcExporter::stage(uint32_t i, const void* src, size_t bytes) {
  if (i >= kIpcBuffers || bytes > impl_->bytes)
    DI_THROW(InvalidArgument, "IpcExporter::stage: buffer ", i, ", ", bytes, " bytes (", kIpcBuffers, " buffers of ",
             impl_->bytes, ")");
  DI_CUDA_CHECK(cudaSetDevice(impl_->device));
  if (bytes) DI_CUDA_CHECK(cudaMemcpyAsync(impl_->buffers[i].data(), src, bytes, cudaMemcpyDeviceToDevice, impl_->stream.get()));
  DI_CUDA_CHECK(cudaEventRecord(impl_->events[i], impl_->stream.get()));
}

void IpcExporter::finish() {
  DI_CUDA_CHECK(cudaSetDevice(impl_->device));
  impl_->stream.synchronize();
}

std::vector<uint8_t> IpcExporter::to_host(const void* src, size_t bytes, int device) {
  std::vector<uint8_t> out(bytes);
  DI_CUDA_CHECK(cudaSetDevice(device));
  if (bytes) DI_CUDA_CHECK(cudaMemcpy(out.data(), src, bytes, cudaMemcpyDeviceToHost));
  return out;
}

struct IpcImporter::Impl {
  int device = 0;
  uint64_t bytes = 0;
  bool same = false;
  std::vector<void*> buffers;        // [kIpcBuffers] the peer's memory mapped here
  std::vector<cudaEvent_t> events;   // [kIpcBuffers] the peer's events
  ~Impl() {
    cudaSetDevice(device);
    for (void* p : buffers) cudaIpcCloseMemHandle(p);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

IpcImporter::IpcImporter(const IpcHello& h, int device) : impl_(std::make_unique<Impl>()) {
  if (!h.offer) DI_THROW(InvalidArgument, "KV IPC: the peer offered no buffers (", h.reason, ")");
  if (h.host_id != ipc_host_id())
    DI_THROW(InvalidArgument, "KV IPC: the peer runs on another host (", h.host_id, ", this one ", ipc_host_id(), ")");
  impl_->device = device;
  impl_->bytes = h.buffer_bytes;
  impl_->same = h.device_uuid == device_uuid(device);
  DI_CUDA_CHECK(cudaSetDevice(device));
  for (uint32_t i = 0; i < kIpcBuffers; ++i) {
    cudaIpcMemHandle_t m;
    std::memcpy(&m, h.mem_handles[i].data(), sizeof m);
    void* p = nullptr;
    // Lazy peer access: a buffer on another GPU of the host maps where peer access is possible;
    // where it is not, this fails and the pair uses the host hop.
    DI_CUDA_CHECK(cudaIpcOpenMemHandle(&p, m, cudaIpcMemLazyEnablePeerAccess));
    impl_->buffers.push_back(p);
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, h.event_handles[i].data(), sizeof eh);
    cudaEvent_t e = nullptr;
    DI_CUDA_CHECK(cudaIpcOpenEventHandle(&e, eh));
    impl_->events.push_back(e);
  }
}

IpcImporter::~IpcImporter() = default;

void IpcImporter::wait(uint32_t i) const {
  DI_CUDA_CHECK(cudaSetDevice(impl_->device));
  DI_CUDA_CHECK(cudaEventSynchronize(impl_->events.at(i)));
}

const void* IpcImporter::buffer(uint32_t i) const { return impl_->buffers.at(i); }
uint64_t IpcImporter::buffer_bytes() const { return impl_->bytes; }
int IpcImporter::device() const { return impl_->device; }
bool IpcImporter::same_device() const { return impl_->same; }

#else  // no CUDA in this build: the types exist, nothing constructs

bool have_cuda_ipc() { return false; }

struct IpcExporter::Impl {};
IpcExporter::IpcExporter(int, size_t) { DI_THROW(InvalidArgument, "KV IPC: this build has no CUDA"); }
IpcExporter::~IpcExporter() = default;
IpcHello IpcExporter::hello() const { return {}; }
size_t IpcExporter::buffer_bytes() const { return 0; }
void IpcExporter::stage(uint32_t, const void*, size_t) {}
void IpcExporter::finish() {}
std::vector<uint8_t> IpcExporter::to_host(const void*, size_t, int) {
  DI_THROW(InvalidArgument, "KV IPC: this build has no CUDA (a device bundle cannot exist)");
}

struct IpcImporter::Impl {};
IpcImporter::IpcImporter(const IpcHello&, int) { DI_THROW(InvalidArgument, "KV IPC: this build has no CUDA"); }
IpcImporter::~IpcImporter() = default;
void IpcImporter::wait(uint32_t) const {}
const void* IpcImporter::buffer(uint32_t) const { return nullptr; }
uint64_t IpcImporter::buffer_bytes() const { return 0; }
int IpcImporter::device() const { return -1; }
bool IpcImporter::same_device() const { return false; }

#endif

}  // namespace deepinfer::server
