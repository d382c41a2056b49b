// Checks and typed throws. DI_CHECK guards internal invariants (throws InternalError with
// file:line and the failed condition); DI_THROW raises a typed, user-facing error.
// Messages are built from any streamable arguments: DI_CHECK(n > 0, "n=", n).
#pragma once
#include <sstream>
#include <string>
#include <utility>

#include "deepinfer/error.h"

namespace deepinfer::detail {
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace deepinfer::detail

#define DI_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond)) [[unlikely]]                                                                  \
      ::deepinfer::detail::check_failed(__FILE__, __LINE__, #cond,                             \
                                        ::deepinfer::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#ifndef NDEBUG
#define DI_DCHECK(cond, ...) DI_CHECK(cond __VA_OPT__(, ) __VA_ARGS__)
#else
#define DI_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#endif

// Throws ErrType (a deepinfer::Error subclass) with the concatenated message.
#define DI_THROW(ErrType, ...) throw ErrType(::deepinfer::detail::str_cat(__VA_ARGS__))
