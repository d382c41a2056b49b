#include "structured/automaton.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "core/check.h"

namespace deepinfer::structured {
namespace {

using Clock = std::chrono::steady_clock;

// Rules that produce at least one finite string (fixpoint); refs to the others act as Nothing.
std::vector<bool> productive_rules(const Grammar& g) {
  std::vector<bool> prod(g.rules.size(), false);
  std::function<bool(ExprId)> ok = [&](ExprId id) -> bool {
    const Expr& e = g.exprs[id];
    switch (e.kind) {
      case ExprKind::kNothing: return false;
      case ExprKind::kEmpty:
      case ExprKind::kBytes:
      case ExprKind::kAutomaton: return true;
      case ExprKind::kSeq:
        for (ExprId c : e.children) if (!ok(c)) return false;
        return true;
      case ExprKind::kAlt:
        for (ExprId c : e.children) if (ok(c)) return true;
        return false;
      case ExprKind::kRepeat: return e.min == 0 || ok(e.children[0]);
      case ExprKind::kRef: return prod[e.rule];
    }
    return false;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r)
      if (!prod[r] && ok(g.rules[r].body)) prod[r] = changed = true;
  }
  return prod;
}

void collect_refs(const Grammar& g, ExprId id, std::vector<RuleId>& out) {
  const Expr& e = g.exprs[id];
  if (e.kind == ExprKind::kRef) out.push_back(e.rule);
  for (ExprId c : e.children) collect_refs(g, c, out);
}

// Rules on a cycle of references (Tarjan SCC: a rule is recursive when its SCC has > 1 rule
// or it refers to itself).
std::vector<bool> recursive_rules(const Grammar& g) {
  size_t n = g.rules.size();
  std::vector<std::vector<RuleId>> adj(n);
  for (size_t r = 0; r < n; ++r) collect_refs(g, g.rules[r].body, adj[r]);
  std::vector<int> index(n, -1), low(n, 0), comp(n, -1);
  std::vector<bool> on_stack(n, false), rec(n, false);
  std::vector<int> stack;
  int counter = 0;
  std::function<void(int)> visit = [&](int v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack[v] = true;
    for (int w : adj[v]) {
      if (index[w] < 0) { visit(w); low[v] = std::min(low[v], low[w]); }
      else if (on_stack[w]) low[v] = std::min(low[v], index[w]);
    }
    if (low[v] == index[v]) {
      std::vector<int> members;
      int w;
      do { w = stack.back(); stack.pop_back(); on_stack[w] = false; members.push_back(w); } while (w != v);
      if (members.size() > 1) for (int m : members) rec[m] = true;
    }
  };
  for (size_t r = 0; r < n; ++r) if (index[r] < 0) visit(static_cast<int>(r));
  for (size_t r = 0; r < n; ++r)
    if (std::find(adj[r].begin(), adj[r].end(), static_cast<RuleId>(r)) != adj[r].end()) rec[r] = true;
  return rec;
}

struct NfaEdge { uint8_t lo, hi; int32_t to; };

// Interned NFA state sets of one rule's subset construction: the sorted sets lie back to back
// in one arena and an open-addressing table maps a set to its index. Every DFA transition
// looks a set up, so no allocation per lookup (an unordered_map of vectors spent a third of
// compile time in malloc/free).
class SetTable {
 public:
  void clear() {
    arena_.clear();
    begin_.assign(1, 0);
    hashes_.clear();
    slots_.assign(256, -1);
  }
  int32_t size() const { return static_cast<int32_t>(hashes_.size()); }
  const int32_t* data(int32_t k) const { return arena_.data() + begin_[k]; }
  uint32_t length(int32_t k) const { return begin_[k + 1] - begin_[k]; }
  // Index of `set` (sorted, unique); added as index size() when absent (*added = true).
  int32_t intern(const std::vector<int32_t>& set, bool* added) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ set.size();
    for (int32_t x : set) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull + (h >> 29);
    const size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const int32_t k = slots_[i];
      if (k < 0) break;
      if (hashes_[k] == h && length(k) == set.size() &&
          std::equal(set.begin(), set.end(), data(k))) {
        *added = false;
        return k;
      }
    }
    const int32_t k = size();
    hashes_.push_back(h);
    arena_.insert(arena_.end(), set.begin(), set.end());
    begin_.push_back(static_cast<uint32_t>(arena_.size()));
    if (hashes_.size() * 2 > slots_.size()) {
      slots_.assign(slots_.size() * 2, -1);
      for (int32_t j = 0; j < k; ++j) place(j);
    }
    place(k);
    *added = true;
    return k;
  }

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
  std::vector<int32_t> slots_;    // power of two; set index or -1
};
struct NfaState {
  std::vector<int32_t> eps;
  std::vector<NfaEdge> bytes;
  std::vector<std::pair<int32_t, int32_t>> calls;  // (compiled rule, target)
};

class Builder {
 public:
  Builder(const Grammar& g, const AutomatonLimits& lim) : g_(g), lim_(lim) {
    prod_ = productive_rules(g);
    rec_ = recursive_rules(g);
    deadline_ = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(lim.time_limit_ms * 1000));
  }

  Pda run();

 private:
  int32_t compiled_index(RuleId r) {
    auto it = index_of_.find(r);
    if (it != index_of_.end()) return it->second;
    int32_t idx = static_cast<int32_t>(kept_.size());
    index_of_[r] = idx;
    kept_.push_back(r);
    return idx;
  }
  int32_t new_state() {
    nfa_.emplace_back();
    if (static_cast<int64_t>(nfa_.size()) + nfa_total_ > lim_.max_nfa_states)
      DI_THROW(GrammarError, "grammar too large: more than ", lim_.max_nfa_states,
               " automaton states after expanding repetitions");
    return static_cast<int32_t>(nfa_.size() - 1);
  }
  void check_time() {
    if (Clock::now() > deadline_)
      DI_THROW(GrammarError, "grammar compilation exceeded its time limit of ", lim_.time_limit_ms, " ms");
  }
  int32_t build(ExprId id, int32_t start, int depth);
  void build_rule_nfa(int32_t idx);
  void determinize(int32_t idx, Pda& pda);
  void eps_closure(std::vector<int32_t>& set);
  std::vector<uint32_t> stamp_;  // [nfa states] == generation_ when visited
  uint32_t generation_ = 0;
  std::vector<int32_t> work_;
  int32_t cur_final_ = -1;  // final NFA state of the rule being determinised
  // Subset-construction scratch, reused across states and rules (no allocation per state).
  SetTable sets_;
  std::vector<std::vector<int32_t>> targets_;  // [class] NFA targets of the current state
  std::vector<int32_t> closed_, ret_set_;
  std::vector<std::pair<int32_t, int32_t>> call_pairs_;  // (callee, NFA return state)

  const Grammar& g_;
  AutomatonLimits lim_;
  std::vector<bool> prod_, rec_;
  Clock::time_point deadline_;
  std::unordered_map<RuleId, int32_t> index_of_;
  std::vector<RuleId> kept_;             // compiled rule index -> grammar rule
  std::vector<NfaState> nfa_;            // NFA of the rule being built
  std::vector<std::vector<NfaState>> rule_nfas_;
  std::vector<int32_t> rule_nfa_final_;  // per compiled rule: its NFA's final state
  int64_t nfa_total_ = 0;
};

int32_t Builder::build(ExprId id, int32_t start, int depth) {
  const Expr& e = g_.exprs[id];
  if (depth > 10'000) DI_THROW(GrammarError, "grammar nesting too deep while inlining rules");
  switch (e.kind) {
    case ExprKind::kNothing: return new_state();  // unreachable end
    case ExprKind::kEmpty: return start;
    case ExprKind::kBytes: {
      int32_t end = new_state();
      for (ByteRange r : e.ranges) nfa_[start].bytes.push_back({r.lo, r.hi, end});
      return end;
    }
    case ExprKind::kSeq: {
      int32_t cur = start;
      for (ExprId c : e.children) cur = build(c, cur, depth + 1);
      return cur;
    }
    case ExprKind::kAlt: {
      int32_t end = new_state();
      for (ExprId c : e.children) {
        int32_t s = new_state();
        nfa_[start].eps.push_back(s);
        int32_t t = build(c, s, depth + 1);
        nfa_[t].eps.push_back(end);
      }
      return end;
    }
    case ExprKind::kRepeat: {
      int32_t cur = start;
      for (int32_t i = 0; i < e.min; ++i) cur = build(e.children[0], cur, depth + 1);
      if (e.max == kUnbounded) {
        int32_t loop = new_state();
        nfa_[cur].eps.push_back(loop);
        int32_t t = build(e.children[0], loop, depth + 1);
        nfa_[t].eps.push_back(loop);
        return loop;
      }
      int32_t end = new_state();
      for (int32_t i = e.min; i < e.max; ++i) {
        nfa_[cur].eps.push_back(end);
        int32_t s = new_state();
        nfa_[cur].eps.push_back(s);
        cur = build(e.children[0], s, depth + 1);
        if ((i & 63) == 0) check_time();
      }
      nfa_[cur].eps.push_back(end);
      return end;
    }
    case ExprKind::kRef: {
      if (!prod_[e.rule]) return new_state();
      const Rule& r = g_.rules[e.rule];
      if (rec_[e.rule] || !r.inline_ok) {
        int32_t end = new_state();
        nfa_[start].calls.push_back({compiled_index(e.rule), end});
        return end;
      }
      return build(r.body, start, depth + 1);
    }
    case ExprKind::kAutomaton: {
      const ByteAutomaton& a = g_.automata[e.automaton];
      int32_t base = static_cast<int32_t>(nfa_.size());
      for (int32_t i = 0; i < a.num_states; ++i) new_state();
      int32_t end = new_state();
      for (const auto& ed : a.edges) nfa_[base + ed.from].bytes.push_back({ed.lo, ed.hi, base + ed.to});
      for (int32_t i = 0; i < a.num_states; ++i)
        if (a.final[i]) nfa_[base + i].eps.push_back(end);
      nfa_[start].eps.push_back(base + a.start);
      return end;
    }
  }
  return new_state();
}

void Builder::build_rule_nfa(int32_t idx) {
  nfa_.clear();
  int32_t start = new_state();
  DI_CHECK(start == 0);
  int32_t end = build(g_.rules[kept_[idx]].body, start, 0);
  nfa_total_ += static_cast<int64_t>(nfa_.size());
  rule_nfas_.push_back(std::move(nfa_));
  rule_nfa_final_.push_back(end);
  check_time();
}

void Builder::eps_closure(std::vector<int32_t>& set) {
  // Generation stamps instead of a fresh visited array: closures run once per DFA transition.
  const auto& nfa = rule_nfas_.back();
  if (stamp_.size() < nfa.size()) stamp_.assign(nfa.size(), 0);
  ++generation_;
  work_.assign(set.begin(), set.end());
  for (int32_t s : set) stamp_[s] = generation_;
  while (!work_.empty()) {
    int32_t s = work_.back();
    work_.pop_back();
    for (int32_t t : nfa[s].eps)
      if (stamp_[t] != generation_) { stamp_[t] = generation_; set.push_back(t); work_.push_back(t); }
  }
  // Keep only the states that decide behaviour (byte edges, calls, the end): two closures that
  // differ only in pass-through states are the same DFA state. Without this a string body had
  // a twin state per character class, which doubled the states and hid self-loops from the
  // mask walk.
  set.erase(std::remove_if(set.begin(), set.end(),
                           [&](int32_t s) { return nfa[s].bytes.empty() && nfa[s].calls.empty() && s != cur_final_; }),
            set.end());
  std::sort(set.begin(), set.end());
}

Pda Builder::run() {
  Pda pda;
  if (!prod_[g_.root]) {
    pda.empty_language = true;
    return pda;
  }
  pda.root = compiled_index(g_.root);
  for (size_t i = 0; i < kept_.size(); ++i) build_rule_nfa(static_cast<int32_t>(i));  // grows kept_
  // Byte classes: intervals between all edge boundaries.
  std::vector<bool> boundary(257, false);
  boundary[0] = boundary[256] = true;
  for (const auto& nfa : rule_nfas_)
    for (const auto& s : nfa)
      for (const auto& e : s.bytes) boundary[e.lo] = boundary[e.hi + 1] = true;
  int32_t cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (boundary[b]) ++cls;
    pda.byte_class[b] = static_cast<uint8_t>(cls);
  }
  pda.num_classes = cls + 1;
  pda.rule_start.assign(kept_.size(), -1);
  for (int32_t r : kept_) pda.rule_names.push_back(g_.rules[r].name);
  auto nfas = std::move(rule_nfas_);
  for (size_t i = 0; i < kept_.size(); ++i) {
    rule_nfas_.assign(1, std::move(nfas[i]));  // determinize reads rule_nfas_.back()
    stamp_.assign(rule_nfas_.back().size(), 0);
    generation_ = 0;
    determinize(static_cast<int32_t>(i), pda);
  }
  return pda;
}

void Builder::determinize(int32_t idx, Pda& pda) {
  const auto& nfa = rule_nfas_.back();
  const int32_t nfa_final = rule_nfa_final_[idx];
  cur_final_ = nfa_final;
  const int32_t nc = pda.num_classes;
  const int32_t first = static_cast<int32_t>(pda.states.size());
  sets_.clear();
  // Closes `raw` (NFA targets) into closed_ and returns its DFA state, adding it when new.
  auto intern = [&](const std::vector<int32_t>& raw) -> int32_t {
    closed_.assign(raw.begin(), raw.end());
    eps_closure(closed_);
    if (closed_.empty()) return -1;  // only dead ends: no state
    bool added = false;
    const int32_t id = first + sets_.intern(closed_, &added);
    if (added) {
      if (static_cast<int64_t>(id) >= lim_.max_dfa_states)
        DI_THROW(GrammarError, "grammar too large: more than ", lim_.max_dfa_states, " automaton states");
      pda.states.push_back(PdaState{.rule = idx});
      pda.trans.resize(pda.trans.size() + nc, -1);
    }
    return id;
  };
  pda.rule_start[idx] = intern({0});
  targets_.resize(std::max<size_t>(targets_.size(), nc));
  for (int32_t k = 0; k < sets_.size(); ++k) {
    if ((k & 255) == 0) check_time();
    const int32_t cur = first + k;
    for (int c = 0; c < nc; ++c) targets_[c].clear();
    call_pairs_.clear();
    bool fin = false;
    // Read set k before interning anything (interning may move the arena).
    const int32_t* set = sets_.data(k);
    for (uint32_t j = 0, n = sets_.length(k); j < n; ++j) {
      const int32_t s = set[j];
      if (s == nfa_final) fin = true;
      for (const auto& e : nfa[s].bytes)
        for (int c = pda.byte_class[e.lo]; c <= pda.byte_class[e.hi]; ++c) targets_[c].push_back(e.to);
      for (auto [r, t] : nfa[s].calls) call_pairs_.push_back({r, t});
    }
    pda.states[cur].final = fin;
    // Neighbouring classes usually have the same targets (every ordinary character of a
    // string body): reuse the previous class's closure instead of closing and hashing again.
    int32_t prev_c = -1, prev_t = -1;
    for (int c = 0; c < nc; ++c) {
      std::vector<int32_t>& tc = targets_[c];
      if (tc.empty()) continue;
      if (tc.size() > 1) {
        std::sort(tc.begin(), tc.end());
        tc.erase(std::unique(tc.begin(), tc.end()), tc.end());
      }
      const int32_t t = prev_c >= 0 && tc == targets_[prev_c] ? prev_t : intern(tc);
      pda.trans[static_cast<size_t>(cur) * nc + c] = t;
      prev_c = c;
      prev_t = t;
    }
    // Calls grouped by callee (ascending rule index): one return state per callee.
    pda.states[cur].calls_begin = static_cast<int32_t>(pda.calls.size());
    std::sort(call_pairs_.begin(), call_pairs_.end());
    for (size_t j = 0; j < call_pairs_.size();) {
      const int32_t r = call_pairs_[j].first;
      ret_set_.clear();
      for (; j < call_pairs_.size() && call_pairs_[j].first == r; ++j)
        if (ret_set_.empty() || ret_set_.back() != call_pairs_[j].second) ret_set_.push_back(call_pairs_[j].second);
      const int32_t t = intern(ret_set_);
      if (t >= 0) pda.calls.push_back(PdaCall{.rule = r, .ret = t, .tail = false});
    }
    pda.states[cur].calls_end = static_cast<int32_t>(pda.calls.size());
    pda.states[cur].has_calls = pda.states[cur].calls_end > pda.states[cur].calls_begin;
  }
}

// Removes states that cannot reach the end of their rule, marks tail calls, and rejects left
// recursion (a rule reaching a call to itself without consuming a byte would loop forever).
void finalize(Pda& pda) {
  const size_t n = pda.states.size();
  const int32_t nc = pda.num_classes;
  // Predecessors in CSR form (one allocation, not one vector per state); a call's return
  // state is in the caller's rule.
  std::vector<int32_t> pred_begin(n + 1, 0), preds;
  auto for_each_edge = [&](auto&& f) {
    for (size_t s = 0; s < n; ++s) {
      const int32_t* row = &pda.trans[s * nc];
      for (int c = 0; c < nc; ++c)
        if (row[c] >= 0 && (c == 0 || row[c] != row[c - 1])) f(static_cast<int32_t>(s), row[c]);
      for (int32_t k = pda.states[s].calls_begin; k < pda.states[s].calls_end; ++k)
        f(static_cast<int32_t>(s), pda.calls[k].ret);
    }
  };
  for_each_edge([&](int32_t, int32_t t) { ++pred_begin[t + 1]; });
  for (size_t s = 0; s < n; ++s) pred_begin[s + 1] += pred_begin[s];
  preds.resize(pred_begin[n]);
  {
    std::vector<int32_t> fill(pred_begin.begin(), pred_begin.end() - 1);
    for_each_edge([&](int32_t s, int32_t t) { preds[fill[t]++] = s; });
  }
  std::vector<bool> live(n, false);
  std::vector<int32_t> work;
  for (size_t s = 0; s < n; ++s) if (pda.states[s].final) { live[s] = true; work.push_back(static_cast<int32_t>(s)); }
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (int32_t k = pred_begin[s]; k < pred_begin[s + 1]; ++k)
      if (!live[preds[k]]) { live[preds[k]] = true; work.push_back(preds[k]); }
  }
  for (size_t s = 0; s < n; ++s) {
    for (int c = 0; c < nc; ++c) {
      int32_t& t = pda.trans[s * nc + c];
      if (t >= 0 && !live[t]) t = -1;
    }
  }
  // Compact calls in place, dropping those whose return state is dead.
  std::vector<PdaCall> calls;
  for (size_t s = 0; s < n; ++s) {
    auto& st = pda.states[s];
    int32_t b = static_cast<int32_t>(calls.size());
    for (int32_t k = st.calls_begin; k < st.calls_end; ++k)
      if (live[pda.calls[k].ret]) calls.push_back(pda.calls[k]);
    st.calls_begin = b;
    st.calls_end = static_cast<int32_t>(calls.size());
    st.has_calls = st.calls_end > b;
  }
  pda.calls = std::move(calls);
  pda.rule_called.assign(pda.rule_start.size(), false);
  for (auto& c : pda.calls) {
    pda.rule_called[c.rule] = true;
    const auto& rs = pda.states[c.ret];
    bool any_out = rs.has_calls;
    for (int k = 0; k < nc && !any_out; ++k) any_out = pda.trans[static_cast<size_t>(c.ret) * nc + k] >= 0;
    c.tail = rs.final && !any_out;
  }
  // Nullable rules, then rules reachable at the start of a rule without consuming input.
  const size_t nr = pda.rule_start.size();
  std::vector<bool> nullable(nr, false);
  auto null_reach = [&](size_t r) {
    std::vector<int32_t> seen{pda.rule_start[r]}, stack{pda.rule_start[r]};
    while (!stack.empty()) {
      int32_t s = stack.back();
      stack.pop_back();
      for (int32_t k = pda.states[s].calls_begin; k < pda.states[s].calls_end; ++k) {
        const auto& c = pda.calls[k];
        if (nullable[c.rule] && std::find(seen.begin(), seen.end(), c.ret) == seen.end()) {
          seen.push_back(c.ret);
          stack.push_back(c.ret);
        }
      }
    }
    return seen;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r) {
      if (nullable[r]) continue;
      for (int32_t s : null_reach(r))
        if (pda.states[s].final) { nullable[r] = changed = true; break; }
    }
  }
  std::vector<std::vector<int32_t>> left(nr);
  for (size_t r = 0; r < nr; ++r)
    for (int32_t s : null_reach(r))
      for (int32_t k = pda.states[s].calls_begin; k < pda.states[s].calls_end; ++k)
        left[r].push_back(pda.calls[k].rule);
  std::vector<int> color(nr, 0);
  std::function<void(int32_t)> dfs = [&](int32_t r) {
    color[r] = 1;
    for (int32_t q : left[r]) {
      if (color[q] == 1)
        DI_THROW(GrammarError, "left recursion through rule '", pda.rule_names[q],
                 "' is not supported (rewrite it with repetition)");
      if (color[q] == 0) dfs(q);
    }
    color[r] = 2;
  };
  for (size_t r = 0; r < nr; ++r) if (color[r] == 0) dfs(static_cast<int32_t>(r));
}

}  // namespace

Pda build_pda(const Grammar& g, const AutomatonLimits& limits) {
  Builder b(g, limits);
  Pda pda = b.run();
  if (!pda.empty_language) finalize(pda);
  return pda;
}

}  // namespace deepinfer::structured
