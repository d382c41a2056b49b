// The vocabulary as a byte trie in depth-first preorder, so that a walk over all tokens is a
// linear scan that can skip a dead subtree in O(1) (node i's subtree is [i, end[i])).
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/structured.h"

namespace deepinfer::structured {

// Strict UTF-8 decoder step. States: 0 boundary; 1 one continuation left; 2 two left; 3 two
// left, first A0-BF (after E0); 4 two left, first 80-9F (after ED); 5 three left; 6 three
// left, first 90-BF (after F0); 7 three left, first 80-8F (after F4). -1: invalid.
inline int utf8_step(int s, uint8_t b) {
  auto in = [b](int lo, int hi) { return b >= lo && b <= hi; };
  switch (s) {
    case 0:
      if (b < 0x80) return 0;
      if (in(0xC2, 0xDF)) return 1;
      if (b == 0xE0) return 3;
      if (b == 0xED) return 4;
      if (in(0xE1, 0xEF)) return 2;
      if (b == 0xF0) return 6;
      if (b == 0xF4) return 7;
      if (in(0xF1, 0xF3)) return 5;
      return -1;
    case 1: return in(0x80, 0xBF) ? 0 : -1;
    case 2: return in(0x80, 0xBF) ? 1 : -1;
    case 3: return in(0xA0, 0xBF) ? 1 : -1;
    case 4: return in(0x80, 0x9F) ? 1 : -1;
    case 5: return in(0x80, 0xBF) ? 2 : -1;
    case 6: return in(0x90, 0xBF) ? 2 : -1;
    case 7: return in(0x80, 0x8F) ? 2 : -1;
  }
  return -1;
}

struct StateMaskCache;  // compiled.h
struct SubtreeResult;   // compiled.h

// Context-independent results shared by every grammar compiled for one vocabulary, keyed by
// the canonical encoding of an automaton state's behaviour up to the longest token
// (mask_cache.cpp): a JSON string body or any-JSON-value state is walked once per process, not
// once per schema. Thread-safe; oldest entries evicted past `capacity`.
template <class T>
class SharedCache {
 public:
  explicit SharedCache(size_t capacity) : capacity_(capacity) {}
  std::shared_ptr<const T> find(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void insert(const std::string& key, std::shared_ptr<const T> c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!map_.emplace(key, std::move(c)).second) return;
    order_.push_back(key);
    while (order_.size() > capacity_) {
      map_.erase(order_.front());
      order_.pop_front();
    }
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const T>> map_;
  std::deque<std::string> order_;  // insertion order, for eviction
};
using SharedMaskCache = SharedCache<StateMaskCache>;

class TokenVocabulary {
 public:
  explicit TokenVocabulary(TokenizerInfo info);

  int32_t vocab_size() const { return static_cast<int32_t>(info_.token_bytes.size()); }
  const std::string& bytes(int32_t id) const { return info_.token_bytes[id]; }
  bool is_stop(int32_t id) const { return kind_[id] == kStop; }
  bool is_grammar_token(int32_t id) const { return kind_[id] == kNormal; }  // walks the grammar
  // A special token offered as a grammar terminal (its bytes are special_token_bytes(id)).
  bool is_terminal(int32_t id) const;
  const std::vector<int32_t>& terminal_ids() const { return terminals_; }
  // The terminal whose token text (TokenizerInfo::token_bytes before the engine respelled it)
  // is `text`, e.g. "｜DSML｜"; nullopt when none is.
  std::optional<int32_t> terminal_named(std::string_view text) const;
  const std::vector<int32_t>& stop_ids() const { return info_.stop_ids; }

  // Trie nodes, [num_nodes]; node 0 is the root (empty prefix, byte unused).
  size_t num_nodes() const { return byte_.size(); }
  std::vector<uint8_t> byte_;      // byte on the edge into the node
  std::vector<int32_t> depth_;     // prefix length
  std::vector<int32_t> end_;       // one past the last node of the subtree
  std::vector<int32_t> parent_;    // [num_nodes] parent node (-1 for the root)
  std::vector<int32_t> tok_begin_; // [num_nodes + 1]: tokens ending at node i are
  std::vector<int32_t> tok_ids_;   //   tok_ids_[tok_begin_[i] .. tok_begin_[i+1])
  std::vector<int32_t> node_of_;   // [vocab_size] trie node of a grammar token, else -1
  std::vector<int32_t> rank_;      // [vocab_size] position in byte-sorted order (grammar tokens)
  std::vector<int32_t> lcp_prev_;  // [num grammar tokens] common prefix of rank k and rank k-1 (0 for k = 0)
  // [num_nodes] 256-bit set of the bytes on edges strictly below node i: a DFA state looping
  // on all of them accepts the whole subtree without walking it (mask_walk.cpp).
  std::vector<std::array<uint64_t, 4>> below_bytes_;
  // [num_nodes] bit s set: every path below node i is valid UTF-8 (complete characters, then at
  // most one truncated one; no overlongs, surrogates or code points past U+10FFFF) when
  // decoding starts in UTF-8 decoder state s (vocab.cpp; bit 0: at a character boundary).
  std::vector<uint8_t> utf8_below_;
  std::vector<int32_t> height_;    // [num_nodes] longest path below node i, in bytes (0: a leaf)
  // JSON string text: node i is "text" when the edge into it and everything below are JSON
  // string characters (ASCII 0x20-0x7F but '"' and '\\', or valid UTF-8 from a character
  // boundary). text_run_end_[i]: one past the last node of the maximal run of consecutive text
  // siblings starting at i (i itself when i is not text); text_run_height_[i]: the longest path
  // through that run, in bytes. A string-body state skips the whole run at once (mask_walk.cpp).
  std::vector<int32_t> text_run_end_;
  std::vector<int32_t> text_run_height_;
  static constexpr uint64_t kJsonText[2] = {0xFFFFFFFB00000000ull, 0xFFFFFFFFEFFFFFFFull};  // ASCII bits
  // text_le_[L]: rank bits of the grammar tokens that are JSON string text throughout (as
  // above, from a character boundary; a truncated last character counts as one) of 1..L
  // characters, L = 0..min(kMaxTextLe, max_depth_), [ceil(num grammar tokens / 64)] words each.
  // A counter state with L characters of text left and nothing after them accepts exactly
  // these among the all-text tokens, without walking them (mask_walk.cpp).
  static constexpr int32_t kMaxTextLe = 64;
  std::vector<std::vector<uint64_t>> text_le_;
  // The tokens of text_le_.back() (all-text, at most min(kMaxTextLe, max_depth_) characters) as
  // token id bits, [ceil(vocab_size/32)]: a real-stack re-walk whose text chain holds that far
  // ORs them in at once instead of setting ~110k bits one by one (matcher.cpp walk_ranks).
  std::vector<uint32_t> text_le_ids_;
  std::vector<uint32_t> grammar_bits_;  // [ceil(vocab_size/32)] bit set <=> a grammar token
  int32_t max_depth_ = 0;          // longest grammar token, bytes
  // [byte] the most bytes any grammar token has after an occurrence of the byte (-1: in no
  // token): after `"` only a few (`","`), after a letter or space many. Bounds how far the
  // mask walk can go past a byte, so state keys (mask_cache.cpp) stop there.
  std::array<int32_t, 256> after_byte_{};
  mutable SharedMaskCache shared_masks_{2048};  // filled lazily by every grammar over this vocabulary
  // Root-child subtrees walked from a state, by (state key id, escape flag, node): mask_walk.cpp.
  mutable SharedCache<SubtreeResult> shared_subtrees_{16384};
  // A small id per distinct state key (a key can be kilobytes; the subtree cache is looked up
  // once per root child). -1 once kMaxKeyIds keys exist.
  int32_t key_id(const std::string& key) const;
  static constexpr size_t kMaxKeyIds = 1 << 16;

 private:
  enum Kind : uint8_t { kNormal, kStop, kNever };
  TokenizerInfo info_;
  mutable std::mutex key_mu_;
  mutable std::unordered_map<std::string, int32_t> key_ids_;
  std::vector<uint8_t> kind_;  // [vocab_size]
  std::vector<int32_t> terminals_;  // sorted TokenizerInfo::terminal_ids
  std::vector<std::pair<std::string, int32_t>> terminal_texts_;  // their given bytes
};

// Longest-match tokenization over grammar tokens (not the model's BPE: any split of the same
// bytes walks the grammar the same way). nullopt if some byte has no token.
std::optional<std::vector<int32_t>> greedy_tokenize(const TokenVocabulary& v, std::string_view text);

}  // namespace deepinfer::structured
