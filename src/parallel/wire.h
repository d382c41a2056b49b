// A byte codec for the messages ranks exchange (the data-parallel engine's commands and reports,
// the launcher's config hand-over): little-endian fixed-width scalars, length-prefixed strings
// and vectors, appended in order and read back in the same order. The ranks run the same build,
// so there is no versioning; a message that ends early or carries an impossible length is an
// InternalError naming what was being read and at which byte, never a read past the buffer.
// Messages from outside the process tree (the KV hand-off between servers, its CUDA IPC control
// messages) use the same codec with WireSource::kPeer, which makes the same faults
// InvalidArgument: bad input from a peer, not a broken invariant of this build.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace deepinfer::parallel {

// Who wrote the bytes, which decides the error type of a malformed message.
enum class WireSource {
  kRank,  // another rank of this run (same build): InternalError
  kPeer,  // another process or server (untrusted input): InvalidArgument
};

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
  // Bytes with no length prefix (fixed-size fields: magics, UUIDs, handles).
  void put_raw(const void* p, size_t n) {
    const size_t at = buf_.size();
    buf_.resize(at + n);
    if (n) std::memcpy(buf_.data() + at, p, n);
  }
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
  WireReader(std::span<const uint8_t> bytes, std::string what, WireSource source = WireSource::kRank)
      : b_(bytes), what_(std::move(what)), source_(source) {}

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
  void get_raw(void* dst, size_t n, const char* field) {
    need(n, field);
    if (n) std::memcpy(dst, b_.data() + at_, n);
    at_ += n;
  }
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
  size_t offset() const { return at_; }
  std::span<const uint8_t> rest() const { return b_.subspan(at_); }
  // An error unless every byte was read (a message of another layout).
  void expect_done() const;
  // Throws this reader's error type (by WireSource) with `what` in front of the message parts.
  [[noreturn]] void fail(const std::string& message) const;

 private:
  void need(size_t n, const char* field) const;
  std::span<const uint8_t> b_;
  size_t at_ = 0;
  std::string what_;
  WireSource source_;
};

}  // namespace deepinfer::parallel
