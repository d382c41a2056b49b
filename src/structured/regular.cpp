#include "structured/regular.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/check.h"

namespace deepinfer::structured {
namespace {

struct Nfa {
  struct Edge { uint8_t lo, hi; int32_t to; };
  std::vector<std::vector<int32_t>> eps;  // [states]
  std::vector<std::vector<Edge>> bytes;   // [states]
  int32_t add() {
    eps.emplace_back();
    bytes.emplace_back();
    return static_cast<int32_t>(eps.size() - 1);
  }
};

// Thompson construction; false when the expression is not regular (a recursive rule).
class NfaBuilder {
 public:
  NfaBuilder(const GrammarBuilder& b, int32_t max_states) : b_(b), max_(max_states * 16) {}
  Nfa nfa;
  bool build(ExprId id, int32_t start, int32_t* end, int depth) {
    if (depth > 64) return false;  // deep rule nesting: treat as not regular
    if (static_cast<int32_t>(nfa.eps.size()) > max_) DI_THROW(GrammarError, "regular-language operation too large");
    const Expr& e = b_.expr(id);
    switch (e.kind) {
      case ExprKind::kNothing: *end = nfa.add(); return true;
      case ExprKind::kEmpty: *end = start; return true;
      case ExprKind::kBytes: {
        if (e.mark >= 0) return false;  // a tracked object's key set is not a regular language
        int32_t t = nfa.add();
        for (ByteRange r : e.ranges) nfa.bytes[start].push_back({r.lo, r.hi, t});
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
          nfa.eps[start].push_back(s);
          if (!build(c, s, &ce, depth)) return false;
          nfa.eps[ce].push_back(t);
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
          nfa.eps[cur].push_back(loop);
          if (!build(e.children[0], loop, &t, depth)) return false;
          nfa.eps[t].push_back(loop);
          *end = loop;
          return true;
        }
        int32_t t = nfa.add();
        for (int32_t i = e.min; i < e.max; ++i) {
          nfa.eps[cur].push_back(t);
          int32_t s = nfa.add();
          nfa.eps[cur].push_back(s);
          if (!build(e.children[0], s, &cur, depth)) return false;
        }
        nfa.eps[cur].push_back(t);
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
        int32_t base = static_cast<int32_t>(nfa.eps.size());
        for (int32_t i = 0; i < a.num_states; ++i) nfa.add();
        int32_t t = nfa.add();
        for (const auto& ed : a.edges) nfa.bytes[base + ed.from].push_back({ed.lo, ed.hi, base + ed.to});
        for (int32_t i = 0; i < a.num_states; ++i)
          if (a.final[i]) nfa.eps[base + i].push_back(t);
        nfa.eps[start].push_back(base + a.start);
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

void closure(const Nfa& n, std::vector<int32_t>& set, std::vector<uint32_t>& stamp, uint32_t gen) {
  std::vector<int32_t> work(set);
  for (int32_t s : set) stamp[s] = gen;
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (int32_t t : n.eps[s])
      if (stamp[t] != gen) { stamp[t] = gen; set.push_back(t); work.push_back(t); }
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
  const Nfa& nfa = nb.nfa;
  Dfa d;
  std::vector<bool> boundary(257, false);
  boundary[0] = boundary[256] = true;
  for (const auto& es : nfa.bytes)
    for (const auto& ed : es) boundary[ed.lo] = boundary[ed.hi + 1] = true;
  int32_t cls = -1;
  for (int c = 0; c < 256; ++c) {
    if (boundary[c]) ++cls;
    d.byte_class[c] = static_cast<uint8_t>(cls);
  }
  d.num_classes = cls + 1;
  std::vector<uint32_t> stamp(nfa.eps.size(), 0);
  uint32_t gen = 0;
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  auto intern = [&](std::vector<int32_t> set) {
    closure(nfa, set, stamp, ++gen);
    // Only states with byte edges and the end decide behaviour: closures differing in
    // pass-through states are one DFA state (no twin per character class).
    set.erase(std::remove_if(set.begin(), set.end(), [&](int32_t s) { return nfa.bytes[s].empty() && s != end; }),
              set.end());
    if (set.empty()) return -1;
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    int32_t id = static_cast<int32_t>(sets.size());
    if (id >= max_states) too_large(max_states);
    ids.emplace(set, id);
    d.final.push_back(std::binary_search(set.begin(), set.end(), end));
    d.trans.resize(d.trans.size() + d.num_classes, -1);
    sets.push_back(std::move(set));
    return id;
  };
  d.start = intern({start});
  if (d.start < 0) {  // the empty language: one dead start state
    d.start = 0;
    d.final.push_back(false);
    d.trans.assign(d.num_classes, -1);
  }
  std::vector<std::vector<int32_t>> targets(d.num_classes);
  for (size_t cur = 0; cur < sets.size(); ++cur) {
    for (auto& t : targets) t.clear();
    for (int32_t s : sets[cur])
      for (const auto& ed : nfa.bytes[s])
        for (int c = d.byte_class[ed.lo]; c <= d.byte_class[ed.hi]; ++c) targets[c].push_back(ed.to);
    for (int c = 0; c < d.num_classes; ++c) {
      if (targets[c].empty()) continue;
      std::sort(targets[c].begin(), targets[c].end());
      targets[c].erase(std::unique(targets[c].begin(), targets[c].end()), targets[c].end());
      d.trans[cur * d.num_classes + c] = intern(targets[c]);
    }
  }
  return d;
}

Dfa dfa_product(const std::vector<const Dfa*>& dfas, const std::function<bool(uint32_t)>& accept, int32_t max_states) {
  DI_CHECK(!dfas.empty() && dfas.size() <= 31, "dfa_product of ", dfas.size(), " automata");
  Dfa d;
  // Classes: bytes equivalent in every operand.
  std::map<std::vector<uint8_t>, int32_t> sig_class;
  for (int c = 0; c < 256; ++c) {
    std::vector<uint8_t> sig;
    for (const Dfa* x : dfas) sig.push_back(x->byte_class[c]);
    auto [it, ins] = sig_class.emplace(sig, static_cast<int32_t>(sig_class.size()));
    d.byte_class[c] = static_cast<uint8_t>(it->second);
  }
  d.num_classes = static_cast<int32_t>(sig_class.size());
  std::vector<uint8_t> rep(d.num_classes);
  for (int c = 255; c >= 0; --c) rep[d.byte_class[c]] = static_cast<uint8_t>(c);
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> tuples;
  auto intern = [&](std::vector<int32_t> t) {
    auto it = ids.find(t);
    if (it != ids.end()) return it->second;
    int32_t id = static_cast<int32_t>(tuples.size());
    if (id >= max_states) too_large(max_states);
    uint32_t mask = 0;
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i] >= 0 && dfas[i]->final[t[i]]) mask |= 1u << i;
    d.final.push_back(accept(mask));
    d.trans.resize(d.trans.size() + d.num_classes, -1);
    ids.emplace(t, id);
    tuples.push_back(std::move(t));
    return id;
  };
  std::vector<int32_t> s0;
  for (const Dfa* x : dfas) s0.push_back(x->start);
  d.start = intern(s0);
  for (size_t cur = 0; cur < tuples.size(); ++cur) {
    for (int c = 0; c < d.num_classes; ++c) {
      std::vector<int32_t> t(dfas.size());
      bool any = false;
      for (size_t i = 0; i < dfas.size(); ++i) {
        int32_t s = tuples[cur][i];
        t[i] = s < 0 ? -1 : dfas[i]->next(s, rep[c]);
        any |= t[i] >= 0;
      }
      if (any) d.trans[cur * d.num_classes + c] = intern(std::move(t));
    }
  }
  return d;
}

namespace {
// States from which some final state is reachable.
std::vector<bool> live_states(const Dfa& d) {
  const int32_t n = d.num_states();
  std::vector<std::vector<int32_t>> preds(n);
  for (int32_t s = 0; s < n; ++s)
    for (int c = 0; c < d.num_classes; ++c) {
      int32_t t = d.trans[static_cast<size_t>(s) * d.num_classes + c];
      if (t >= 0) preds[t].push_back(s);
    }
  std::vector<bool> live(n, false);
  std::vector<int32_t> work;
  for (int32_t s = 0; s < n; ++s)
    if (d.final[s]) { live[s] = true; work.push_back(s); }
  while (!work.empty()) {
    int32_t s = work.back();
    work.pop_back();
    for (int32_t p : preds[s])
      if (!live[p]) { live[p] = true; work.push_back(p); }
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
