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
    (scratch ? scratch_depth_ : depth_).push_back(depth(f.parent) + 1);
  }
  return scratch ? (it->second | kScratch) : it->second;
}

int32_t NodePool::with_key(int32_t set, int32_t key, bool scratch) {
  std::vector<uint64_t> w = set_words(set);
  if (w.size() <= static_cast<size_t>(key >> 6)) w.resize((key >> 6) + 1, 0);
  w[key >> 6] |= 1ull << (key & 63);
  // A set already in the persistent layer is reused from a scratch walk too.
  if (auto it = set_index_.find(w); it != set_index_.end()) return it->second;
  auto& index = scratch ? scratch_set_index_ : set_index_;
  auto& sets = scratch ? scratch_sets_ : sets_;
  auto [it, inserted] = index.try_emplace(w, static_cast<int32_t>(sets.size()));
  if (inserted) {
    DI_CHECK(sets.size() < static_cast<size_t>(kScratch), "key set pool exhausted");
    sets.push_back(std::move(w));
  }
  return scratch ? (it->second | kScratch) : it->second;
}

bool NodePool::has_key(int32_t set, int32_t key) const {
  const auto& w = set_words(set);
  return static_cast<size_t>(key >> 6) < w.size() && (w[key >> 6] >> (key & 63) & 1);
}

bool NodePool::any_missing(int32_t set, const std::vector<uint64_t>& keys) const {
  const auto& w = set_words(set);
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] & ~(i < w.size() ? w[i] : 0)) return true;
  return false;
}

bool NodePool::all_in(int32_t set, const std::vector<uint64_t>& keys) const { return !any_missing(set, keys); }

void Stepper::enter(int32_t t, const Frame& f, std::vector<Frame>& out) {
  const int32_t gi = pda_.states[t].guard;
  if (gi < 0) {
    out.push_back({t, f.parent, f.set});
    return;
  }
  if (f.set < 0) {  // unknown set: the walk goes on, marked as depending on it
    out.push_back({t, f.parent, kGuardedSet});
    return;
  }
  const PdaGuard& g = pda_.guards[gi];
  switch (g.kind) {
    case PdaGuard::kAlive:
      if (pool_.any_missing(f.set, g.keys)) out.push_back({t, f.parent, f.set});
      return;
    case PdaGuard::kAll:
      if (pool_.all_in(f.set, g.keys)) out.push_back({t, f.parent, f.set});
      return;
    case PdaGuard::kAdd:
      if (!pool_.has_key(f.set, g.key)) out.push_back({t, f.parent, pool_.with_key(f.set, g.key, scratch_)});
      return;
  }
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
  if (t >= 0) enter(t, f, out);
  for (int32_t k = st.calls_begin; k < st.calls_end; ++k) {
    const PdaCall& c = pda_.calls[k];
    if (!c.tail && pool_.depth(f.parent) >= NodePool::kMaxDepth) continue;  // too deep: not accepted
    int32_t parent = c.tail ? f.parent : pool_.intern({c.ret, f.parent, f.set}, scratch_);
    expand({pda_.rule_start[c.rule], parent, 0}, b, out, escaped, depth + 1);
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
      if (t >= 0) enter(t, f, out);
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
    if (!c.tail && pool_.depth(f.parent) >= NodePool::kMaxDepth) continue;
    int32_t parent = c.tail ? f.parent : pool_.intern({c.ret, f.parent, f.set}, scratch_);
    if (finishes({pda_.rule_start[c.rule], parent, 0}, depth + 1)) return true;
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
