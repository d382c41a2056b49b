// Text chains (matcher.cpp walk_ranks, mask_walk.cpp compute_state_cache): the configurations
// after k characters of JSON string text from a frame, while they do not depend on which
// characters. Then any text of up to that many characters is alive, and a run of text trie
// siblings (vocab.h text_run_end_) is accepted whole without stepping it.
#pragma once
#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "structured/stack.h"
#include "structured/vocab.h"

namespace deepinfer::structured {


// Valid multi-byte UTF-8 characters as byte ranges (the strict decoder of vocab.cpp).
struct TextSpan {
  uint8_t lo, hi;
};
// Never destroyed: the mask precompute workers may still be walking when a process calls exit()
// with an LLM alive (static destructors run while the workers do); a destroyed table there was a
// segfault (StructuredProbe.SchemaObjectsNestedThirtyAndHundredDeepCompileInBudget).
inline const std::vector<std::vector<TextSpan>>& text_chain_utf8_chars() {
  static const auto* kChars = new std::vector<std::vector<TextSpan>>{
      {{0xC2, 0xDF}, {0x80, 0xBF}},
      {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
      {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
      {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
      {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}}};
  return *kChars;
}

// True if text made of `loops`' ASCII bytes and valid multi-byte UTF-8 characters never dies
// from `state`, visiting at most max_closure states (state_facts.cpp, which says more).
bool text_stays_alive(const Pda& pda, int32_t state, const std::array<uint64_t, 4>& loops, size_t max_closure = 32,
                      std::vector<int32_t>* members = nullptr, std::vector<int32_t>* dead_path = nullptr);

inline constexpr size_t kMaxChainMemo = 4096;

inline bool ascii_text(uint8_t b) { return b < 0x80 && (TokenVocabulary::kJsonText[b >> 6] >> (b & 63) & 1); }

// Configurations after k characters of JSON string text from a real frame, while they do not
// depend on which characters: c[k + 1] is what every text character (each ASCII text byte, each
// valid multi-byte UTF-8 character) steps c[k] to, one and the same non-empty set. A counted
// string whose body is called blocks (json_schema_parts.cpp, counted_repeat) has such a chain
// across the blocks' ends, where the state's own cache leaves nearly every token uncertain.
class TextChain {
 public:
  using Memo = std::map<std::vector<Frame>, std::vector<Frame>>;
  // `pool` interns the chain's frames in its persistent layer (they outlive a mask's scratch).
  // `accepts(config)`: whether a token ending in that configuration counts as alive (the mask
  // cache walk also needs a frame clear of key-set checks); the chain breaks where it does not.
  TextChain(const Pda& pda, NodePool& pool, Memo& memo, Frame f, int32_t cap,
            std::function<bool(const std::vector<Frame>&)> accepts = nullptr)
      : pda_(pda), stepper_(pda, pool, false), memo_(memo), cap_(cap), accepts_(std::move(accepts)) {
    c_.push_back({f});
  }
  // True if any text of `chars` characters (or a prefix of one) from the frame stays alive.
  bool holds(int32_t chars) {
    while (verified() < chars && !broken_) extend();
    return verified() >= chars;
  }
  // The configuration after `chars` characters of text; holds(chars) must be true.
  const std::vector<Frame>& config(int32_t chars) const {
    return static_cast<size_t>(chars) < c_.size() ? c_[chars] : c_.back();
  }

 private:
  int32_t verified() const { return periodic_ ? INT32_MAX : static_cast<int32_t>(c_.size()) - 1; }
  void extend() {
    if (static_cast<int32_t>(c_.size()) > cap_) {
      broken_ = true;
      return;
    }
    const std::vector<Frame> from = c_.back();  // c_ may reallocate below
    auto it = memo_.find(from);
    if (it == memo_.end()) {
      if (memo_.size() >= kMaxChainMemo) memo_.clear();
      it = memo_.emplace(from, step_text(from)).first;
    }
    const std::vector<Frame>& next = it->second;
    if (next.empty()) {
      broken_ = true;
    } else if (accepts_ && !accepts_(next)) {
      broken_ = true;
    } else if (next == from) {
      periodic_ = true;  // every further character steps back here
    } else {
      c_.push_back(next);
    }
  }

  void ready_class_ends() {
    if (class_end_ready_) return;
    for (int b = 255; b >= 0; --b)
      class_end_[b] = b < 255 && pda_.byte_class[b + 1] == pda_.byte_class[b] ? class_end_[b + 1] : b;
    class_end_ready_ = true;
  }

  // The state every JSON text character takes `s` to inside its own frame, or -1: s, and every
  // state inside a multi-byte character from it, has no calls, is not final and holds no
  // key-set check, and every ASCII text byte and every valid multi-byte character ends in one
  // and the same state. A frame in such a state steps text exactly as Stepper::step would
  // (enter() of a plain transition: same parent and key set), without interning or sorting.
  int32_t plain_text_next(int32_t s) {
    auto plain = [&](int32_t u) {
      const PdaState& st = pda_.states[u];
      return !st.has_calls && !st.final && st.guard < 0;
    };
    if (!plain(s)) return -1;
    int32_t t = -1;
    for (int b = 0x20; b < 0x80; b = class_end_[b] + 1)
      for (int x = b; x <= class_end_[b] && x < 0x80; ++x) {  // mixed classes: every text byte
        if (!ascii_text(static_cast<uint8_t>(x))) continue;
        const int32_t u = pda_.next(s, static_cast<uint8_t>(x));
        if (u < 0 || (t >= 0 && u != t)) return -1;
        t = u;
      }
    if (t < 0 || pda_.states[t].guard >= 0) return -1;
    int32_t cur[8], nxt[8];
    for (const auto& ch : text_chain_utf8_chars()) {
      int nc = 1, nn = 0;
      cur[0] = s;
      for (size_t i = 0; i < ch.size(); ++i) {
        nn = 0;
        for (int j = 0; j < nc; ++j)
          for (int b = ch[i].lo; b <= ch[i].hi; b = class_end_[b] + 1) {
            const int32_t u = pda_.next(cur[j], static_cast<uint8_t>(b));
            if (u < 0) return -1;
            if (std::find(nxt, nxt + nn, u) != nxt + nn) continue;
            if (nn == 8 || (i + 1 < ch.size() && !plain(u))) return -1;
            nxt[nn++] = u;
          }
        std::copy(nxt, nxt + nn, cur);
        nc = nn;
      }
      for (int j = 0; j < nc; ++j)
        if (cur[j] != t) return -1;
    }
    return t;
  }

  // What every text character steps `from` to, or empty when they differ or one dies.
  std::vector<Frame> step_text(const std::vector<Frame>& from) {
    ready_class_ends();
    if (!accepts_) {  // every frame in a plain text state (inside a string or a counted block)
      std::vector<Frame> out;
      out.reserve(from.size());
      for (const Frame& f : from) {
        auto it = plain_next_.find(f.state);
        if (it == plain_next_.end()) it = plain_next_.emplace(f.state, plain_text_next(f.state)).first;
        if (it->second < 0) break;
        out.push_back({it->second, f.parent, f.set});
      }
      if (out.size() == from.size()) {
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        return out;
      }
    }
    std::vector<Frame> next;
    stepper_.step(from, static_cast<uint8_t>('a'), next, nullptr);  // fails fast outside text
    if (next.empty()) return {};
    std::vector<Frame> out;
    for (int b = 0x20; b < 0x80; b = class_end_[b] + 1) {
      // A class either lies inside the text bytes or holds a non-text byte: step the text
      // bytes of it one by one only when mixed (classes are intervals, so this is rare).
      for (int x = b; x <= class_end_[b] && x < 0x80; ++x) {
        if (!ascii_text(static_cast<uint8_t>(x))) continue;
        stepper_.step(from, static_cast<uint8_t>(x), out, nullptr);
        if (out != next) return {};
        bool whole = true;
        for (int y = b; y <= class_end_[b]; ++y) whole = whole && ascii_text(static_cast<uint8_t>(y));
        if (whole) break;  // one byte stands for its class
      }
    }
    std::vector<std::vector<Frame>> cur, nxt;
    for (const auto& ch : text_chain_utf8_chars()) {
      cur.assign(1, from);
      for (const TextSpan& sp : ch) {
        nxt.clear();
        for (const auto& u : cur)
          for (int b = sp.lo; b <= sp.hi; b = class_end_[b] + 1) {
            stepper_.step(u, static_cast<uint8_t>(b), out, nullptr);
            if (out.empty() || (accepts_ && !accepts_(out))) return {};
            if (std::find(nxt.begin(), nxt.end(), out) == nxt.end()) nxt.push_back(out);
          }
        std::swap(cur, nxt);
      }
      for (const auto& u : cur)
        if (u != next) return {};
    }
    return next;
  }

  const Pda& pda_;
  Stepper stepper_;  // persistent interning: memo entries outlive the mask's scratch nodes
  Memo& memo_;
  int32_t cap_;
  std::function<bool(const std::vector<Frame>&)> accepts_;
  std::vector<std::vector<Frame>> c_;
  std::unordered_map<int32_t, int32_t> plain_next_;  // plain_text_next memo, per state
  bool broken_ = false, periodic_ = false, class_end_ready_ = false;
  int class_end_[256];
};


}  // namespace deepinfer::structured
