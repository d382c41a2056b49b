// Byte-level BPE model: merge table keyed by a pair of ids, applied lowest rank first
// (leftmost on ties), exactly as HF tokenizers' BPE::merge_word.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tok {

// Open-addressing map (id_a, id_b) -> (rank, merged id). Built once, read-only afterwards.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;  // (a << 32) | b; kEmpty when the slot is free
    int32_t rank;
    int32_t merged;
  };
  void build(const std::vector<Entry>& entries);
  // Pointer to the entry or nullptr.
  const Entry* find(int32_t a, int32_t b) const {
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t i = hash(key) & mask_;
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return n_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static size_t hash(uint64_t k) { return size_t((k * 0x9E3779B97F4A7C15ull) >> 20); }
  std::vector<Entry> slots_;
  size_t mask_ = 0, n_ = 0;
};

struct BpeModel {
  int32_t byte_to_id[256];       // id of each single-byte token (-1 when missing)
  MergeTable merges;             // pair -> (rank, merged id)
  std::unordered_map<std::string, int32_t> bytes_to_id;  // raw token bytes -> id (ignore_merges)
  bool ignore_merges = false;    // a whole word found in the vocabulary is one token (Llama-3 style)

  // Appends the ids of one pre-tokenized word (raw bytes) to `out`. Uses `scratch` for symbols.
  void encode_word(std::string_view word, std::vector<int32_t>& out, std::vector<int32_t>& scratch) const;
  // Plain quadratic reference of the same algorithm (for tests).
  void encode_word_reference(std::string_view word, std::vector<int32_t>& out) const;
};

}  // namespace deepinfer::tok
