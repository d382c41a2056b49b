// Shared helpers for the model-loading tests.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "deepinfer/error.h"

namespace di_test {
namespace fs = std::filesystem;

inline fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("di_ml_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline fs::path source_dir() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return s ? fs::path(s) : fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p);
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

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

}  // namespace di_test
