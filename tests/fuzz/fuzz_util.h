// Shared pieces of the fuzz targets: the "expected failure" policy and scratch files.
//
// Policy: a deepinfer::Error (typed, named) is the expected answer to bad input and ends the
// iteration; anything else escaping the code under test (a std::exception from nlohmann or the
// standard library, a crash, a sanitizer report, a hang past -timeout) is a bug, so it is left
// to abort the process and libFuzzer saves the input.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "deepinfer/error.h"

namespace di_fuzz {
namespace fs = std::filesystem;

// A per-process scratch folder in memory when /dev/shm exists (the targets rewrite files every
// iteration). Removed at exit.
inline const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    fs::path d = base / ("di_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] { std::error_code ec; fs::remove_all(scratch_dir(), ec); });
    return d;
  }();
  return dir;
}

inline void write_file(const fs::path& p, std::string_view bytes) {
  FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// Runs fn; a deepinfer::Error is an accepted outcome (returns false), success returns true.
template <typename F>
bool expect_named_error(F&& fn) {
  try {
    fn();
    return true;
  } catch (const deepinfer::Error&) {
    return false;
  }
}

// Aborts with a message when an invariant of the code under test fails (libFuzzer keeps the input).
#define FUZZ_ASSERT(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "FUZZ_ASSERT failed: %s ", #cond);                  \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fprintf(stderr, "\n");                                                \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

// The shared tokenizer data (CI has it beside the checkout), for targets that need a real
// vocabulary; empty when absent.
inline std::string deepseek_tokenizer_path() {
  const char* env = std::getenv("DEEPINFER_SHARED_DIR");
  fs::path shared = env ? fs::path(env) : fs::path(DEEPINFER_SOURCE_DIR) / ".." / "shared";
  fs::path p = shared / "data" / "tokenizers" / "deepseek-v3" / "tokenizer.json";
  return fs::exists(p) ? p.string() : std::string();
}

}  // namespace di_fuzz
