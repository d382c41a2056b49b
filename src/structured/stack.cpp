#include "structured/stack.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::structured {

int32_t NodePool::intern(Frame f, bool scratch) {
  auto& index = scratch ? scratch_index_ : index_;
  auto& nodes = scratch ? scratch_ : nodes_;
  auto [it, inserted] = index.try_emplace(key(f), static_cast<int32_t>(nodes.size()));
  if (inserted) {
    DI_CHECK(nodes.size() < static_cast<size_t>(kScratch), "stack node pool exhausted");
    nodes.push_back(f);
  }
  return scratch ? (it->second | kScratch) : it->second;
}

// Closure of one frame: consume b here, or enter a called rule, or finish this rule and
// continue in the frame below. No left recursion (checked at build time) bounds the depth.
void Stepper::expand(Frame f, uint8_t b, std::vector<Frame>& out, bool* escaped, int depth) {
  const PdaState& st = pda_.states[f.state];
  if (st.has_calls || st.final) {
    if (std::find(visited_.begin(), visited_.end(), f) != visited_.end()) return;
    visited_.push_back(f);
  }
  DI_CHECK(depth < 100000, "runaway stack expansion");
  int32_t t = pda_.next(f.state, b);
  if (t >= 0) out.push_back({t, f.parent});
  for (int32_t k = st.calls_begin; k < st.calls_end; ++k) {
    const PdaCall& c = pda_.calls[k];
    int32_t parent = c.tail ? f.parent : pool_.intern({c.ret, f.parent}, scratch_);
    expand({pda_.rule_start[c.rule], parent}, b, out, escaped, depth + 1);
  }
  if (st.final) {
    if (f.parent >= 0)
      expand(pool_.node(f.parent), b, out, escaped, depth + 1);
    else if (f.parent == kBottom && escaped)
      *escaped = true;
  }
}

void Stepper::step(const std::vector<Frame>& in, uint8_t b, std::vector<Frame>& out, bool* escaped) {
  out.clear();
  visited_.clear();
  for (const Frame& f : in) {
    const PdaState& st = pda_.states[f.state];
    if (!st.has_calls && !st.final) {
      int32_t t = pda_.next(f.state, b);
      if (t >= 0) out.push_back({t, f.parent});
    } else {
      expand(f, b, out, escaped, 0);
    }
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

bool Stepper::finishes(Frame f, int depth) {
  const PdaState& st = pda_.states[f.state];
  if (std::find(visited_.begin(), visited_.end(), f) != visited_.end()) return false;
  visited_.push_back(f);
  if (st.final) {
    if (f.parent == kRootParent) return true;
    if (f.parent >= 0 && finishes(pool_.node(f.parent), depth + 1)) return true;
  }
  for (int32_t k = st.calls_begin; k < st.calls_end; ++k) {
    const PdaCall& c = pda_.calls[k];
    int32_t parent = c.tail ? f.parent : pool_.intern({c.ret, f.parent}, scratch_);
    if (finishes({pda_.rule_start[c.rule], parent}, depth + 1)) return true;
  }
  return false;
}

bool Stepper::can_finish(const std::vector<Frame>& in) {
  visited_.clear();
  for (const Frame& f : in)
    if (finishes(f, 0)) return true;
  return false;
}

void Stepper::next_bytes(const std::vector<Frame>& in, uint64_t bits[4]) {
  bits[0] = bits[1] = bits[2] = bits[3] = 0;
  std::vector<Frame> out;
  // One step per byte class is enough: bytes of a class behave the same.
  for (int b = 0; b < 256; ++b) {
    if (b > 0 && pda_.byte_class[b] == pda_.byte_class[b - 1]) {
      if (bits[(b - 1) >> 6] >> ((b - 1) & 63) & 1) bits[b >> 6] |= 1ull << (b & 63);
      continue;
    }
    step(in, static_cast<uint8_t>(b), out, nullptr);
    if (!out.empty()) bits[b >> 6] |= 1ull << (b & 63);
  }
}

bool pda_matches(const Pda& pda, std::string_view text) {
  if (pda.empty_language) return false;
  NodePool pool;
  Stepper stepper(pda, pool, false);
  std::vector<Frame> a{{pda.rule_start[pda.root], kRootParent}}, b;
  for (char c : text) {
    stepper.step(a, static_cast<uint8_t>(c), b, nullptr);
    if (b.empty()) return false;
    std::swap(a, b);
  }
  return stepper.can_finish(a);
}

}  // namespace deepinfer::structured
