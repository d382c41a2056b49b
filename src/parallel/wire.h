// A byte codec for the messages ranks exchange (the data-parallel engine's commands and reports,
// the launcher's config hand-over): little-endian fixed-width scalars, length-prefixed strings
// and vectors, appended in order and read back in the same order. The ranks run the same build,
// so there is no versioning; a message that ends early or carries an impossible length is an
// InternalError naming what was being read and at which byte, never a read past the buffer.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace deepinfer::parallel {

class WireWriter {
 public:
  template <class T>
    requires std::is_arithmetic_v<T>
  void put(T v) {
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));
  }
  void put_bool(bool v) { put<uint8_t>(v ? 1 : 0); }
  void put_str(const std::string& s);
  template <class T>
    requires std::is_arithmetic_v<T>
  void put_vec(std::span<const T> v) {
    put<uint64_t>(v.size());
    const size_t at = buf_.size();
    buf_.resize(at + v.size_bytes());
    if (!v.empty()) std::memcpy(buf_.data() + at, v.data(), v.size_bytes());
  }
  template <class T>
    requires std::is_arithmetic_v<T>
  void put_vec(const std::vector<T>& v) { put_vec(std::span<const T>(v)); }
  void put_strs(const std::vector<std::string>& v);
  template <class T, class F>
  void put_opt(const std::optional<T>& v, F&& put_value) {
    put_bool(v.has_value());
    if (v) put_value(*v);
  }

  const std::vector<uint8_t>& bytes() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

class WireReader {
 public:
  // `what` names the message in errors ("data-parallel commands from rank 0").
  WireReader(std::span<const uint8_t> bytes, std::string what) : b_(bytes), what_(std::move(what)) {}

  template <class T>
    requires std::is_arithmetic_v<T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  bool get_bool(const char* field);
  std::string get_str(const char* field);
  template <class T>
    requires std::is_arithmetic_v<T>
  std::vector<T> get_vec(const char* field) {
    const uint64_t n = count(sizeof(T), field);
    std::vector<T> v(static_cast<size_t>(n));
    if (n) std::memcpy(v.data(), b_.data() + at_, size_t(n) * sizeof(T));
    at_ += size_t(n) * sizeof(T);
    return v;
  }
  std::vector<std::string> get_strs(const char* field);
  template <class F>
  auto get_opt(const char* field, F&& get_value) -> std::optional<decltype(get_value())> {
    if (!get_bool(field)) return std::nullopt;
    return get_value();
  }
  // A length prefix for `elem_bytes`-sized items, checked against what is left (so a corrupt
  // length cannot allocate gigabytes).
  uint64_t count(size_t elem_bytes, const char* field);
  bool done() const { return at_ == b_.size(); }
  // InternalError unless every byte was read (a message of another layout).
  void expect_done() const;

 private:
  void need(size_t n, const char* field) const;
  std::span<const uint8_t> b_;
  size_t at_ = 0;
  std::string what_;
};

}  // namespace deepinfer::parallel
