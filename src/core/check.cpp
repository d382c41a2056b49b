#include "core/check.h"

namespace deepinfer::detail {
void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string what = str_cat("internal check failed at ", file, ":", line, ": ", cond);
  if (!msg.empty()) what += str_cat(" (", msg, ")");
  throw InternalError(what);
}
}  // namespace deepinfer::detail
