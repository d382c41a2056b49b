#include "structured/automaton.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "core/check.h"
#include "structured/set_table.h"

namespace deepinfer::structured {
namespace {

using Clock = std::chrono::steady_clock;
// Expression levels (nested groups, chained rules inlined into one another) the NFA builder
// recurses through; deeper is a named GrammarError rather than a stack overflow.
constexpr int kMaxInlineDepth = 4000;
// Rules a single step may enter before consuming a byte (Stepper::expand recurses per rule).
constexpr int kMaxCallChain = 1000;

// Rules referred to from `id`. Expressions form a DAG (shared subexpressions): each is visited
// once per call (stamp[e] == gen), else a walk is exponential in the sharing depth.
void collect_refs_from(const Grammar& g, ExprId id, std::vector<RuleId>& out, std::vector<uint32_t>& stamp,
                       uint32_t gen) {
  if (stamp[id] == gen) return;
  stamp[id] = gen;
  const Expr& e = g.exprs[id];
  if (e.kind == ExprKind::kRef) out.push_back(e.rule);
  for (ExprId c : e.children) collect_refs_from(g, c, out, stamp, gen);
}

// [rules] the rules each rule's body refers to.
std::vector<std::vector<RuleId>> rule_refs(const Grammar& g) {
  std::vector<std::vector<RuleId>> refs(g.rules.size());
  std::vector<uint32_t> stamp(g.exprs.size(), 0);
  for (size_t r = 0; r < g.rules.size(); ++r)
    collect_refs_from(g, g.rules[r].body, refs[r], stamp, static_cast<uint32_t>(r + 1));
  return refs;
}

// Rules that produce at least one finite string (fixpoint); refs to the others act as Nothing.
// `all_refs` is rule_refs(g); sorted and deduplicated here.
std::vector<bool> productive_rules(const Grammar& g, std::vector<std::vector<RuleId>>& all_refs) {
  std::vector<bool> prod(g.rules.size(), false);
  // memo[e]: 0 unknown, 1 false, 2 true for the current evaluation (`gen`); shared
  // subexpressions are evaluated once.
  std::vector<uint32_t> memo_gen(g.exprs.size(), 0);
  std::vector<uint8_t> memo(g.exprs.size(), 0);
  uint32_t gen = 0;
  std::function<bool(ExprId)> ok_raw;
  auto ok = [&](ExprId id) -> bool {
    if (memo_gen[id] == gen) return memo[id] == 2;
    const bool r = ok_raw(id);
    memo_gen[id] = gen;
    memo[id] = r ? 2 : 1;
    return r;
  };
  ok_raw = [&](ExprId id) -> bool {
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
  // Worklist: a rule is re-checked only when a rule it refers to became productive (a sweep
  // per change was quadratic on a chain of 100,000 rules).
  const size_t n = g.rules.size();
  std::vector<std::vector<RuleId>> users(n);
  for (size_t r = 0; r < n; ++r) {
    std::vector<RuleId>& refs = all_refs[r];
    std::sort(refs.begin(), refs.end());
    refs.erase(std::unique(refs.begin(), refs.end()), refs.end());
    for (RuleId q : refs) users[q].push_back(static_cast<RuleId>(r));
  }
  std::vector<RuleId> work;
  for (size_t r = 0; r < n; ++r) work.push_back(static_cast<RuleId>(r));
  while (!work.empty()) {
    const RuleId r = work.back();
    work.pop_back();
    ++gen;  // prod changed since the last evaluation: memo entries are stale
    if (prod[r] || !ok(g.rules[r].body)) continue;
    prod[r] = true;
    for (RuleId u : users[r])
      if (!prod[u]) work.push_back(u);
  }
  return prod;
}


// Rules on a cycle of references (Tarjan SCC: a rule is recursive when its SCC has > 1 rule
// or it refers to itself). Iterative: a chain of 100,000 rules must not recurse that deep.
// `adj` is rule_refs(g) (in any order: the SCCs do not depend on it).
std::vector<bool> recursive_rules(const Grammar& g, const std::vector<std::vector<RuleId>>& adj) {
  size_t n = g.rules.size();
  std::vector<int> index(n, -1), low(n, 0);
  std::vector<bool> on_stack(n, false), rec(n, false);
  std::vector<int> stack;
  std::vector<std::pair<int, size_t>> call;  // (rule, next edge) of the DFS in progress
  int counter = 0;
  for (size_t root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    call.push_back({static_cast<int>(root), 0});
    index[root] = low[root] = counter++;
    stack.push_back(static_cast<int>(root));
    on_stack[root] = true;
    while (!call.empty()) {
      auto& [v, e] = call.back();
      if (e < adj[v].size()) {
        const int w = adj[v][e++];
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = true;
          call.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      const int done = v;
      call.pop_back();
      if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
      if (low[done] == index[done]) {
        std::vector<int> members;
        int w;
        do { w = stack.back(); stack.pop_back(); on_stack[w] = false; members.push_back(w); } while (w != done);
        if (members.size() > 1) for (int m : members) rec[m] = true;
      }
    }
  }
  for (size_t r = 0; r < n; ++r)
    if (std::find(adj[r].begin(), adj[r].end(), static_cast<RuleId>(r)) != adj[r].end()) rec[r] = true;
  return rec;
}

struct NfaEdge { uint8_t lo, hi; int32_t to; };

// SetTable (set_table.h) interns the NFA state sets of one rule's subset construction.

// uint64 -> int32 open-addressing map (keys != ~0); clear() keeps the capacity.
class FlatMap {
 public:
  void clear() {
    keys_.assign(64, kEmpty);
    vals_.assign(64, 0);
    size_ = 0;
  }
  const int32_t* find(uint64_t k) const {
    const size_t mask = keys_.size() - 1;
    for (size_t i = mix(k) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  void insert(uint64_t k, int32_t v) {  // k absent
    if ((size_ + 1) * 2 > keys_.size()) grow();
    const size_t mask = keys_.size() - 1;
    size_t i = mix(k) & mask;
    while (keys_[i] != kEmpty) i = (i + 1) & mask;
    keys_[i] = k;
    vals_[i] = v;
    ++size_;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t mix(uint64_t k) { return (k * 0x9e3779b97f4a7c15ull) >> 17; }
  void grow() {
    std::vector<uint64_t> ok = std::move(keys_);
    std::vector<int32_t> ov = std::move(vals_);
    keys_.assign(ok.size() * 2, kEmpty);
    vals_.assign(ok.size() * 2, 0);
    size_ = 0;
    for (size_t i = 0; i < ok.size(); ++i)
      if (ok[i] != kEmpty) insert(ok[i], ov[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<int32_t> vals_;
  size_t size_ = 0;
};

// One rule's NFA, built as flat edge lists (no allocation per state) and then grouped by
// source state (CSR: state s's edges are [x_begin[s], x_begin[s + 1])).
struct Nfa {
  struct Call { int32_t rule, to; };  // compiled rule index, state after the call
  int32_t num_states = 0;
  int32_t final = -1;
  std::vector<int32_t> eps_begin, eps;
  std::vector<int32_t> byte_begin;
  std::vector<NfaEdge> bytes;
  std::vector<int32_t> call_begin;
  std::vector<Call> calls;
  std::vector<int32_t> mark;  // [num_states] Grammar::marks index of the byte entering it, or -1

  bool has_bytes(int32_t s) const { return byte_begin[s] < byte_begin[s + 1]; }
  bool has_calls(int32_t s) const { return call_begin[s] < call_begin[s + 1]; }
};

// Groups (from, edge) pairs by `from` (stable counting sort) into begin/out.
template <class E>
void group_edges(int32_t n, const std::vector<std::pair<int32_t, E>>& raw, std::vector<int32_t>& begin,
                 std::vector<E>& out) {
  begin.assign(n + 1, 0);
  for (const auto& [f, e] : raw) ++begin[f + 1];
  for (int32_t s = 0; s < n; ++s) begin[s + 1] += begin[s];
  out.resize(raw.size());
  std::vector<int32_t> pos(begin.begin(), begin.end() - 1);
  for (const auto& [f, e] : raw) out[pos[f]++] = e;
}

class Builder {
 public:
  Builder(const Grammar& g, const AutomatonLimits& lim) : g_(g), lim_(lim) {
    shapes_.clear();
    std::vector<std::vector<RuleId>> refs = rule_refs(g);  // computed once for both
    prod_ = productive_rules(g, refs);
    rec_ = recursive_rules(g, refs);
    deadline_ = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(lim.time_limit_ms * 1000));
  }

  Pda run();
  Clock::time_point deadline() const { return deadline_; }

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
    if (++num_nfa_ + nfa_total_ > lim_.max_nfa_states)
      DI_THROW(GrammarError, "grammar too large: more than ", lim_.max_nfa_states,
               " automaton states after expanding repetitions");
    return num_nfa_ - 1;
  }
  void check_time() {
    if (Clock::now() > deadline_)
      DI_THROW(GrammarError, "grammar compilation exceeded its time limit of ", lim_.time_limit_ms, " ms");
  }
  int32_t build(ExprId id, int32_t start, int depth);
  void build_to(ExprId id, int32_t start, int32_t cont, int depth);
  int32_t entry_to(ExprId id, int32_t cont, int depth);
  void number_calls(ExprId id, int depth);
  std::vector<bool> numbered_;  // [exprs] number_calls visited it
  uint32_t shape(ExprId id);
  void build_rule_nfa(int32_t idx);
  void determinize(int32_t idx, Pda& pda);
  void eps_closure(std::vector<int32_t>& set);
  void mark_live(const Nfa& nfa);
  std::vector<uint8_t> keep_;  // [nfa states] 0 dead, 1 live pass-through, 2 live and deciding
  std::vector<int32_t> pred_begin_, preds_;
  std::vector<uint32_t> stamp_;  // [nfa states] == generation_ when visited
  uint32_t generation_ = 0;
  std::vector<int32_t> work_;
  // Subset-construction scratch, reused across states and rules (no allocation per state).
  SetTable sets_;
  SetTable raw_seen_;               // raw target sets met in this rule
  std::vector<int32_t> raw_state_;  // [raw_seen_ index] their DFA state or -1
  // The current state's byte edges as class intervals: (first class << 1 | 0, target) opens,
  // (last class + 1 << 1 | 1, target) closes; swept in class order (determinize).
  std::vector<std::pair<int32_t, int32_t>> events_;
  std::vector<std::pair<int32_t, int32_t>> active_;  // (target, open intervals), by target
  std::vector<int32_t> seg_, prev_seg_;              // targets of the current / previous segment
  // States with many edges (large sets) step per class instead: the sweep's sort and sorted
  // inserts grow faster with the edge count than per-class target lists do.
  static constexpr size_t kMaxSweepEvents = 64;
  std::vector<std::vector<int32_t>> targets_;  // [class] NFA targets of the current state
  std::vector<int32_t> touched_;               // classes with targets_ non-empty
  std::vector<int32_t> closed_, ret_set_;
  std::vector<std::pair<int32_t, int32_t>> call_pairs_;  // (callee, NFA return state)

  const Grammar& g_;
  AutomatonLimits lim_;
  std::vector<bool> prod_, rec_;
  Clock::time_point deadline_;
  std::unordered_map<RuleId, int32_t> index_of_;
  std::vector<RuleId> kept_;             // compiled rule index -> grammar rule
  // NFA of the rule being built: state count and edges as (from, edge).
  int32_t num_nfa_ = 0;
  std::vector<std::pair<int32_t, int32_t>> raw_eps_;
  std::vector<std::pair<int32_t, NfaEdge>> raw_bytes_;
  std::vector<std::pair<int32_t, Nfa::Call>> raw_calls_;
  std::vector<std::pair<int32_t, int32_t>> raw_marks_;  // (NFA state, mark)
  // Tracked-object guards: content -> index into Pda::guards; the object each rule's marks
  // belong to (-1: none yet).
  std::map<std::pair<int64_t, std::vector<uint64_t>>, int32_t> guard_index_;
  int32_t guard_of(const std::vector<int32_t>& set, int32_t rule, Pda& pda);
  std::vector<int32_t> rule_object_;
  std::vector<Nfa> rule_nfas_;           // [compiled rule]
  const Nfa* cur_nfa_ = nullptr;         // the one being determinised
  // Shared suffix fragments of the rule being built: (shape of a repeat / inlined rule /
  // automaton, continuation state) -> entry state. Structurally equal expressions have one
  // shape id (the lowering builds e.g. "any string character*" afresh at every key-trie
  // node, each a new ExprId).
  FlatMap shared_;
  std::vector<uint32_t> shape_of_;  // [exprs] shape id + 1, 0 = not computed
  SetTable shapes_;
  std::vector<int32_t> shape_buf_;
  int64_t nfa_total_ = 0;
};

int32_t Builder::build(ExprId id, int32_t start, int depth) {
  const Expr& e = g_.exprs[id];
  if (depth > kMaxInlineDepth) DI_THROW(GrammarError, "grammar nesting too deep while inlining rules (more than ", kMaxInlineDepth, " levels)");
  switch (e.kind) {
    case ExprKind::kNothing: return new_state();  // unreachable end
    case ExprKind::kEmpty: return start;
    case ExprKind::kBytes: {
      int32_t end = new_state();
      for (ByteRange r : e.ranges) raw_bytes_.push_back({start, {r.lo, r.hi, end}});
      if (e.mark >= 0) raw_marks_.push_back({end, e.mark});
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
        raw_eps_.push_back({start, s});
        build_to(c, s, end, depth + 1);
      }
      return end;
    }
    case ExprKind::kRepeat: {
      int32_t cur = start;
      for (int32_t i = 0; i < e.min; ++i) cur = build(e.children[0], cur, depth + 1);
      if (e.max == kUnbounded) {
        int32_t loop = new_state();
        raw_eps_.push_back({cur, loop});
        int32_t t = build(e.children[0], loop, depth + 1);
        raw_eps_.push_back({t, loop});
        return loop;
      }
      int32_t end = new_state();
      for (int32_t i = e.min; i < e.max; ++i) {
        raw_eps_.push_back({cur, end});
        int32_t s = new_state();
        raw_eps_.push_back({cur, s});
        cur = build(e.children[0], s, depth + 1);
        if ((i & 63) == 0) check_time();
      }
      raw_eps_.push_back({cur, end});
      return end;
    }
    case ExprKind::kRef: {
      if (!prod_[e.rule]) return new_state();
      const Rule& r = g_.rules[e.rule];
      if (rec_[e.rule] || !r.inline_ok) {
        int32_t end = new_state();
        raw_calls_.push_back({start, {compiled_index(e.rule), end}});
        return end;
      }
      return build(r.body, start, depth + 1);
    }
    case ExprKind::kAutomaton: {
      const ByteAutomaton& a = g_.automata[e.automaton];
      const int32_t base = num_nfa_;
      for (int32_t i = 0; i < a.num_states; ++i) new_state();
      int32_t end = new_state();
      for (const auto& ed : a.edges) raw_bytes_.push_back({base + ed.from, {ed.lo, ed.hi, base + ed.to}});
      for (int32_t i = 0; i < a.num_states; ++i)
        if (a.final[i]) raw_eps_.push_back({base + i, end});
      raw_eps_.push_back({start, base + a.start});
      return end;
    }
  }
  return new_state();
}

// Structural id of an expression (equal ids <=> equal expression trees): its fields and its
// children's ids, interned in a SetTable (exact comparison, no allocation per lookup).
uint32_t Builder::shape(ExprId id) {
  if (shape_of_.size() < g_.exprs.size()) shape_of_.resize(g_.exprs.size(), 0);
  if (shape_of_[id]) return shape_of_[id] - 1;
  const Expr& e = g_.exprs[id];
  for (ExprId c : e.children) shape(c);  // children first: the recursion reuses shape_buf_
  shape_buf_.assign({static_cast<int32_t>(e.kind), e.min, e.max, e.rule, e.automaton, e.mark,
                     static_cast<int32_t>(e.ranges.size())});
  for (ByteRange r : e.ranges) shape_buf_.push_back(r.lo * 256 + r.hi);
  for (ExprId c : e.children) shape_buf_.push_back(static_cast<int32_t>(shape_of_[c] - 1));
  bool added = false;
  const uint32_t sh = static_cast<uint32_t>(shapes_.intern(shape_buf_, &added));
  shape_of_[id] = sh + 1;
  return sh;
}

// Gives the called rules in `id` their compiled indices in first-use order of a plain
// left-to-right build (the order build_to's continuation-first construction would change).
void Builder::number_calls(ExprId id, int depth) {
  if (numbered_.size() < g_.exprs.size()) numbered_.resize(g_.exprs.size(), false);
  if (numbered_[id]) return;
  numbered_[id] = true;
  if (depth > kMaxInlineDepth) DI_THROW(GrammarError, "grammar nesting too deep while inlining rules (more than ", kMaxInlineDepth, " levels)");
  const Expr& e = g_.exprs[id];
  switch (e.kind) {
    case ExprKind::kSeq:
    case ExprKind::kAlt:
      for (ExprId c : e.children) number_calls(c, depth + 1);
      return;
    case ExprKind::kRepeat:
      if (e.min > 0 || e.max != 0) number_calls(e.children[0], depth + 1);
      return;
    case ExprKind::kRef:
      if (!prod_[e.rule]) return;
      if (rec_[e.rule] || !g_.rules[e.rule].inline_ok) compiled_index(e.rule);
      else number_calls(g_.rules[e.rule].body, depth + 1);
      return;
    default: return;
  }
}

// Builds `id` from `start` into the continuation state `cont`: start -eps-> entry_to(id, cont).
void Builder::build_to(ExprId id, int32_t start, int32_t cont, int depth) {
  const int32_t entry = entry_to(id, cont, depth);
  if (entry >= 0) raw_eps_.push_back({start, entry});
}

// A state reading exactly L(id) into `cont` (-1: none, L(id) is empty), entered only through
// epsilons its callers add. Built continuation-first: a sequence from its last part back,
// alternatives all into `cont`. With share_suffixes, an expression of equal shape (structural
// id) into the same continuation is built once: L(entry) = L(id) . L(cont) whatever led to
// it, so equal suffixes (the UTF-8 tails and "any string character*" that the lowering
// rebuilds at every key-trie node of an additionalProperties key, each a new ExprId) become
// one NFA fragment, and the DFA gets one copy of their states instead of one per node.
int32_t Builder::entry_to(ExprId id, int32_t cont, int depth) {
  const Expr& e = g_.exprs[id];
  if (depth > kMaxInlineDepth) DI_THROW(GrammarError, "grammar nesting too deep while inlining rules (more than ", kMaxInlineDepth, " levels)");
  if (e.kind == ExprKind::kEmpty) return cont;
  if (e.kind == ExprKind::kNothing) return -1;
  uint64_t key = 0;
  if (lim_.share_suffixes) {
    key = static_cast<uint64_t>(shape(id)) << 32 | static_cast<uint32_t>(cont);
    if (const int32_t* hit = shared_.find(key)) return *hit;
  }
  int32_t entry = -1;
  switch (e.kind) {
    case ExprKind::kSeq:
      entry = cont;
      for (size_t i = e.children.size(); i-- > 0 && entry >= 0;) entry = entry_to(e.children[i], entry, depth + 1);
      break;
    case ExprKind::kAlt:
      entry = new_state();
      for (ExprId c : e.children)
        if (const int32_t x = entry_to(c, cont, depth + 1); x >= 0) raw_eps_.push_back({entry, x});
      break;
    case ExprKind::kBytes:
      entry = new_state();
      if (e.mark >= 0) {
        // The marked state must be entered by the byte alone (its guard runs on entry).
        const int32_t m = new_state();
        for (ByteRange r : e.ranges) raw_bytes_.push_back({entry, {r.lo, r.hi, m}});
        raw_eps_.push_back({m, cont});
        raw_marks_.push_back({m, e.mark});
        break;
      }
      for (ByteRange r : e.ranges) raw_bytes_.push_back({entry, {r.lo, r.hi, cont}});
      break;
    default:
      entry = new_state();
      raw_eps_.push_back({build(id, entry, depth + 1), cont});
  }
  if (lim_.share_suffixes) shared_.insert(key, entry);
  return entry;
}

void Builder::build_rule_nfa(int32_t idx) {
  num_nfa_ = 0;
  shared_.clear();
  raw_eps_.clear();
  raw_bytes_.clear();
  raw_calls_.clear();
  raw_marks_.clear();
  int32_t start = new_state();
  DI_CHECK(start == 0);
  Nfa nfa;
  number_calls(g_.rules[kept_[idx]].body, 0);
  nfa.final = build(g_.rules[kept_[idx]].body, start, 0);
  nfa.num_states = num_nfa_;
  nfa_total_ += num_nfa_;
  group_edges(num_nfa_, raw_eps_, nfa.eps_begin, nfa.eps);
  group_edges(num_nfa_, raw_bytes_, nfa.byte_begin, nfa.bytes);
  group_edges(num_nfa_, raw_calls_, nfa.call_begin, nfa.calls);
  nfa.mark.assign(num_nfa_, -1);
  for (auto [st, m] : raw_marks_) nfa.mark[st] = m;
  rule_nfas_.push_back(std::move(nfa));
  check_time();
}

// NFA states from which the rule's end is reachable (through bytes, eps or calls). A DFA state
// is live exactly when its set holds one of them, so subset construction keeps only those and
// never creates a dead DFA state (finalize has nothing to trim).
void Builder::mark_live(const Nfa& nfa) {
  const int32_t n = nfa.num_states, fin = nfa.final;
  auto each_edge = [&](auto&& f) {
    for (int32_t s = 0; s < n; ++s) {
      for (int32_t k = nfa.eps_begin[s]; k < nfa.eps_begin[s + 1]; ++k) f(s, nfa.eps[k]);
      for (int32_t k = nfa.byte_begin[s]; k < nfa.byte_begin[s + 1]; ++k) f(s, nfa.bytes[k].to);
      for (int32_t k = nfa.call_begin[s]; k < nfa.call_begin[s + 1]; ++k) f(s, nfa.calls[k].to);
    }
  };
  pred_begin_.assign(n + 1, 0);
  each_edge([&](int32_t, int32_t t) { ++pred_begin_[t + 1]; });
  for (int32_t s = 0; s < n; ++s) pred_begin_[s + 1] += pred_begin_[s];
  preds_.resize(pred_begin_[n]);
  work_.assign(pred_begin_.begin(), pred_begin_.end() - 1);  // fill positions
  each_edge([&](int32_t s, int32_t t) { preds_[work_[t]++] = s; });
  keep_.assign(n, 0);  // 1: live, 2: live and deciding (byte edges, calls or the end)
  work_.assign(1, fin);
  keep_[fin] = 1;
  while (!work_.empty()) {
    const int32_t s = work_.back();
    work_.pop_back();
    for (int32_t k = pred_begin_[s]; k < pred_begin_[s + 1]; ++k)
      if (!keep_[preds_[k]]) { keep_[preds_[k]] = 1; work_.push_back(preds_[k]); }
  }
  for (int32_t s = 0; s < n; ++s)
    if (keep_[s] && (nfa.has_bytes(s) || nfa.has_calls(s) || s == fin || nfa.mark[s] >= 0)) keep_[s] = 2;
}

// The guard of the DFA state whose (closed) NFA set is `set`. A state entered by marked bytes
// runs the marks' checks; for that to be exact, the set must hold nothing but what the marked
// states lead to by epsilons (else an unmarked run would be cut by another run's check). Key
// prefixes are the exception: an unmarked run next to them keeps the state alive on its own,
// so the state needs no guard. Anything else ambiguous is a GrammarError, never a guess.
int32_t Builder::guard_of(const std::vector<int32_t>& set, int32_t rule, Pda& pda) {
  const Nfa& nfa = *cur_nfa_;
  std::vector<int32_t> marked;
  for (int32_t s : set)
    if (nfa.mark[s] >= 0) marked.push_back(s);
  if (marked.empty()) return -1;
  // Eps-reach of the marked states, through the states eps_closure passes.
  std::vector<int32_t> reach(marked), stack(marked);
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t k = nfa.eps_begin[s]; k < nfa.eps_begin[s + 1]; ++k) {
      const int32_t t = nfa.eps[k];
      if (keep_[t] && std::find(reach.begin(), reach.end(), t) == reach.end()) {
        reach.push_back(t);
        stack.push_back(t);
      }
    }
  }
  bool other = false;
  for (int32_t s : set)
    if (std::find(reach.begin(), reach.end(), s) == reach.end()) other = true;
  const GrammarMark& m0 = g_.marks[nfa.mark[marked[0]]];
  if (rule_object_[rule] < 0) rule_object_[rule] = m0.object;
  auto ambiguous = [&] {
    DI_THROW(GrammarError, "grammar too complex for key tracking: object members are ambiguous in rule '",
             pda.rule_names[rule], "'");
  };
  PdaGuard g;
  bool prefix_only = true;
  for (int32_t s : marked) {
    const GrammarMark& m = g_.marks[nfa.mark[s]];
    if (m.object != rule_object_[rule]) ambiguous();
    if (m.kind != MarkKind::kKeyPrefix) prefix_only = false;
  }
  if (prefix_only) {
    if (other) return -1;
    g.kind = PdaGuard::kAlive;
    for (int32_t s : marked) {
      const int32_t k = g_.marks[nfa.mark[s]].key;
      if (g.keys.size() <= static_cast<size_t>(k >> 6)) g.keys.resize((k >> 6) + 1, 0);
      g.keys[k >> 6] |= 1ull << (k & 63);
    }
  } else {
    if (other) ambiguous();
    for (int32_t s : marked) {
      const GrammarMark& m = g_.marks[nfa.mark[s]];
      if (m.kind != m0.kind || m.key != m0.key || m.keys != m0.keys) ambiguous();
    }
    g.kind = m0.kind == MarkKind::kKeyAdd ? PdaGuard::kAdd : m0.kind == MarkKind::kMore ? PdaGuard::kAlive : PdaGuard::kAll;
    g.key = m0.key;
    for (int32_t k : m0.keys) {
      if (g.keys.size() <= static_cast<size_t>(k >> 6)) g.keys.resize((k >> 6) + 1, 0);
      g.keys[k >> 6] |= 1ull << (k & 63);
    }
  }
  auto [it, added] = guard_index_.try_emplace({static_cast<int64_t>(g.kind) << 32 | static_cast<uint32_t>(g.key), g.keys},
                                              static_cast<int32_t>(pda.guards.size()));
  if (added) pda.guards.push_back(std::move(g));
  return it->second;
}

// Closes `set` under eps moves (dead states dropped) and keeps only the deciding states: two
// closures that differ only in pass-through states are the same DFA state (without this a
// string body had a twin state per character class, which multiplied the states and hid
// self-loops from the mask walk). Sorted on return.
void Builder::eps_closure(std::vector<int32_t>& set) {
  // Generation stamps instead of a fresh visited array: closures run once per DFA transition.
  const Nfa& nfa = *cur_nfa_;
  ++generation_;
  work_.clear();
  for (int32_t s : set)
    if (keep_[s] && stamp_[s] != generation_) { stamp_[s] = generation_; work_.push_back(s); }
  set.clear();
  while (!work_.empty()) {
    const int32_t s = work_.back();
    work_.pop_back();
    if (keep_[s] == 2) set.push_back(s);
    for (int32_t k = nfa.eps_begin[s]; k < nfa.eps_begin[s + 1]; ++k)
      if (const int32_t t = nfa.eps[k]; keep_[t] && stamp_[t] != generation_) { stamp_[t] = generation_; work_.push_back(t); }
  }
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
  for (const Nfa& nfa : rule_nfas_)
    for (const auto& e : nfa.bytes) boundary[e.lo] = boundary[e.hi + 1] = true;
  int32_t cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (boundary[b]) ++cls;
    pda.byte_class[b] = static_cast<uint8_t>(cls);
  }
  pda.num_classes = cls + 1;
  pda.rule_start.assign(kept_.size(), -1);
  rule_object_.assign(kept_.size(), -1);
  for (int32_t r : kept_) pda.rule_names.push_back(g_.rules[r].name);
  for (size_t i = 0; i < kept_.size(); ++i) {
    cur_nfa_ = &rule_nfas_[i];
    stamp_.assign(cur_nfa_->num_states, 0);
    generation_ = 0;
    determinize(static_cast<int32_t>(i), pda);
  }
  return pda;
}

void Builder::determinize(int32_t idx, Pda& pda) {
  const Nfa& nfa = *cur_nfa_;
  const int32_t nfa_final = nfa.final;
  mark_live(nfa);
  const int32_t nc = pda.num_classes;
  const int32_t first = static_cast<int32_t>(pda.states.size());
  sets_.clear();
  raw_seen_.clear();
  raw_state_.clear();
  // Closes `raw` (NFA targets) into closed_ and returns its DFA state, adding it when new.
  auto close_and_intern = [&](const std::vector<int32_t>& raw) -> int32_t {
    closed_.assign(raw.begin(), raw.end());
    eps_closure(closed_);
    if (closed_.empty()) return -1;  // only dead ends: no state
    bool added = false;
    const int32_t id = first + sets_.intern(closed_, &added);
    if (added) {
      if (static_cast<int64_t>(id) >= lim_.max_dfa_states)
        DI_THROW(GrammarError, "grammar too large: more than ", lim_.max_dfa_states, " automaton states");
      pda.states.push_back(PdaState{.rule = idx, .guard = guard_of(closed_, idx, pda)});
      pda.trans.resize(pda.trans.size() + nc, -1);
    }
    return id;
  };
  // The same raw targets recur across states and classes (every state inside a string steps
  // to the same body); closing them again would give the same state.
  auto intern = [&](const std::vector<int32_t>& raw) -> int32_t {
    bool added = false;
    const int32_t k = raw_seen_.intern(raw, &added);
    if (!added) return raw_state_[k];
    const int32_t id = close_and_intern(raw);
    raw_state_.push_back(id);
    return id;
  };
  pda.rule_start[idx] = intern({0});
  for (int32_t k = 0; k < sets_.size(); ++k) {
    if ((k & 255) == 0) check_time();
    const int32_t cur = first + k;
    events_.clear();
    call_pairs_.clear();
    bool fin = false;
    // Read set k before interning anything (interning may move the arena).
    const int32_t* set = sets_.data(k);
    for (uint32_t j = 0, n = sets_.length(k); j < n; ++j) {
      const int32_t s = set[j];
      if (s == nfa_final) fin = true;
      for (int32_t q = nfa.byte_begin[s]; q < nfa.byte_begin[s + 1]; ++q) {
        const NfaEdge& e = nfa.bytes[q];
        events_.push_back({pda.byte_class[e.lo] << 1, e.to});
        events_.push_back({(pda.byte_class[e.hi] + 1) << 1 | 1, e.to});
      }
      for (int32_t q = nfa.call_begin[s]; q < nfa.call_begin[s + 1]; ++q)
        call_pairs_.push_back({nfa.calls[q].rule, nfa.calls[q].to});
    }
    pda.states[cur].final = fin;
    // Class c's targets are those of the intervals holding c: constant between interval ends,
    // so one sorted target set (and one intern) per segment instead of per class. Segments
    // are visited in class order, so new DFA states are numbered as a per-class loop would
    // (an equal set met again interns to the same state).
    const bool any_bytes = !events_.empty();
    if (events_.size() > kMaxSweepEvents) {
      // Per class, as before the sweep (same targets, same interning order).
      if (targets_.size() < static_cast<size_t>(nc)) targets_.resize(nc);
      for (int32_t c : touched_) targets_[c].clear();
      touched_.clear();
      for (uint32_t j = 0, n = sets_.length(k); j < n; ++j) {
        const int32_t s = sets_.data(k)[j];
        for (int32_t q = nfa.byte_begin[s]; q < nfa.byte_begin[s + 1]; ++q) {
          const NfaEdge& e = nfa.bytes[q];
          for (int c = pda.byte_class[e.lo]; c <= pda.byte_class[e.hi]; ++c) {
            if (targets_[c].empty()) touched_.push_back(c);
            targets_[c].push_back(e.to);
          }
        }
      }
      std::sort(touched_.begin(), touched_.end());
      int32_t prev_c = -1, prev_ct = -1;
      for (int32_t c : touched_) {
        std::vector<int32_t>& tc = targets_[c];
        if (tc.size() > 1) {
          std::sort(tc.begin(), tc.end());
          tc.erase(std::unique(tc.begin(), tc.end()), tc.end());
        }
        const int32_t t = prev_c >= 0 && tc == targets_[prev_c] ? prev_ct : intern(tc);
        pda.trans[static_cast<size_t>(cur) * nc + c] = t;
        prev_c = c;
        prev_ct = t;
      }
      events_.clear();  // the sweep below has nothing to do
    }
    std::sort(events_.begin(), events_.end());
    active_.clear();
    prev_seg_.clear();
    int32_t prev_t = -1;
    for (size_t j = 0; j < events_.size();) {
      const int32_t at = events_[j].first >> 1;
      for (; j < events_.size() && events_[j].first >> 1 == at; ++j) {
        const int32_t to = events_[j].second;
        auto it = std::lower_bound(active_.begin(), active_.end(), std::pair<int32_t, int32_t>{to, 0},
                                   [](const auto& a, const auto& b) { return a.first < b.first; });
        if (events_[j].first & 1) {
          if (--it->second == 0) active_.erase(it);
        } else if (it != active_.end() && it->first == to) {
          ++it->second;
        } else {
          active_.insert(it, {to, 1});
        }
      }
      if (active_.empty()) continue;
      const int32_t end = j < events_.size() ? events_[j].first >> 1 : nc;
      seg_.clear();
      for (const auto& a : active_) seg_.push_back(a.first);
      const int32_t t = !prev_seg_.empty() && seg_ == prev_seg_ ? prev_t : intern(seg_);
      for (int32_t c = at; c < end; ++c) pda.trans[static_cast<size_t>(cur) * nc + c] = t;
      std::swap(seg_, prev_seg_);
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
    pda.states[cur].dead_end = fin && !any_bytes && !pda.states[cur].has_calls;
  }
}

// Marks tail calls and rejects left recursion (a rule reaching a call to itself without
// consuming a byte would loop forever).
void finalize(Pda& pda, const AutomatonLimits& lim, Clock::time_point deadline) {
  auto check_time = [&] {
    if (Clock::now() > deadline)
      DI_THROW(GrammarError, "grammar compilation exceeded its time limit of ", lim.time_limit_ms, " ms");
  };
  const int32_t nc = pda.num_classes;
  // No trimming: determinize creates only states that can reach their rule's end, and only
  // calls whose return state is live.
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
    check_time();
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
  // Cycle search over `left`, iterative (rule chains can be long). Also the longest chain of
  // rules entered before a byte is consumed: the matcher's step recurses that deep.
  std::vector<int> color(nr, 0), chain(nr, 1);
  std::vector<std::pair<int32_t, size_t>> call;
  for (size_t root = 0; root < nr; ++root) {
    if (color[root] != 0) continue;
    color[root] = 1;
    call.push_back({static_cast<int32_t>(root), 0});
    while (!call.empty()) {
      auto& [r, e] = call.back();
      if (e == left[r].size()) {
        for (int32_t q : left[r]) chain[r] = std::max(chain[r], chain[q] + 1);
        pda.max_call_chain = std::max(pda.max_call_chain, chain[r] + 1);
        if (chain[r] > kMaxCallChain)
          DI_THROW(GrammarError, "grammar too deep: more than ", kMaxCallChain,
                   " rules entered one inside another before any byte (at rule '", pda.rule_names[r], "')");
        color[r] = 2;
        call.pop_back();
        continue;
      }
      const int32_t q = left[r][e++];
      if (color[q] == 1)
        DI_THROW(GrammarError, "left recursion through rule '", pda.rule_names[q],
                 "' is not supported (rewrite it with repetition)");
      if (color[q] == 0) {
        color[q] = 1;
        call.push_back({q, 0});
      }
    }
  }
}

}  // namespace

Pda build_pda(const Grammar& g, const AutomatonLimits& limits) {
  Builder b(g, limits);
  Pda pda = b.run();
  if (!pda.empty_language) finalize(pda, limits, b.deadline());
  return pda;
}

}  // namespace deepinfer::structured
