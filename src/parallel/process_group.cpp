#include "parallel/process_group.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "parallel/gloo_group.h"
#include "parallel/reduce.h"

namespace deepinfer::parallel {

int64_t reduce_elem_bytes(ReduceType type) { return type == ReduceType::kF32 ? 4 : 8; }

namespace {
template <typename T>
void reduce_typed(const T* blocks, int ranks, int64_t count, ReduceOp op, T* out) {
  for (int64_t i = 0; i < count; ++i) {
    T acc = blocks[i];
    for (int r = 1; r < ranks; ++r) {
      const T v = blocks[int64_t(r) * count + i];
      switch (op) {
        case ReduceOp::kSum: acc = acc + v; break;
        case ReduceOp::kMax: acc = std::max(acc, v); break;
        case ReduceOp::kMin: acc = std::min(acc, v); break;
      }
    }
    out[i] = acc;
  }
}
}  // namespace

void reduce_in_rank_order(const void* blocks, int ranks, int64_t count, ReduceType type, ReduceOp op, void* out) {
  if (type == ReduceType::kF32)
    reduce_typed(static_cast<const float*>(blocks), ranks, count, op, static_cast<float*>(out));
  else
    reduce_typed(static_cast<const int64_t*>(blocks), ranks, count, op, static_cast<int64_t*>(out));
}

std::vector<int64_t> exchange_counts(ProcessGroup& pg, std::span<const int64_t> send_bytes) {
  DI_CHECK(pg.memory() == Memory::kHost, "exchange_counts needs a host group, not ", pg.describe());
  DI_CHECK(int64_t(send_bytes.size()) == pg.size(), "exchange_counts: ", send_bytes.size(), " counts for ",
           pg.size(), " ranks");
  std::vector<int64_t> recv(send_bytes.size());
  std::vector<int64_t> eight(send_bytes.size(), int64_t(sizeof(int64_t)));
  pg.all_to_all_v(send_bytes.data(), eight, recv.data(), eight);
  for (size_t q = 0; q < recv.size(); ++q)
    if (recv[q] < 0) DI_THROW(InternalError, pg.describe(), ": rank ", q, " announced ", recv[q], " bytes");
  return recv;
}

std::vector<std::vector<uint8_t>> all_gather_bytes(ProcessGroup& pg, std::span<const uint8_t> message) {
  DI_CHECK(pg.memory() == Memory::kHost, "all_gather_bytes needs a host group, not ", pg.describe());
  const int n = pg.size();
  std::vector<int64_t> sizes(size_t(n), 0);
  sizes[size_t(pg.rank())] = int64_t(message.size());
  pg.all_reduce(sizes.data(), n, ReduceType::kI64, ReduceOp::kSum);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::vector<uint8_t> all(static_cast<size_t>(total));
  pg.all_gather_v(message.data(), int64_t(message.size()), all.data(), sizes);
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  int64_t off = 0;
  for (int q = 0; q < n; ++q) {
    out[size_t(q)].assign(all.begin() + off, all.begin() + off + sizes[size_t(q)]);
    off += sizes[size_t(q)];
  }
  return out;
}

std::vector<uint8_t> broadcast_bytes(ProcessGroup& pg, std::vector<uint8_t> message, int root) {
  DI_CHECK(pg.memory() == Memory::kHost, "broadcast_bytes needs a host group, not ", pg.describe());
  int64_t n = int64_t(message.size());
  pg.broadcast(&n, sizeof(n), root);
  message.resize(size_t(n));
  pg.broadcast(message.data(), n, root);
  return message;
}

std::vector<std::vector<uint8_t>> all_to_all_bytes(ProcessGroup& pg, const std::vector<std::vector<uint8_t>>& to) {
  DI_CHECK(int64_t(to.size()) == pg.size(), "all_to_all_bytes: ", to.size(), " messages for ", pg.size(), " ranks");
  std::vector<int64_t> send(to.size());
  std::vector<uint8_t> packed;
  for (size_t q = 0; q < to.size(); ++q) {
    send[q] = int64_t(to[q].size());
    packed.insert(packed.end(), to[q].begin(), to[q].end());
  }
  std::vector<int64_t> recv = exchange_counts(pg, send);
  int64_t total = 0;
  for (int64_t r : recv) total += r;
  std::vector<uint8_t> got(static_cast<size_t>(total));
  pg.all_to_all_v(packed.data(), send, got.data(), recv);
  std::vector<std::vector<uint8_t>> out(to.size());
  int64_t off = 0;
  for (size_t q = 0; q < to.size(); ++q) {
    out[q].assign(got.begin() + off, got.begin() + off + recv[q]);
    off += recv[q];
  }
  return out;
}

namespace {
// One rank: every collective is a copy (or nothing).
class SingleRankGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "single rank"; }
  Memory memory() const override { return Memory::kHost; }
  void all_to_all_v(const void* send, std::span<const int64_t> send_bytes, void* recv,
                    std::span<const int64_t> recv_bytes) override {
    DI_CHECK(send_bytes.size() == 1 && recv_bytes.size() == 1 && send_bytes[0] == recv_bytes[0],
             "single-rank all_to_all_v: sizes disagree");
    if (send_bytes[0] > 0 && send != recv) std::memmove(recv, send, size_t(send_bytes[0]));
  }
  void all_gather_v(const void* send, int64_t send_bytes, void* recv, std::span<const int64_t> recv_bytes) override {
    DI_CHECK(recv_bytes.size() == 1 && recv_bytes[0] == send_bytes, "single-rank all_gather_v: sizes disagree");
    if (send_bytes > 0 && send != recv) std::memmove(recv, send, size_t(send_bytes));
  }
  void broadcast(void*, int64_t, int root) override {
    DI_CHECK(root == 0, "single-rank broadcast from root ", root);
  }
  void all_reduce(void*, int64_t, ReduceType, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, int64_t count, ReduceType type) override {
    if (count > 0 && send != recv) std::memmove(recv, send, size_t(count * reduce_elem_bytes(type)));
  }
  void barrier() override {}
};
}  // namespace

std::unique_ptr<ProcessGroup> make_single_rank_group() { return std::make_unique<SingleRankGroup>(); }

#if !defined(DEEPINFER_HAVE_GLOO)
std::unique_ptr<ProcessGroup> make_gloo_group(const GlooGroupOptions& o) {
  DI_THROW(ConfigError, "gloo group '", o.name, "' of ", o.size,
           " ranks: this build has no gloo (install libgloo-dev and rebuild); only one CPU rank is possible");
}
bool have_gloo() { return false; }
#endif

}  // namespace deepinfer::parallel

#if !defined(DEEPINFER_HAVE_NCCL)
#include "parallel/nccl_group.h"
namespace deepinfer::parallel {
std::unique_ptr<ProcessGroup> make_nccl_group(ProcessGroup& bootstrap, int device, const std::string& name) {
  DI_THROW(ConfigError, "NCCL group '", name, "': this build has no NCCL (CUDA off or libnccl missing)");
}
bool have_nccl() { return false; }
}  // namespace deepinfer::parallel
#endif
