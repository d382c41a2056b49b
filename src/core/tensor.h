// Tensor: a typed, strided view over a reference-counted byte buffer on one device.
// Views (slice, select, view, transpose) share the buffer; `contiguous()` and `clone()`
// copy. Buffers are either owned (aligned host memory, device memory) or borrowed from
// something kept alive by the storage (a memory-mapped safetensors shard).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace deepinfer {

enum class DeviceType : uint8_t { kCPU, kCUDA };
struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// A block of bytes plus whatever must stay alive for it to stay valid.
class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  Storage(void* data, size_t nbytes, Device dev, Deleter deleter)
      : data_(data), nbytes_(nbytes), device_(dev), deleter_(std::move(deleter)) {}
  ~Storage() {
    if (deleter_) deleter_(data_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // 64-byte aligned host allocation (not zeroed).
  static std::shared_ptr<Storage> allocate_host(size_t nbytes);
  // Allocator hook for other devices (set by the CUDA backend when it is linked).
  using DeviceAllocator = std::shared_ptr<Storage> (*)(size_t nbytes, Device dev);
  static void register_allocator(DeviceType type, DeviceAllocator alloc);
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device dev);

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  Deleter deleter_;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, Shape strides, DType dtype);

  static Tensor empty(const Shape& shape, DType dtype, Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device dev = Device::cpu());
  // Wraps external memory; `keepalive` is held as long as any view exists.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> keepalive,
                          Device dev = Device::cpu());
  // Host f32 tensor from values (row-major).
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t stride(int64_t d) const { return strides_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const;
  size_t nbytes() const { return dtype_nbytes(dtype_, numel()); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  void* raw_data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw_data()); }

  // Views. Packed fp4 tensors support views only along dims other than the last.
  Tensor view(const Shape& shape) const;        // requires contiguous; one dim may be -1
  Tensor slice(int64_t d, int64_t start, int64_t end) const;
  Tensor select(int64_t d, int64_t i) const;    // drops dim d
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor unsqueeze(int64_t d) const;

  Tensor contiguous() const;                    // same dtype/device, copies if needed (host only)
  Tensor clone() const;
  // Host copy converted to f32 (bf16, f16, fp8, e8m0, fp4, ints all supported).
  Tensor to_f32() const;
  // Host copy converted from f32 into `dt` (f32, bf16, f16, fp8 e4m3) with round-to-nearest-even.
  Tensor to(DType dt) const;

  std::string str() const;  // "bf16[4,16] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_, strides_;  // strides in elements
  DType dtype_ = DType::kF32;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace deepinfer
