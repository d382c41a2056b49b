#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace deepinfer {
namespace {
LogLevel initial_level() {
  const char* v = std::getenv("DEEPINFER_LOG_LEVEL");
  if (!v) return LogLevel::kInfo;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  return LogLevel::kInfo;
}
std::atomic<int> g_level{int(initial_level())};
}  // namespace

LogLevel log_level() { return LogLevel(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel l) { g_level = int(l); }
void log_message(LogLevel l, const std::string& msg) {
  static const char* tags[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "[deepinfer %s] %s\n", tags[int(l)], msg.c_str());
}
}  // namespace deepinfer
