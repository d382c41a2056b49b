// Runtime of the pushdown automaton: a configuration is a set of Frames, each the current
// DFA state plus a pointer to the rest of its stack (an interned node: equal stacks share one
// id, so a configuration set deduplicates by value and memory grows only with new stacks).
#pragma once
#include <cstdint>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "structured/automaton.h"

namespace deepinfer::structured {

inline constexpr int32_t kRootParent = -1;  // nothing below: finishing here ends the grammar
inline constexpr int32_t kBottom = -2;      // unknown context (mask cache walks): finishing "escapes"
// Frame::set values besides set ids: the key set is not known (the bottom frame of a mask cache
// walk), or not known and a guard was passed (the result then depends on the real set).
inline constexpr int32_t kUnknownSet = -1;
inline constexpr int32_t kGuardedSet = -2;

struct Frame {
  int32_t state;
  int32_t parent;    // node id, kRootParent or kBottom
  int32_t set = 0;   // keys written in this frame's tracked object (NodePool set id; 0 = none)
  bool operator==(const Frame&) const = default;
  bool operator<(const Frame& o) const {
    return state != o.state ? state < o.state : parent != o.parent ? parent < o.parent : set < o.set;
  }
};

// Interned stack nodes. A node is a Frame (return state, its parent node). Ids with kScratch
// set live in a second layer that the owner clears after a mask computation, so speculative
// walks never grow the persistent layer.
class NodePool {
 public:
  static constexpr int32_t kScratch = 1 << 30;

  // Frames a stack may hold: deeper nesting (JSON nested thousands of levels, a recursive rule
  // repeated without end) is not accepted, so no walk recurses deeper than this.
  static constexpr int32_t kMaxDepth = 2048;

  int32_t intern(Frame f, bool scratch);
  const Frame& node(int32_t id) const { return id & kScratch ? scratch_[id & ~kScratch] : nodes_[id]; }
  // Frames in the stack whose top node is `id` (0 for kRootParent / kBottom).
  int32_t depth(int32_t id) const {
    return id < 0 ? 0 : id & kScratch ? scratch_depth_[id & ~kScratch] : depth_[id];
  }
  void clear_scratch() {
    scratch_.clear();
    scratch_depth_.clear();
    scratch_index_.clear();
    scratch_sets_.clear();
    scratch_set_index_.clear();
  }
  size_t size() const { return nodes_.size(); }

  // Key sets (tracked objects): interned bit sets, id 0 the empty set. with_key(set, k) is the
  // id of set + {k}; has_key tests a bit; any_missing: some key of `keys` is not in the set;
  // all_in: every key of `keys` is.
  int32_t with_key(int32_t set, int32_t key, bool scratch);
  bool has_key(int32_t set, int32_t key) const;
  bool any_missing(int32_t set, const std::vector<uint64_t>& keys) const;
  bool all_in(int32_t set, const std::vector<uint64_t>& keys) const;

 private:
  struct Key {
    uint64_t sp;
    int32_t set;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return (k.sp * 0x9e3779b97f4a7c15ull) ^ static_cast<uint32_t>(k.set); }
  };
  static Key key(Frame f) {
    return {(static_cast<uint64_t>(static_cast<uint32_t>(f.state)) << 32) | static_cast<uint32_t>(f.parent), f.set};
  }
  const std::vector<uint64_t>& set_words(int32_t id) const {
    return id & kScratch ? scratch_sets_[id & ~kScratch] : sets_[id];
  }
  std::vector<Frame> nodes_, scratch_;
  std::vector<int32_t> depth_, scratch_depth_;
  std::unordered_map<Key, int32_t, KeyHash> index_, scratch_index_;
  std::vector<std::vector<uint64_t>> sets_{std::vector<uint64_t>{}}, scratch_sets_;
  std::map<std::vector<uint64_t>, int32_t> set_index_{{std::vector<uint64_t>{}, 0}}, scratch_set_index_;
};

// Byte steps over configuration sets. `scratch` selects where pushed frames are interned.
class Stepper {
 public:
  Stepper(const Pda& pda, NodePool& pool, bool scratch) : pda_(pda), pool_(pool), scratch_(scratch) {}

  // out = frames reachable from `in` by consuming byte b (sorted, unique). Sets *escaped when
  // some frame could finish its bottom rule (parent kBottom) before b.
  void step(const std::vector<Frame>& in, uint8_t b, std::vector<Frame>& out, bool* escaped);
  // True if some frame can finish the whole grammar without consuming input.
  bool can_finish(const std::vector<Frame>& in);
  // Bytes b with a non-empty step (as a 256-bit set).
  void next_bytes(const std::vector<Frame>& in, uint64_t bits[4]);

 private:
  void expand(Frame f, uint8_t b, std::vector<Frame>& out, bool* escaped, int depth);
  // Pushes the frame that stepping into state t from `f` gives, after t's guard (if any).
  void enter(int32_t t, const Frame& f, std::vector<Frame>& out);
  bool finishes(Frame f, int depth);
  const Pda& pda_;
  NodePool& pool_;
  bool scratch_;
  std::vector<Frame> visited_;
};

// Whole-string match of raw bytes against the automaton (compile-time checks, e.g. filtering
// enum values through the rest of their schema).
bool pda_matches(const Pda& pda, std::string_view text);

}  // namespace deepinfer::structured
