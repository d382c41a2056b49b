// Reading whole files that a user names (config.json, tokenizer.json, an index): only regular
// files are opened for reading. A named pipe, socket or device given as a path would block
// open()/read() forever or stream without end; it is refused with a message instead.
#pragma once
#include <cstddef>
#include <string>

#include "core/check.h"

namespace deepinfer {

inline constexpr size_t kMaxTextFileBytes = size_t(1) << 30;

// Opens `path` without blocking (O_NONBLOCK, so a FIFO cannot hang the open), checks that it
// is a regular file and fits `max_bytes`, and reads it whole. On failure returns false and
// sets `*error` to "cannot open: <strerror>", "is not a regular file (a named pipe)", ...
bool read_regular_file(const std::string& path, std::string& out, std::string* error,
                       size_t max_bytes = kMaxTextFileBytes);

// Same, throwing ErrType "<path>: <reason>".
template <typename ErrType>
std::string read_regular_file_or_throw(const std::string& path, size_t max_bytes = kMaxTextFileBytes) {
  std::string text, why;
  if (!read_regular_file(path, text, &why, max_bytes)) throw ErrType(detail::str_cat(path, ": ", why));
  return text;
}

// "a named pipe", "a directory", ... for a stat mode that is not a regular file (for messages).
const char* file_kind_name(unsigned mode);

}  // namespace deepinfer
