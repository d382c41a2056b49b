// dfa_minimize (regular.h): the minimal automaton of random DFAs accepts exactly the same
// strings, has as many states as a plain Moore refinement finds classes (its slow twin
// here), and minimising twice changes nothing. A searched pattern's equivalent "found"
// subsets become one state.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "structured/regular.h"

namespace deepinfer::structured {
namespace {

// n states, k classes (byte b in class b % k), each transition missing with probability 1/4.
Dfa random_dfa(std::mt19937& rng, int32_t n, int32_t k) {
  Dfa d;
  d.num_classes = k;
  for (int b = 0; b < 256; ++b) d.byte_class[b] = static_cast<uint8_t>(b % k);
  d.start = static_cast<int32_t>(rng() % n);
  for (int32_t s = 0; s < n; ++s) {
    d.final.push_back(rng() % 3 == 0);
    for (int32_t c = 0; c < k; ++c) d.trans.push_back(rng() % 4 == 0 ? -1 : static_cast<int32_t>(rng() % n));
  }
  return d;
}

// Moore refinement to a fixpoint over the completed automaton (sink = n): the number of
// classes of states reachable from the start, the dead class not counted (unless the start
// is dead: one state then).
int32_t moore_states(const Dfa& d) {
  const int32_t n = d.num_states(), k = d.num_classes;
  auto target = [&](int32_t s, int32_t c) {
    if (s == n) return n;
    const int32_t t = d.trans[static_cast<size_t>(s) * k + c];
    return t < 0 ? n : t;
  };
  std::vector<int32_t> cls(n + 1);
  for (int32_t s = 0; s <= n; ++s) cls[s] = s < n && d.final[s] ? 1 : 0;
  for (;;) {
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<int32_t> next(n + 1);
    for (int32_t s = 0; s <= n; ++s) {
      std::vector<int32_t> sig{cls[s]};
      for (int32_t c = 0; c < k; ++c) sig.push_back(cls[target(s, c)]);
      next[s] = ids.emplace(sig, static_cast<int32_t>(ids.size())).first->second;
    }
    const bool same = std::set<int32_t>(next.begin(), next.end()).size() == std::set<int32_t>(cls.begin(), cls.end()).size();
    cls = next;
    if (same) break;
  }
  if (cls[d.start] == cls[n]) return 1;
  std::set<int32_t> seen_cls;
  std::vector<bool> seen(n, false);
  std::vector<int32_t> work{d.start};
  seen[d.start] = true;
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    if (cls[s] != cls[n]) seen_cls.insert(cls[s]);
    for (int32_t c = 0; c < k; ++c) {
      const int32_t t = target(s, c);
      if (t < n && !seen[t] && cls[t] != cls[n]) seen[t] = true, work.push_back(t);
    }
  }
  return static_cast<int32_t>(seen_cls.size());
}

TEST(DfaMinimize, RandomDfasSameLanguageAndMinimal) {
  std::mt19937 rng(19);
  for (int32_t n : {1, 2, 19, 111, 257}) {
    for (int32_t k : {1, 3, 5}) {
      for (int rep = 0; rep < 6; ++rep) {
        const Dfa d = random_dfa(rng, n, k);
        const Dfa m = dfa_minimize(d);
        ASSERT_EQ(m.num_states(), moore_states(d)) << "n " << n << " k " << k << " rep " << rep;
        EXPECT_EQ(dfa_minimize(m).num_states(), m.num_states());
        for (int t = 0; t < 400; ++t) {
          std::string s(rng() % 24, '\0');
          for (char& ch : s) ch = static_cast<char>(rng() % 7);
          ASSERT_EQ(m.matches(s), d.matches(s)) << "n " << n << " k " << k << " text length " << s.size();
        }
      }
    }
  }
}

TEST(DfaMinimize, SearchedPatternFoundStatesMerge) {
  // "contains 1" over {0, 1} as the subset construction leaves it: 0 start, 1 found after a
  // 1, 2 found after a 0 (equivalent to 1).
  Dfa d;
  d.num_classes = 2;
  for (int b = 0; b < 256; ++b) d.byte_class[b] = b == '1' ? 1 : 0;
  d.start = 0;
  d.final = {false, true, true};
  d.trans = {0, 1, /*1*/ 2, 1, /*2*/ 2, 1};
  const Dfa m = dfa_minimize(d);
  ASSERT_EQ(m.num_states(), 2);
  EXPECT_EQ(m.next(m.start, '1'), m.next(m.next(m.start, '1'), '0'));  // found loops on itself
  EXPECT_TRUE(m.matches("0010"));
  EXPECT_FALSE(m.matches("000"));
  EXPECT_FALSE(m.matches(""));
}

}  // namespace
}  // namespace deepinfer::structured
