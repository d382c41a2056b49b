#include "structured/regular.h"

#include <algorithm>

#include "core/check.h"
#include "structured/set_table.h"

namespace deepinfer::structured {
namespace {

// Thompson NFA. Edges are collected as (from, edge) while building (a state gains edges after
// later states exist) and laid out by state in one array each by finish(): no vector per state.
struct Nfa {
  struct Edge { uint8_t lo, hi; int32_t to; };
  int32_t num_states = 0;
  std::vector<std::pair<int32_t, int32_t>> raw_eps;
  std::vector<std::pair<int32_t, Edge>> raw_bytes;
  std::vector<int32_t> eps_begin, eps;  // [states + 1] offsets into eps (targets)
  std::vector<int32_t> byte_begin;      // [states + 1] offsets into bytes
  std::vector<Edge> bytes;
  int32_t add() { return num_states++; }
  void add_eps(int32_t from, int32_t to) { raw_eps.push_back({from, to}); }
  void add_byte(int32_t from, Edge e) { raw_bytes.push_back({from, e}); }
  bool has_bytes(int32_t s) const { return byte_begin[s] != byte_begin[s + 1]; }
  void finish() {
    lay_out(raw_eps, eps_begin, eps);
    lay_out(raw_bytes, byte_begin, bytes);
  }

 private:
  // Counting sort by source state, stable (each state keeps its edges' insertion order).
  template <class T>
  void lay_out(const std::vector<std::pair<int32_t, T>>& raw, std::vector<int32_t>& begin, std::vector<T>& out) {
    begin.assign(num_states + 1, 0);
    for (const auto& [from, _] : raw) ++begin[from + 1];
    for (int32_t s = 0; s < num_states; ++s) begin[s + 1] += begin[s];
    std::vector<int32_t> fill(begin.begin(), begin.end() - 1);
    out.resize(raw.size());
    for (const auto& [from, e] : raw) out[fill[from]++] = e;
  }
};

// Thompson construction; false when the expression is not regular (a recursive rule).
class NfaBuilder {
 public:
  NfaBuilder(const GrammarBuilder& b, int32_t max_states) : b_(b), max_(max_states * 16) {}
  Nfa nfa;
  bool build(ExprId id, int32_t start, int32_t* end, int depth) {
    if (depth > 64) return false;  // deep rule nesting: treat as not regular
    if (nfa.num_states > max_) DI_THROW(GrammarError, "regular-language operation too large");
    const Expr& e = b_.expr(id);
    switch (e.kind) {
      case ExprKind::kNothing: *end = nfa.add(); return true;
      case ExprKind::kEmpty: *end = start; return true;
      case ExprKind::kBytes: {
        if (e.mark >= 0) return false;  // a tracked object's key set is not a regular language
        int32_t t = nfa.add();
        for (ByteRange r : e.ranges) nfa.add_byte(start, {r.lo, r.hi, t});
        *end = t;
        return true;
      }
      case ExprKind::kSeq: {
        int32_t cur = start;
        for (ExprId c : e.children)
          if (!build(c, cur, &cur, depth)) return false;
        *end = cur;
        return true;
      }
      case ExprKind::kAlt: {
        int32_t t = nfa.add();
        for (ExprId c : e.children) {
          int32_t s = nfa.add(), ce;
          nfa.add_eps(start, s);
          if (!build(c, s, &ce, depth)) return false;
          nfa.add_eps(ce, t);
        }
        *end = t;
        return true;
      }
      case ExprKind::kRepeat: {
        int32_t cur = start;
        for (int32_t i = 0; i < e.min; ++i)
          if (!build(e.children[0], cur, &cur, depth)) return false;
        if (e.max == kUnbounded) {
          int32_t loop = nfa.add(), t;
          nfa.add_eps(cur, loop);
          if (!build(e.children[0], loop, &t, depth)) return false;
          nfa.add_eps(t, loop);
          *end = loop;
          return true;
        }
        int32_t t = nfa.add();
        for (int32_t i = e.min; i < e.max; ++i) {
          nfa.add_eps(cur, t);
          int32_t s = nfa.add();
          nfa.add_eps(cur, s);
          if (!build(e.children[0], s, &cur, depth)) return false;
        }
        nfa.add_eps(cur, t);
        *end = t;
        return true;
      }
      case ExprKind::kRef: {
        const Rule& r = b_.rule(e.rule);
        if (r.body < 0) return false;  // still being defined: recursion
        return build(r.body, start, end, depth + 1);
      }
      case ExprKind::kAutomaton: {
        const ByteAutomaton& a = b_.automaton_at(e.automaton);
        int32_t base = nfa.num_states;
        for (int32_t i = 0; i < a.num_states; ++i) nfa.add();
        int32_t t = nfa.add();
        for (const auto& ed : a.edges) nfa.add_byte(base + ed.from, {ed.lo, ed.hi, base + ed.to});
        for (int32_t i = 0; i < a.num_states; ++i)
          if (a.final[i]) nfa.add_eps(base + i, t);
        nfa.add_eps(start, base + a.start);
        *end = t;
        return true;
      }
    }
    return false;
  }

 private:
  const GrammarBuilder& b_;
  int32_t max_;
};

// Adds the states reachable by epsilon edges to `set` and sorts it; `work` is scratch.
void closure(const Nfa& n, std::vector<int32_t>& set, std::vector<int32_t>& work, std::vector<uint32_t>& stamp,
             uint32_t gen) {
  work.assign(set.begin(), set.end());
  for (int32_t s : set) stamp[s] = gen;
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (int32_t q = n.eps_begin[s]; q < n.eps_begin[s + 1]; ++q) {
      const int32_t t = n.eps[q];
      if (stamp[t] != gen) { stamp[t] = gen; set.push_back(t); work.push_back(t); }
    }
  }
  std::sort(set.begin(), set.end());
}

void too_large(int32_t max_states) {
  DI_THROW(GrammarError, "regular-language operation needs more than ", max_states, " automaton states");
}

}  // namespace

bool Dfa::matches(std::string_view text) const {
  int32_t s = start;
  for (char c : text) {
    s = next(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  return final[s];
}

std::optional<Dfa> expr_to_dfa(const GrammarBuilder& b, ExprId e, int32_t max_states) {
  NfaBuilder nb(b, max_states);
  int32_t start = nb.nfa.add(), end;
  if (!nb.build(e, start, &end, 0)) return std::nullopt;
  nb.nfa.finish();
  const Nfa& nfa = nb.nfa;
  Dfa d;
  std::vector<bool> boundary(257, false);
  boundary[0] = boundary[256] = true;
  for (const auto& ed : nfa.bytes) boundary[ed.lo] = boundary[ed.hi + 1] = true;
  int32_t cls = -1;
  for (int c = 0; c < 256; ++c) {
    if (boundary[c]) ++cls;
    d.byte_class[c] = static_cast<uint8_t>(cls);
  }
  d.num_classes = cls + 1;
  std::vector<uint32_t> stamp(nfa.num_states, 0);
  uint32_t gen = 0;
  // DFA state k = set k of `sets` (ids in first-insertion order, as the subset construction
  // discovers them). `set` and `work` are scratch reused by every lookup.
  SetTable sets;
  std::vector<int32_t> set, work;
  // Raw target sets seen before -> their DFA state (or -1): many (state, class) pairs step to
  // the same targets, and closing, sorting and trimming them again gives the same state.
  SetTable raw_seen;
  std::vector<int32_t> raw_state;  // [raw_seen index]
  auto close_and_intern = [&](const std::vector<int32_t>& raw) {
    set.assign(raw.begin(), raw.end());
    closure(nfa, set, work, stamp, ++gen);
    // Only states with byte edges and the end decide behaviour: closures differing in
    // pass-through states are one DFA state (no twin per character class).
    set.erase(std::remove_if(set.begin(), set.end(), [&](int32_t s) { return !nfa.has_bytes(s) && s != end; }),
              set.end());
    if (set.empty()) return -1;
    bool added = false;
    const int32_t id = sets.intern(set, &added);
    if (!added) return id;
    if (id >= max_states) too_large(max_states);
    d.final.push_back(std::binary_search(set.begin(), set.end(), end));
    d.trans.resize(d.trans.size() + d.num_classes, -1);
    return id;
  };
  auto intern = [&](const std::vector<int32_t>& raw) {
    bool added = false;
    const int32_t k = raw_seen.intern(raw, &added);
    if (!added) return raw_state[k];
    const int32_t id = close_and_intern(raw);
    raw_state.push_back(id);
    return id;
  };
  d.start = intern({start});
  if (d.start < 0) {  // the empty language: one dead start state
    d.start = 0;
    d.final.push_back(false);
    d.trans.assign(d.num_classes, -1);
  }
  std::vector<std::vector<int32_t>> targets(d.num_classes);
  for (int32_t cur = 0; cur < sets.size(); ++cur) {
    for (auto& t : targets) t.clear();
    // All of set cur is read before the first intern below (which may move the arena).
    const int32_t* cs = sets.data(cur);
    for (uint32_t j = 0, n = sets.length(cur); j < n; ++j)
      for (int32_t q = nfa.byte_begin[cs[j]]; q < nfa.byte_begin[cs[j] + 1]; ++q) {
        const Nfa::Edge& ed = nfa.bytes[q];
        for (int c = d.byte_class[ed.lo]; c <= d.byte_class[ed.hi]; ++c) targets[c].push_back(ed.to);
      }
    for (int c = 0; c < d.num_classes; ++c) {
      if (targets[c].empty()) continue;
      std::sort(targets[c].begin(), targets[c].end());
      targets[c].erase(std::unique(targets[c].begin(), targets[c].end()), targets[c].end());
      d.trans[static_cast<size_t>(cur) * d.num_classes + c] = intern(targets[c]);
    }
  }
  return d;
}

Dfa dfa_product(const std::vector<const Dfa*>& dfas, const std::function<bool(uint32_t)>& accept, int32_t max_states) {
  DI_CHECK(!dfas.empty() && dfas.size() <= 31, "dfa_product of ", dfas.size(), " automata");
  Dfa d;
  const size_t k = dfas.size();
  // Classes: bytes equivalent in every operand, numbered by first occurrence. A byte usually
  // has its predecessor's signature; otherwise it is compared with each class's first byte.
  auto same_sig = [&](int x, int y) {
    for (const Dfa* a : dfas)
      if (a->byte_class[x] != a->byte_class[y]) return false;
    return true;
  };
  std::vector<uint8_t> rep;  // [class] its first byte
  for (int c = 0; c < 256; ++c) {
    int32_t cl = -1;
    if (c > 0 && same_sig(c, c - 1)) cl = d.byte_class[c - 1];
    for (size_t r = 0; cl < 0 && r < rep.size(); ++r)
      if (same_sig(c, rep[r])) cl = static_cast<int32_t>(r);
    if (cl < 0) {
      cl = static_cast<int32_t>(rep.size());
      rep.push_back(static_cast<uint8_t>(c));
    }
    d.byte_class[c] = static_cast<uint8_t>(cl);
  }
  d.num_classes = static_cast<int32_t>(rep.size());
  // Product state n = tuple n of `tuples` (k operand states, -1 = dead), first-insertion order.
  SetTable tuples;
  auto intern = [&](const std::vector<int32_t>& t) {
    bool added = false;
    const int32_t id = tuples.intern(t, &added);
    if (!added) return id;
    if (id >= max_states) too_large(max_states);
    uint32_t mask = 0;
    for (size_t i = 0; i < k; ++i)
      if (t[i] >= 0 && dfas[i]->final[t[i]]) mask |= 1u << i;
    d.final.push_back(accept(mask));
    d.trans.resize(d.trans.size() + d.num_classes, -1);
    return id;
  };
  std::vector<int32_t> t(k), cur_t(k);
  for (size_t i = 0; i < k; ++i) t[i] = dfas[i]->start;
  d.start = intern(t);
  for (int32_t cur = 0; cur < tuples.size(); ++cur) {
    std::copy(tuples.data(cur), tuples.data(cur) + k, cur_t.begin());  // interning may move the arena
    for (int c = 0; c < d.num_classes; ++c) {
      bool any = false;
      for (size_t i = 0; i < k; ++i) {
        const int32_t s = cur_t[i];
        t[i] = s < 0 ? -1 : dfas[i]->next(s, rep[c]);
        any |= t[i] >= 0;
      }
      if (any) d.trans[static_cast<size_t>(cur) * d.num_classes + c] = intern(t);
    }
  }
  return d;
}

namespace {
// States from which some final state is reachable.
std::vector<bool> live_states(const Dfa& d) {
  const int32_t n = d.num_states();
  const size_t nt = static_cast<size_t>(n) * d.num_classes;
  // Predecessor lists laid out by target state (counting sort): one array, not one per state.
  std::vector<int32_t> pred_begin(n + 1, 0), preds;
  for (size_t q = 0; q < nt; ++q)
    if (d.trans[q] >= 0) ++pred_begin[d.trans[q] + 1];
  for (int32_t s = 0; s < n; ++s) pred_begin[s + 1] += pred_begin[s];
  preds.resize(pred_begin[n]);
  std::vector<int32_t> fill(pred_begin.begin(), pred_begin.end() - 1);
  for (size_t q = 0; q < nt; ++q)
    if (d.trans[q] >= 0) preds[fill[d.trans[q]]++] = static_cast<int32_t>(q / d.num_classes);
  std::vector<bool> live(n, false);
  std::vector<int32_t> work;
  for (int32_t s = 0; s < n; ++s)
    if (d.final[s]) { live[s] = true; work.push_back(s); }
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (int32_t q = pred_begin[s]; q < pred_begin[s + 1]; ++q)
      if (!live[preds[q]]) { live[preds[q]] = true; work.push_back(preds[q]); }
  }
  return live;
}
}  // namespace

bool dfa_is_empty(const Dfa& d) { return !live_states(d)[d.start]; }

ExprId dfa_to_expr(GrammarBuilder& b, const Dfa& d) {
  std::vector<bool> live = live_states(d);
  if (!live[d.start]) return b.nothing();
  std::vector<int32_t> id(d.num_states(), -1);
  std::vector<int32_t> order{d.start};
  id[d.start] = 0;
  ByteAutomaton a;
  for (size_t k = 0; k < order.size(); ++k) {
    int32_t s = order[k];
    for (int lo = 0; lo < 256;) {
      int32_t t = d.next(s, static_cast<uint8_t>(lo));
      int hi = lo;
      while (hi + 1 < 256 && d.next(s, static_cast<uint8_t>(hi + 1)) == t) ++hi;
      if (t >= 0 && live[t]) {
        if (id[t] < 0) {
          id[t] = static_cast<int32_t>(order.size());
          order.push_back(t);
        }
        a.edges.push_back({id[s], static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), id[t]});
      }
      lo = hi + 1;
    }
  }
  a.num_states = static_cast<int32_t>(order.size());
  a.start = 0;
  a.final.assign(a.num_states, false);
  for (size_t k = 0; k < order.size(); ++k) a.final[k] = d.final[order[k]];
  return b.automaton(std::move(a));
}

}  // namespace deepinfer::structured

namespace deepinfer::structured {

// Hopcroft's algorithm over the completed automaton (a sink state n stands for every missing
// transition). The partition lives in one permutation `elems` with each block a range; a
// splitter (block, class) marks the predecessors of the block's states on that class, moving
// them to the front of their blocks, and each touched block splits into its marked and
// unmarked parts. The smaller part becomes the new block and is queued for every class (if
// the old block was queued, both are now; if not, the smaller is enough), which bounds the
// work by O(classes * n log n).
Dfa dfa_minimize(const Dfa& d) {
  const int32_t n = d.num_states();
  const int32_t N = n + 1;  // + sink
  const int32_t k = d.num_classes;
  auto target = [&](int32_t s, int32_t c) {
    if (s == n) return n;
    const int32_t t = d.trans[static_cast<size_t>(s) * k + c];
    return t < 0 ? n : t;
  };
  // Predecessors by (class, target): inv[inv_begin[c * N + t] .. inv_begin[c * N + t + 1]).
  std::vector<int32_t> inv_begin(static_cast<size_t>(k) * N + 1, 0), inv(static_cast<size_t>(k) * N);
  for (int32_t s = 0; s < N; ++s)
    for (int32_t c = 0; c < k; ++c) ++inv_begin[static_cast<size_t>(c) * N + target(s, c) + 1];
  for (size_t i = 0; i + 1 < inv_begin.size(); ++i) inv_begin[i + 1] += inv_begin[i];
  {
    std::vector<int32_t> fill(inv_begin.begin(), inv_begin.end() - 1);
    for (int32_t s = 0; s < N; ++s)
      for (int32_t c = 0; c < k; ++c) inv[fill[static_cast<size_t>(c) * N + target(s, c)]++] = s;
  }
  // Blocks: [first, end) of elems; marked: how many of its first elements are marked.
  std::vector<int32_t> elems(N), pos(N), blk(N);
  std::vector<int32_t> first, end, marked;
  {
    int32_t f = 0;
    for (int32_t s = 0; s < n; ++s)
      if (d.final[s]) elems[f++] = s;
    int32_t o = f;
    for (int32_t s = 0; s <= n; ++s)
      if (s == n || !d.final[s]) elems[o++] = s;
    if (f > 0) first.push_back(0), end.push_back(f), marked.push_back(0);
    first.push_back(f), end.push_back(N), marked.push_back(0);  // the sink's block is never empty
    for (int32_t i = 0; i < N; ++i) {
      pos[elems[i]] = i;
      blk[elems[i]] = i < f ? 0 : static_cast<int32_t>(first.size()) - 1;
    }
  }
  std::vector<std::pair<int32_t, int32_t>> work;  // (block, class) splitters
  {
    const int32_t smaller = first.size() == 1 ? 0 : (end[0] - first[0] <= end[1] - first[1] ? 0 : 1);
    for (int32_t c = 0; c < k; ++c) work.push_back({smaller, c});
  }
  std::vector<int32_t> splitter, touched;
  while (!work.empty()) {
    const auto [b, c] = work.back();
    work.pop_back();
    // The splitter's states first: marking moves states inside their blocks, b included.
    splitter.assign(elems.begin() + first[b], elems.begin() + end[b]);
    for (int32_t s : splitter)
      for (int32_t q = inv_begin[static_cast<size_t>(c) * N + s]; q < inv_begin[static_cast<size_t>(c) * N + s + 1]; ++q) {
        const int32_t p = inv[q];
        const int32_t y = blk[p];
        const int32_t m = first[y] + marked[y];
        if (pos[p] < m) continue;  // marked already
        const int32_t other = elems[m];
        std::swap(elems[pos[p]], elems[m]);
        pos[other] = pos[p];
        pos[p] = m;
        if (marked[y]++ == 0) touched.push_back(y);
      }
    for (int32_t y : touched) {
      const int32_t m = marked[y], size = end[y] - first[y];
      marked[y] = 0;
      if (m == size) continue;
      const int32_t z = static_cast<int32_t>(first.size());
      if (m <= size - m) {  // z: the marked front
        first.push_back(first[y]), end.push_back(first[y] + m);
        first[y] += m;
      } else {  // z: the unmarked back
        first.push_back(first[y] + m), end.push_back(end[y]);
        end[y] = first[y] + m;
      }
      marked.push_back(0);
      for (int32_t i = first[z]; i < end[z]; ++i) blk[elems[i]] = z;
      for (int32_t a = 0; a < k; ++a) work.push_back({z, a});
    }
    touched.clear();
  }
  // One state per block reachable from the start, breadth first; the sink's block is "dead".
  Dfa r;
  r.num_classes = k;
  std::copy(std::begin(d.byte_class), std::end(d.byte_class), std::begin(r.byte_class));
  const int32_t dead = blk[n];
  std::vector<int32_t> id(first.size(), -1), order;
  auto visit = [&](int32_t b0) {
    if (id[b0] < 0) {
      id[b0] = static_cast<int32_t>(order.size());
      order.push_back(b0);
    }
    return id[b0];
  };
  r.start = 0;
  visit(blk[d.start]);
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t rep = elems[first[order[i]]];
    r.final.push_back(rep < n && d.final[rep]);
    for (int32_t c = 0; c < k; ++c) {
      const int32_t tb = blk[target(rep, c)];
      r.trans.push_back(tb == dead ? -1 : visit(tb));
    }
  }
  return r;
}

}  // namespace deepinfer::structured
