// Comma-separated lists on the command line (`--backends a,b`, `--batches 1,8,32`).
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::cli {

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= list.size();) {
    const size_t e = std::min(list.find(',', p), list.size());
    if (e > p) out.push_back(list.substr(p, e - p));
    p = e + 1;
  }
  return out;
}

// "1,8,32" -> {1, 8, 32}; an item that is not a whole number is an InvalidArgument naming `flag`.
inline std::vector<int64_t> parse_int_list(const std::string& list, const char* flag) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(list)) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (errno != 0 || end == item.c_str() || *end != '\0')
      DI_THROW(InvalidArgument, flag, ": '", item, "' is not a whole number");
    out.push_back(int64_t(v));
  }
  return out;
}

}  // namespace deepinfer::cli
