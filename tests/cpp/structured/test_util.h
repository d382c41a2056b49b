// Shared helpers for the structured-output tests.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#include "structured/vocab.h"

namespace deepinfer::structured::test {

inline std::filesystem::path shared_dir() {
  if (const char* d = std::getenv("DEEPINFER_SHARED_DIR")) return d;
  if (const char* s = std::getenv("DEEPINFER_SOURCE_DIR")) return std::filesystem::path(s) / ".." / "shared";
  return "../shared";
}

inline std::shared_ptr<const TokenVocabulary> byte_vocab() {
  static auto v = make_vocabulary(byte_level_tokenizer_info());
  return v;
}

// Accepts `text` byte by byte and then the end: the exact-match decision.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_terminate();
}

}  // namespace deepinfer::structured::test
