// Minimal leveled logging to stderr. Level from DEEPINFER_LOG_LEVEL (error|warn|info|debug),
// read once. Progress bars live in core/progress.h.
#pragma once
#include <string>

#include "core/check.h"

namespace deepinfer {
enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };
LogLevel log_level();
void set_log_level(LogLevel l);
void log_message(LogLevel l, const std::string& msg);
}  // namespace deepinfer

#define DI_LOG(level, ...)                                                                     \
  do {                                                                                         \
    if (::deepinfer::log_level() >= ::deepinfer::LogLevel::level)                              \
      ::deepinfer::log_message(::deepinfer::LogLevel::level, ::deepinfer::detail::str_cat(__VA_ARGS__)); \
  } while (0)
#define DI_INFO(...) DI_LOG(kInfo, __VA_ARGS__)
#define DI_WARN(...) DI_LOG(kWarn, __VA_ARGS__)
#define DI_DEBUG(...) DI_LOG(kDebug, __VA_ARGS__)
