// DeviceAllToAllV: a variable-size all-to-all of device buffers ordered on a CUDA stream, the
// one collective the device-side expert-parallel exchange needs (model/deepseek/cuda/
// device_expert_exchange.h). Two implementations:
//   - over a device ProcessGroup (NCCL: ncclGroupStart, one ncclSend/ncclRecv per peer with
//     bytes, ncclGroupEnd; nccl_group.cpp) — the production path between GPUs;
//   - an in-process loopback (model/deepseek/cuda/loopback_all_to_all.h) that simulates W ranks
//     on one GPU, one thread and stream per simulated rank, for tests: NCCL refuses two ranks on
//     one device.
// Semantics are ProcessGroup::all_to_all_v's with device pointers: `send` holds the bytes for
// rank 0, 1, ... back to back, `recv` receives rank 0's, 1's, ... back to back; the sizes are
// host values and rank r's send_bytes[q] must equal rank q's recv_bytes[r] (exchange the counts
// first: exchange_device_counts). Completion is on the stream: work queued after the call sees
// `recv` filled and may reuse `send`. Every rank calls in the same order (lockstep).
// Stream is a cudaStream_t passed as void* so that this header needs no CUDA.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "parallel/process_group.h"

namespace deepinfer::parallel {

class DeviceAllToAllV {
 public:
  virtual ~DeviceAllToAllV() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;
  virtual void all_to_all_v(void* stream, const void* send, std::span<const int64_t> send_bytes, void* recv,
                            std::span<const int64_t> recv_bytes) = 0;
};

// send_counts [size] int64 (device) -> recv_counts [size] (device): recv_counts[q] = rank q's
// send_counts[this rank]. Fixed-size, so it needs no counts itself.
void exchange_device_counts(DeviceAllToAllV& a2a, void* stream, const int64_t* send_counts, int64_t* recv_counts);

// Over a group whose memory() is kDevice (make_nccl_group); the group must outlive the result.
// Each call sets the group's stream to the caller's (set_stream), which stays set afterwards.
// InvalidArgument for a host group (its buffers are host memory: use the host-staged path).
std::unique_ptr<DeviceAllToAllV> make_group_all_to_all(ProcessGroup& device_group);

}  // namespace deepinfer::parallel
