// The CUDA IPC hand-off's device half (kv_ipc.h has the protocol): the prefill side's exported
// staging buffers and events, the decode side's opened view of them. A build without CUDA keeps
// the types: have_cuda_ipc() is false and constructing either throws InvalidArgument, so the
// transport falls back to the host hop.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/kv_ipc.h"

namespace deepinfer::server {

bool have_cuda_ipc();  // this build has the CUDA runtime
// hostname + "/" + the kernel's boot id: two processes with the same id share a host (and so
// may open each other's IPC handles).
std::string ipc_host_id();

// Prefill side: kIpcBuffers device buffers of `buffer_bytes` on `device`, each with an
// interprocess event, exported once (hello()). Calls come from one thread (the pair's sender).
class IpcExporter {
 public:
  // CudaError / OutOfMemory when the device cannot give them (the caller falls back to host).
  IpcExporter(int device, size_t buffer_bytes);
  ~IpcExporter();
  IpcExporter(const IpcExporter&) = delete;
  IpcExporter& operator=(const IpcExporter&) = delete;
  // The offer: handles, device uuid, host id, pid, buffer size.
  IpcHello hello() const;
  size_t buffer_bytes() const;
  // Queues a copy of `bytes` of device memory `src` (on this exporter's device) into buffer `i`
  // on the exporter's stream and records buffer i's event after it; returns at once. finish()
  // waits for it (then `src` may be freed). The caller owns buffer i (StagingRing) until acked.
  void stage(uint32_t i, const void* src, size_t bytes);
  void finish();
  // The host hop for a device payload (a bundle too large for the staging, or a pair that fell
  // back): `bytes` of device memory of `device` into host bytes; synchronous.
  static std::vector<uint8_t> to_host(const void* src, size_t bytes, int device);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Decode side: the peer's buffers and events opened on `device` (cudaIpcOpenMemHandle with lazy
// peer access, cudaIpcOpenEventHandle). Throws (CudaError, InvalidArgument) with the reason when
// they cannot be opened: another host, a device without peer access, no CUDA.
class IpcImporter {
 public:
  IpcImporter(const IpcHello& hello, int device);
  ~IpcImporter();  // closes the handles: every bundle reading them must be gone first
  IpcImporter(const IpcImporter&) = delete;
  IpcImporter& operator=(const IpcImporter&) = delete;
  // Blocks the calling thread until the peer's last copy into buffer i (its event) completed.
  void wait(uint32_t i) const;
  const void* buffer(uint32_t i) const;
  uint64_t buffer_bytes() const;
  int device() const;
  bool same_device() const;  // the peer's buffers live on this very GPU (else read over the link)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
