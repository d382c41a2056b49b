// See wire.h.
#include "parallel/wire.h"

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::parallel {

void WireWriter::put_str(const std::string& s) {
  put_vec(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

void WireWriter::put_strs(const std::vector<std::string>& v) {
  put<uint64_t>(v.size());
  for (const std::string& s : v) put_str(s);
}

void WireReader::fail(const std::string& message) const {
  if (source_ == WireSource::kPeer) DI_THROW(InvalidArgument, what_, ": ", message);
  DI_THROW(InternalError, "wire: ", what_, " ", message);
}

void WireReader::need(size_t n, const char* field) const {
  if (n > b_.size() - at_)
    fail(detail::str_cat("ends early reading '", field, "' (", n, " bytes at byte ", at_, " of ", b_.size(), ")"));
}

uint64_t WireReader::count(size_t elem_bytes, const char* field) {
  const uint64_t n = get<uint64_t>(field);
  const size_t left = b_.size() - at_;
  if (elem_bytes > 0 && n > left / elem_bytes)
    fail(detail::str_cat("claims ", n, " items of ", elem_bytes, " bytes for '", field, "' with ", left,
                         " bytes left (at byte ", at_, ")"));
  return n;
}

bool WireReader::get_bool(const char* field) {
  const uint8_t v = get<uint8_t>(field);
  if (v > 1) fail(detail::str_cat("has ", int(v), " for the flag '", field, "' at byte ", at_ - 1));
  return v == 1;
}

std::string WireReader::get_str(const char* field) {
  const uint64_t n = count(1, field);
  std::string s(reinterpret_cast<const char*>(b_.data() + at_), size_t(n));
  at_ += size_t(n);
  return s;
}

std::vector<std::string> WireReader::get_strs(const char* field) {
  // Each string costs at least its 8-byte length.
  const uint64_t n = count(sizeof(uint64_t), field);
  std::vector<std::string> v;
  v.reserve(size_t(n));
  for (uint64_t i = 0; i < n; ++i) v.push_back(get_str(field));
  return v;
}

void WireReader::expect_done() const {
  if (!done()) fail(detail::str_cat("has ", b_.size() - at_, " bytes left over after byte ", at_));
}

}  // namespace deepinfer::parallel
