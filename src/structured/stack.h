// Runtime of the pushdown automaton: a configuration is a set of Frames, each the current
// DFA state plus a pointer to the rest of its stack (an interned node: equal stacks share one
// id, so a configuration set deduplicates by value and memory grows only with new stacks).
#pragma once
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "structured/automaton.h"

namespace deepinfer::structured {

inline constexpr int32_t kRootParent = -1;  // nothing below: finishing here ends the grammar
inline constexpr int32_t kBottom = -2;      // unknown context (mask cache walks): finishing "escapes"

struct Frame {
  int32_t state;
  int32_t parent;  // node id, kRootParent or kBottom
  bool operator==(const Frame&) const = default;
  bool operator<(const Frame& o) const { return state != o.state ? state < o.state : parent < o.parent; }
};

// Interned stack nodes. A node is a Frame (return state, its parent node). Ids with kScratch
// set live in a second layer that the owner clears after a mask computation, so speculative
// walks never grow the persistent layer.
class NodePool {
 public:
  static constexpr int32_t kScratch = 1 << 30;

  int32_t intern(Frame f, bool scratch);
  const Frame& node(int32_t id) const { return id & kScratch ? scratch_[id & ~kScratch] : nodes_[id]; }
  void clear_scratch() {
    scratch_.clear();
    scratch_index_.clear();
  }
  size_t size() const { return nodes_.size(); }

 private:
  static uint64_t key(Frame f) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(f.state)) << 32) | static_cast<uint32_t>(f.parent);
  }
  std::vector<Frame> nodes_, scratch_;
  std::unordered_map<uint64_t, int32_t> index_, scratch_index_;
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
