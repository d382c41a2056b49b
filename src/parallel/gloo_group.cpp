#include "parallel/gloo_group.h"

#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdint>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "parallel/reduce.h"

namespace deepinfer::parallel {
namespace {

class GlooGroup final : public ProcessGroup {
 public:
  explicit GlooGroup(const GlooGroupOptions& o) : o_(o) {
    try {
      gloo::transport::tcp::attr attr(o.hostname.c_str());
      device_ = gloo::transport::tcp::CreateDevice(attr);
      gloo::rendezvous::FileStore file(o.rendezvous_dir);
      gloo::rendezvous::PrefixStore store(o.name, file);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
      ctx->setTimeout(o.timeout);
      ctx->connectFullMesh(store, device_);
      ctx_ = ctx;
    } catch (const std::exception& e) {
      DI_THROW(InternalError, "gloo group '", o.name, "' rank ", o.rank, "/", o.size, ": rendezvous in '",
               o.rendezvous_dir, "' failed: ", e.what());
    }
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  std::string describe() const override { return detail::str_cat("gloo tcp '", o_.name, "', ", o_.size, " ranks"); }
  Memory memory() const override { return Memory::kHost; }

  void all_to_all_v(const void* send, std::span<const int64_t> send_bytes, void* recv,
                    std::span<const int64_t> recv_bytes) override {
    check_sizes("all_to_all_v", send_bytes.size(), recv_bytes.size());
    guarded("all_to_all_v", [&] {
      gloo::AlltoallvOptions opts(ctx_);
      opts.setInput(nonnull(send), std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
      opts.setOutput(nonnull(recv), std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
      opts.setTag(next_tag());
      gloo::alltoallv(opts);
    });
  }

  void all_gather_v(const void* send, int64_t send_bytes, void* recv, std::span<const int64_t> recv_bytes) override {
    check_sizes("all_gather_v", size_t(o_.size), recv_bytes.size());
    DI_CHECK(recv_bytes[size_t(o_.rank)] == send_bytes, "all_gather_v: rank ", o_.rank, " sends ", send_bytes,
             " bytes but recv_bytes says ", recv_bytes[size_t(o_.rank)]);
    guarded("all_gather_v", [&] {
      gloo::AllgathervOptions opts(ctx_);
      opts.setInput(nonnull(const_cast<void*>(send)), size_t(send_bytes));
      opts.setOutput(nonnull(recv), std::vector<size_t>(recv_bytes.begin(), recv_bytes.end()));
      opts.setTag(next_tag());
      gloo::allgatherv(opts);
    });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    DI_CHECK(root >= 0 && root < o_.size, "broadcast: root ", root, " outside a group of ", o_.size);
    guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      if (o_.rank == root) opts.setInput(nonnull(data), size_t(bytes));
      opts.setOutput(nonnull(data), size_t(bytes));
      opts.setRoot(root);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

  void all_reduce(void* data, int64_t count, ReduceType type, ReduceOp op) override {
    // Gathered, then reduced locally in rank order: bitwise the same on every rank and for any
    // transport (the sizes the engine reduces are small: counters and load statistics).
    const int64_t elem = reduce_elem_bytes(type), bytes = count * elem;
    std::vector<uint8_t> all(size_t(bytes * o_.size));
    std::vector<int64_t> sizes(size_t(o_.size), bytes);
    all_gather_v(data, bytes, all.data(), sizes);
    reduce_in_rank_order(all.data(), o_.size, count, type, op, data);
  }

  void reduce_scatter(const void* send, void* recv, int64_t count, ReduceType type) override {
    const int64_t bytes = count * reduce_elem_bytes(type);
    std::vector<int64_t> sizes(size_t(o_.size), bytes);
    std::vector<uint8_t> blocks(size_t(bytes * o_.size));
    all_to_all_v(send, sizes, blocks.data(), sizes);
    reduce_in_rank_order(blocks.data(), o_.size, count, type, ReduceOp::kSum, recv);
  }

  void barrier() override {
    guarded("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  void check_sizes(const char* what, size_t a, size_t b) const {
    DI_CHECK(a == size_t(o_.size) && b == size_t(o_.size), what, ": per-rank sizes for ", a, "/", b,
             " ranks in a group of ", o_.size);
  }
  // gloo wants non-null pointers even for zero bytes. Bytes, not void*: gloo's setInput<T> and
  // setOutput<T> take sizeof(T) as the element size, which for void is a GCC extension (1) that
  // clang refuses (it could not build this file, so no clang/TSan build of the engine linked).
  uint8_t* nonnull(const void* p) {
    return static_cast<uint8_t*>(p ? const_cast<void*>(p) : static_cast<void*>(&dummy_));
  }
  uint32_t next_tag() { return tag_++ & 0x7fffffff; }
  template <typename F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const gloo::Exception& e) {
      DI_THROW(InternalError, describe(), " rank ", o_.rank, ": ", what, " failed (a peer rank died or timed out after ",
               o_.timeout.count() / 1000, " s): ", e.what());
    }
  }

  GlooGroupOptions o_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 0;
  uint64_t dummy_ = 0;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_group(const GlooGroupOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    DI_THROW(InvalidArgument, "gloo group '", o.name, "': rank ", o.rank, " outside a group of ", o.size);
  if (!std::filesystem::is_directory(o.rendezvous_dir))
    DI_THROW(InvalidArgument, "gloo group '", o.name, "': rendezvous directory '", o.rendezvous_dir, "' does not exist");
  return std::make_unique<GlooGroup>(o);
}

bool have_gloo() { return true; }

}  // namespace deepinfer::parallel
