#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <queue>

#include "core/check.h"

namespace deepinfer::tok {

void MergeTable::build(const std::vector<Entry>& entries) {
  size_t cap = 16;
  while (cap < entries.size() * 2 + 1) cap <<= 1;
  slots_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  n_ = 0;
  for (const Entry& e : entries) {
    size_t i = hash(e.key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != e.key) i = (i + 1) & mask_;
    // A duplicated pair keeps its first (lowest) rank, as HF does when reading merges in order.
    if (slots_[i].key == kEmpty) {
      slots_[i] = e;
      ++n_;
    }
  }
}

namespace {
constexpr int32_t kNoRank = INT32_MAX;

// Small words: keep pair ranks in an array and rescan for the minimum; only the two pairs
// around a merge change, so each merge costs O(n) compares and two hash probes.
void merge_small(const MergeTable& mt, std::vector<int32_t>& sym, std::vector<int32_t>& rank) {
  size_t n = sym.size();
  rank.resize(n);
  auto pair_rank = [&](size_t i) {
    const MergeTable::Entry* e = mt.find(sym[i], sym[i + 1]);
    return e ? e->rank : kNoRank;
  };
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = pair_rank(i);
  while (n > 1) {
    size_t best = 0;
    int32_t best_rank = kNoRank;
    for (size_t i = 0; i + 1 < n; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best_rank == kNoRank) break;
    sym[best] = mt.find(sym[best], sym[best + 1])->merged;
    sym.erase(sym.begin() + best + 1);
    rank.erase(rank.begin() + best);
    --n;
    if (best + 1 < n) rank[best] = pair_rank(best);
    if (best > 0) rank[best - 1] = pair_rank(best - 1);
  }
}

// Long words (whitespace runs, long CJK runs): a heap of candidate pairs over a linked list,
// O(n log n). Stale heap entries are detected by re-checking the pair at pop time.
void merge_large(const MergeTable& mt, std::vector<int32_t>& sym) {
  size_t n = sym.size();
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) prev[i] = int32_t(i) - 1, next[i] = i + 1 < n ? int32_t(i + 1) : -1;
  struct Cand {
    int32_t rank, pos, a, b;  // pair (a, b) starting at symbol slot pos
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t i) {
    if (i < 0 || next[i] < 0) return;
    const MergeTable::Entry* e = mt.find(sym[i], sym[next[i]]);
    if (e) heap.push({e->rank, i, sym[i], sym[next[i]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t j = next[c.pos];
    if (sym[c.pos] < 0 || j < 0 || sym[c.pos] != c.a || sym[j] != c.b) continue;  // stale
    sym[c.pos] = mt.find(c.a, c.b)->merged;
    sym[j] = -1;
    next[c.pos] = next[j];
    if (next[j] >= 0) prev[next[j]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (sym[i] >= 0) sym[w++] = sym[i];
  sym.resize(w);
}
}  // namespace

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, std::vector<int32_t>& scratch) const {
  if (ignore_merges) {
    auto it = bytes_to_id.find(std::string(word));
    if (it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int32_t> sym;
  sym.clear();
  for (unsigned char c : word) {
    int32_t id = byte_to_id[c];
    if (id >= 0) sym.push_back(id);  // HF drops symbols missing from the vocab when there is no unk
  }
  if (sym.size() <= 64) merge_small(merges, sym, scratch);
  else merge_large(merges, sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

void BpeModel::encode_word_reference(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym;
  for (unsigned char c : word)
    if (byte_to_id[c] >= 0) sym.push_back(byte_to_id[c]);
  while (sym.size() > 1) {
    int32_t best_rank = kNoRank;
    size_t best = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const MergeTable::Entry* e = merges.find(sym[i], sym[i + 1]);
      if (e && e->rank < best_rank) best_rank = e->rank, best = i;
    }
    if (best_rank == kNoRank) break;
    sym[best] = merges.find(sym[best], sym[best + 1])->merged;
    sym.erase(sym.begin() + best + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

}  // namespace deepinfer::tok
