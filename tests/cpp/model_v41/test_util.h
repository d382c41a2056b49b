// Helpers shared by the DeepSeek-V4.1 tests.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace v41_test {
namespace fs = std::filesystem;

inline fs::path source_dir() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return s ? fs::path(s) : fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
}

inline fs::path golden(const std::string& name) { return source_dir() / "tests" / "data" / "golden" / name; }

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs f, expects exception type E, returns its message.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

#define V41_EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

}  // namespace v41_test
