// Interned int32 sequences (NFA state sets of a subset construction, state tuples of a DFA
// product): the sequences lie back to back in one arena and an open-addressing table maps a
// sequence to its index. Indices are handed out in insertion order, so a construction that
// numbers its states by first insertion numbers them exactly as an ordered map of vectors did,
// without an allocation per lookup (an unordered_map / std::map of vectors spent a third of
// compile time in malloc/free).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer::structured {

class SetTable {
 public:
  SetTable() { clear(); }
  void clear() {
    arena_.clear();
    begin_.assign(1, 0);
    hashes_.clear();
    slots_.assign(256, -1);
  }
  int32_t size() const { return static_cast<int32_t>(hashes_.size()); }
  const int32_t* data(int32_t k) const { return arena_.data() + begin_[k]; }
  uint32_t length(int32_t k) const { return begin_[k + 1] - begin_[k]; }
  // Index of the n values at p; added as index size() when absent (*added = true). p must not
  // point into this table's arena (the insert may move it).
  int32_t intern(const int32_t* p, size_t n, bool* added) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint32_t>(p[i])) * 0x100000001b3ull + (h >> 29);
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const int32_t k = slots_[i];
      if (k < 0) break;
      if (hashes_[k] == h && length(k) == n && std::equal(p, p + n, data(k))) {
        *added = false;
        return k;
      }
    }
    const int32_t k = size();
    hashes_.push_back(h);
    arena_.insert(arena_.end(), p, p + n);
    begin_.push_back(static_cast<uint32_t>(arena_.size()));
    if (hashes_.size() * 2 > slots_.size()) {
      slots_.assign(slots_.size() * 2, -1);
      for (int32_t j = 0; j < k; ++j) place(j);
    }
    place(k);
    *added = true;
    return k;
  }
  int32_t intern(const std::vector<int32_t>& set, bool* added) { return intern(set.data(), set.size(), added); }

 private:
  void place(int32_t k) {
    const size_t mask = slots_.size() - 1;
    size_t i = hashes_[k] & mask;
    while (slots_[i] >= 0) i = (i + 1) & mask;
    slots_[i] = k;
  }
  std::vector<int32_t> arena_;
  std::vector<uint32_t> begin_;   // [size + 1] offsets into arena_
  std::vector<uint64_t> hashes_;  // [size]
  std::vector<int32_t> slots_;    // power of two; index or -1
};

}  // namespace deepinfer::structured
