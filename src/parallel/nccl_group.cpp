#include "parallel/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/logging.h"

namespace deepinfer::parallel {
namespace {

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(ProcessGroup& bootstrap, int device, std::string name)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), device_(device), name_(std::move(name)) {
    const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
    if (nvls && std::strcmp(nvls, "0") != 0) DI_WARN("NCCL_NVLS_ENABLE=", nvls, " overridden to 0 (NVLink multicast stays off)");
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclUniqueId id{};
    if (rank_ == 0) nccl("ncclGetUniqueId", ncclGetUniqueId(&id));
    bootstrap.broadcast(&id, sizeof(id), 0);
    cuda("cudaSetDevice", cudaSetDevice(device_));
    nccl("ncclCommInitRank", ncclCommInitRank(&comm_, size_, id, rank_));
    cuda("cudaMalloc", cudaMalloc(&scratch_, 64));
  }
  ~NcclGroup() override {
    if (scratch_) cudaFree(scratch_);
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return detail::str_cat("nccl '", name_, "', ", size_, " ranks (rank ", rank_, " on cuda:", device_, ")");
  }
  Memory memory() const override { return Memory::kDevice; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void all_to_all_v(const void* send, std::span<const int64_t> send_bytes, void* recv,
                    std::span<const int64_t> recv_bytes) override {
    DI_CHECK(int64_t(send_bytes.size()) == size_ && int64_t(recv_bytes.size()) == size_,
             "nccl all_to_all_v: sizes for ", send_bytes.size(), "/", recv_bytes.size(), " ranks, group of ", size_);
    const auto* s = static_cast<const uint8_t*>(send);
    auto* r = static_cast<uint8_t*>(recv);
    nccl("ncclGroupStart", ncclGroupStart());
    int64_t so = 0, ro = 0;
    for (int q = 0; q < size_; ++q) {
      if (send_bytes[size_t(q)] > 0)
        nccl("ncclSend", ncclSend(s + so, size_t(send_bytes[size_t(q)]), ncclUint8, q, comm_, stream_));
      if (recv_bytes[size_t(q)] > 0)
        nccl("ncclRecv", ncclRecv(r + ro, size_t(recv_bytes[size_t(q)]), ncclUint8, q, comm_, stream_));
      so += send_bytes[size_t(q)];
      ro += recv_bytes[size_t(q)];
    }
    nccl("ncclGroupEnd", ncclGroupEnd());
  }

  void all_gather_v(const void* send, int64_t send_bytes, void* recv, std::span<const int64_t> recv_bytes) override {
    DI_CHECK(int64_t(recv_bytes.size()) == size_ && recv_bytes[size_t(rank_)] == send_bytes,
             "nccl all_gather_v: sizes disagree with this rank's ", send_bytes, " bytes");
    auto* r = static_cast<uint8_t*>(recv);
    nccl("ncclGroupStart", ncclGroupStart());
    int64_t off = 0;
    for (int q = 0; q < size_; ++q) {
      const int64_t n = recv_bytes[size_t(q)];
      if (n > 0) nccl("ncclBroadcast", ncclBroadcast(q == rank_ ? send : r + off, r + off, size_t(n), ncclUint8, q, comm_, stream_));
      off += n;
    }
    nccl("ncclGroupEnd", ncclGroupEnd());
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    if (bytes > 0) nccl("ncclBroadcast", ncclBroadcast(data, data, size_t(bytes), ncclUint8, root, comm_, stream_));
  }
  void all_reduce(void* data, int64_t count, ReduceType type, ReduceOp op) override {
    if (count > 0) nccl("ncclAllReduce", ncclAllReduce(data, data, size_t(count), dtype(type), redop(op), comm_, stream_));
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, ReduceType type) override {
    if (count > 0) nccl("ncclReduceScatter", ncclReduceScatter(send, recv, size_t(count), dtype(type), ncclSum, comm_, stream_));
  }
  void barrier() override {
    nccl("ncclAllReduce", ncclAllReduce(scratch_, scratch_, 1, ncclInt64, ncclSum, comm_, stream_));
    cuda("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  }

 private:
  static ncclDataType_t dtype(ReduceType t) { return t == ReduceType::kF32 ? ncclFloat32 : ncclInt64; }
  static ncclRedOp_t redop(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMax ? ncclMax : ncclMin; }
  void nccl(const char* what, ncclResult_t r) const {
    if (r != ncclSuccess && r != ncclInProgress)
      DI_THROW(InternalError, describe(), ": ", what, " failed: ", ncclGetErrorString(r),
               r == ncclRemoteError ? " (a peer rank failed)" : "");
  }
  void cuda(const char* what, cudaError_t e) const {
    if (e != cudaSuccess) DI_THROW(InternalError, describe(), ": ", what, " failed: ", cudaGetErrorString(e));
  }

  int rank_, size_, device_;
  std::string name_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(ProcessGroup& bootstrap, int device, const std::string& name) {
  DI_CHECK(bootstrap.memory() == Memory::kHost, "make_nccl_group: the bootstrap group must be a host group");
  return std::make_unique<NcclGroup>(bootstrap, device, name);
}
bool have_nccl() { return true; }

}  // namespace deepinfer::parallel
