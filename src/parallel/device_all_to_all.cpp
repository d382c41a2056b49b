#include "parallel/device_all_to_all.h"

#include <vector>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::parallel {
namespace {

class GroupAllToAll final : public DeviceAllToAllV {
 public:
  explicit GroupAllToAll(ProcessGroup& g) : g_(g) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  std::string describe() const override { return g_.describe(); }
  void all_to_all_v(void* stream, const void* send, std::span<const int64_t> send_bytes, void* recv,
                    std::span<const int64_t> recv_bytes) override {
    g_.set_stream(stream);  // the group orders its work on the caller's stream
    g_.all_to_all_v(send, send_bytes, recv, recv_bytes);
  }

 private:
  ProcessGroup& g_;
};

}  // namespace

void exchange_device_counts(DeviceAllToAllV& a2a, void* stream, const int64_t* send_counts, int64_t* recv_counts) {
  const std::vector<int64_t> eight(size_t(a2a.size()), int64_t(sizeof(int64_t)));
  a2a.all_to_all_v(stream, send_counts, eight, recv_counts, eight);
}

std::unique_ptr<DeviceAllToAllV> make_group_all_to_all(ProcessGroup& device_group) {
  if (device_group.memory() != Memory::kDevice)
    DI_THROW(InvalidArgument, "device all-to-all over ", device_group.describe(),
             ": a host group's buffers are host memory (the host-staged expert-parallel path serves it)");
  return std::make_unique<GroupAllToAll>(device_group);
}

}  // namespace deepinfer::parallel
