#include "model/deepseek/cuda/loopback_all_to_all.h"

#include <cuda_runtime_api.h>

#include <barrier>
#include <vector>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {

class LoopbackHub {
 public:
  LoopbackHub(int world, int device) : world_(world), device_(device), sync_(world), posts_(size_t(world)) {
    for (int r = 0; r < world; ++r) ready_.emplace_back(), done_.emplace_back();
  }
  struct Post {
    const uint8_t* send = nullptr;
    std::vector<int64_t> send_bytes, recv_bytes;
  };

  void exchange(int me, cudaStream_t st, const void* send, std::span<const int64_t> send_bytes, void* recv,
                std::span<const int64_t> recv_bytes) {
    DI_CHECK(int(send_bytes.size()) == world_ && int(recv_bytes.size()) == world_, "loopback all_to_all_v: sizes for ",
             send_bytes.size(), "/", recv_bytes.size(), " ranks, world of ", world_);
    DI_CUDA_CHECK(cudaSetDevice(device_));
    Post& mine = posts_[size_t(me)];
    mine.send = static_cast<const uint8_t*>(send);
    mine.send_bytes.assign(send_bytes.begin(), send_bytes.end());
    mine.recv_bytes.assign(recv_bytes.begin(), recv_bytes.end());
    ready_[size_t(me)].record(st);
    sync_.arrive_and_wait();  // every post and ready event is in place
    std::string err;
    int64_t ro = 0;
    for (int q = 0; q < world_; ++q) {
      const Post& p = posts_[size_t(q)];
      int64_t so = 0;
      for (int r = 0; r < me; ++r) so += p.send_bytes[size_t(r)];
      const int64_t n = p.send_bytes[size_t(me)];
      if (n != recv_bytes[size_t(q)] && err.empty())
        err = detail::str_cat("loopback all_to_all_v: rank ", q, " sends ", n, " bytes to rank ", me, ", which expects ",
                              recv_bytes[size_t(q)]);
      if (err.empty() && n > 0) {
        DI_CUDA_CHECK(cudaStreamWaitEvent(st, ready_[size_t(q)].get(), 0));
        DI_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(recv) + ro, p.send + so, size_t(n), cudaMemcpyDeviceToDevice, st));
      }
      ro += recv_bytes[size_t(q)];
    }
    done_[size_t(me)].record(st);
    sync_.arrive_and_wait();  // every receiver's copies are queued
    for (int q = 0; q < world_; ++q) DI_CUDA_CHECK(cudaStreamWaitEvent(st, done_[size_t(q)].get(), 0));
    // No third rendezvous needed: a rank re-records its events only in its next call, after that
    // call's first rendezvous, which every peer reaches only once it has finished this call.
    if (!err.empty()) DI_THROW(InternalError, err);
  }
  int world() const { return world_; }

 private:
  int world_, device_;
  std::barrier<> sync_;
  std::vector<Post> posts_;
  std::vector<deepinfer::cuda::Event> ready_, done_;
};

namespace {
class LoopbackEnd final : public parallel::DeviceAllToAllV {
 public:
  LoopbackEnd(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->world(); }
  std::string describe() const override {
    return detail::str_cat("loopback, ", hub_->world(), " simulated ranks (rank ", rank_, ")");
  }
  void all_to_all_v(void* stream, const void* send, std::span<const int64_t> send_bytes, void* recv,
                    std::span<const int64_t> recv_bytes) override {
    hub_->exchange(rank_, static_cast<cudaStream_t>(stream), send, send_bytes, recv, recv_bytes);
  }

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};
}  // namespace

std::shared_ptr<LoopbackHub> make_loopback_hub(int world, int device) {
  if (world < 1) DI_THROW(InvalidArgument, "loopback hub: world ", world, " must be >= 1");
  return std::make_shared<LoopbackHub>(world, device);
}
std::unique_ptr<parallel::DeviceAllToAllV> make_loopback_all_to_all(std::shared_ptr<LoopbackHub> hub, int rank) {
  if (!hub || rank < 0 || rank >= hub->world())
    DI_THROW(InvalidArgument, "loopback all-to-all: rank ", rank, " outside the hub's world");
  return std::make_unique<LoopbackEnd>(std::move(hub), rank);
}

}  // namespace deepinfer::model::ds::cuda
