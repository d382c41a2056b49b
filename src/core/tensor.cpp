#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "core/numeric.h"
#include "core/parallel.h"

namespace deepinfer {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

std::shared_ptr<Storage> Storage::allocate_host(size_t nbytes) {
  size_t n = (nbytes + 63) / 64 * 64;
  void* p = n ? std::aligned_alloc(64, n) : nullptr;
  if (n && !p) DI_THROW(OutOfMemory, "host allocation of ", nbytes, " bytes failed");
  return std::make_shared<Storage>(p, nbytes, Device::cpu(), [](void* q) { std::free(q); });
}

namespace {
Storage::DeviceAllocator g_cuda_alloc = nullptr;
std::mutex g_alloc_mu;
}  // namespace

void Storage::register_allocator(DeviceType type, DeviceAllocator alloc) {
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  DI_CHECK(type == DeviceType::kCUDA);
  g_cuda_alloc = alloc;
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device dev) {
  if (dev.is_cpu()) return allocate_host(nbytes);
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  if (!g_cuda_alloc) DI_THROW(InvalidArgument, "no allocator for device ", dev.str(), " (CUDA backend not built)");
  return g_cuda_alloc(nbytes, dev);
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, Shape shape, Shape strides, DType dtype)
    : storage_(std::move(storage)), offset_(byte_offset), shape_(std::move(shape)), strides_(std::move(strides)),
      dtype_(dtype) {
  DI_CHECK(shape_.size() == strides_.size());
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device dev) {
  for (int64_t s : shape) DI_CHECK(s >= 0, "negative size in ", shape_str(shape));
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return Tensor(Storage::allocate(dtype_nbytes(dtype, n), dev), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device dev) {
  DI_CHECK(dev.is_cpu(), "Tensor::zeros on ", dev.str(), ": use the backend's fill");
  Tensor t = empty(shape, dtype, dev);
  if (t.nbytes()) std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> keepalive, Device dev) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  auto st = std::make_shared<Storage>(data, dtype_nbytes(dtype, n), dev, [k = std::move(keepalive)](void*) {});
  return Tensor(std::move(st), 0, shape, contiguous_strides(shape), dtype);
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  Tensor t = empty(shape, DType::kF32);
  DI_CHECK(int64_t(v.size()) == t.numel(), "from_vector: ", v.size(), " values for shape ", shape_str(shape));
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * 4);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  DI_CHECK(is_contiguous(), "view of non-contiguous tensor ", str());
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DI_CHECK(infer < 0, "view: two -1 dims");
      infer = int64_t(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel() / known : 0;
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  DI_CHECK(n == numel(), "view ", shape_str(shape), " of ", str());
  if (dtype_ == DType::kFP4E2M1) DI_CHECK(s.back() % 2 == 0, "fp4 view needs an even last dim");
  return Tensor(storage_, offset_, s, contiguous_strides(s), dtype_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  if (d < 0) d += dim();
  DI_CHECK(d >= 0 && d < dim() && 0 <= start && start <= end && end <= shape_[d], "slice(", d, ",", start, ",", end,
           ") of ", str());
  if (dtype_ == DType::kFP4E2M1) DI_CHECK(d != dim() - 1 || (start % 2 == 0), "fp4 slice on packed dim");
  Shape s = shape_;
  s[d] = end - start;
  size_t off = offset_ + dtype_nbytes(dtype_, start * strides_[d]);
  return Tensor(storage_, off, s, strides_, dtype_);
}

Tensor Tensor::select(int64_t d, int64_t i) const {
  if (d < 0) d += dim();
  Tensor t = slice(d, i, i + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  if (a < 0) a += dim();
  if (b < 0) b += dim();
  DI_CHECK(dtype_ != DType::kFP4E2M1, "transpose of packed fp4");
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  if (d < 0) d += dim() + 1;
  Tensor t = *this;
  int64_t st = d < dim() ? strides_[d] * shape_[d] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, st);
  return t;
}

namespace {
// Calls fn(linear_index, element_offset) for every element in row-major order.
template <typename F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& fn) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t off = 0;
  for (int64_t lin = 0; lin < n; ++lin) {
    fn(lin, off);
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

float load_as_f32(const char* base, DType dt, int64_t off) {
  switch (dt) {
    case DType::kF32: return reinterpret_cast<const float*>(base)[off];
    case DType::kBF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(base)[off]);
    case DType::kF16: return f16_to_f32(reinterpret_cast<const uint16_t*>(base)[off]);
    case DType::kF8E4M3: return fp8e4m3_to_f32(reinterpret_cast<const uint8_t*>(base)[off]);
    case DType::kE8M0: return e8m0_to_f32(reinterpret_cast<const uint8_t*>(base)[off]);
    case DType::kFP4E2M1: {
      uint8_t b = reinterpret_cast<const uint8_t*>(base)[off >> 1];
      return fp4e2m1_to_f32((off & 1) ? (b >> 4) : (b & 0xf));
    }
    case DType::kI8: return float(reinterpret_cast<const int8_t*>(base)[off]);
    case DType::kU8: case DType::kBool: return float(reinterpret_cast<const uint8_t*>(base)[off]);
    case DType::kI32: return float(reinterpret_cast<const int32_t*>(base)[off]);
    case DType::kI64: return float(reinterpret_cast<const int64_t*>(base)[off]);
  }
  return 0.f;
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  DI_CHECK(device().is_cpu(), "contiguous() on ", device().str());
  DI_CHECK(dtype_ != DType::kFP4E2M1, "contiguous() of strided packed fp4");
  Tensor out = empty(shape_, dtype_);
  size_t es = dtype_bits(dtype_) / 8;
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for_each_offset(shape_, strides_, [&](int64_t lin, int64_t off) { std::memcpy(dst + lin * es, src + off * es, es); });
  return out;
}

Tensor Tensor::clone() const {
  Tensor c = contiguous();
  if (c.storage_ != storage_) return c;
  Tensor out = empty(shape_, dtype_, device());
  DI_CHECK(device().is_cpu(), "clone() on ", device().str());
  if (nbytes() > 0) std::memcpy(out.raw_data(), raw_data(), nbytes());  // an empty tensor may have no buffer
  return out;
}

Tensor Tensor::to_f32() const {
  DI_CHECK(device().is_cpu(), "to_f32() on ", device().str());
  Tensor out = empty(shape_, DType::kF32);
  float* dst = out.data<float>();
  const char* base = static_cast<const char*>(storage_->data()) + offset_;
  if (dtype_ == DType::kFP4E2M1) {
    DI_CHECK(is_contiguous(), "to_f32 of strided fp4");
    for (int64_t i = 0; i < numel(); ++i) dst[i] = load_as_f32(base, dtype_, i);
    return out;
  }
  for_each_offset(shape_, strides_, [&](int64_t lin, int64_t off) { dst[lin] = load_as_f32(base, dtype_, off); });
  return out;
}

Tensor Tensor::to(DType dt) const {
  Tensor src = dtype_ == DType::kF32 ? contiguous() : to_f32();
  if (dt == DType::kF32) return src.storage_ == storage_ ? src.clone() : src;
  Tensor out = empty(shape_, dt);
  const float* s = src.data<float>();
  const int64_t n = numel();
  DI_CHECK(dt == DType::kBF16 || dt == DType::kF8E4M3, "Tensor::to(", dtype_name(dt), ") not supported");
  // Chunks in parallel (weight upload converts tens of GB); elementwise, so thread-count independent.
  constexpr int64_t kChunk = 1 << 16;
  uint16_t* o16 = dt == DType::kBF16 ? out.data<uint16_t>() : nullptr;
  uint8_t* o8 = dt == DType::kF8E4M3 ? out.data<uint8_t>() : nullptr;
  parallel_for(0, (n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t e = std::min(n, (c + 1) * kChunk);
    if (o16)
      for (int64_t i = c * kChunk; i < e; ++i) o16[i] = f32_to_bf16(s[i]);
    else
      for (int64_t i = c * kChunk; i < e; ++i) o8[i] = f32_to_fp8e4m3(s[i]);
  });
  return out;
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device().str();
}

}  // namespace deepinfer
