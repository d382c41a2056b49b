// Shared suffix fragments in the NFA build (AutomatonLimits::share_suffixes, automaton.cpp
// entry_to) against the plain build: the two automata must be bisimilar from every rule start
// (same finality, dead ends, calls with their tail flags, and transitions on every byte class,
// pairwise over all reachable state pairs), so every accept/reject and every mask is the same.
// Over hand-written schemas (additionalProperties key tries incl. escapes and UTF-8 names),
// random grammars built with many structurally equal subexpressions, and the MaskBench-dev
// slice when the shared data is present.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "structured/compiled.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

// Empty when bisimilar, else what differs first.
std::string bisim(const Pda& a, const Pda& b) {
  if (a.empty_language != b.empty_language) return "empty_language";
  if (a.num_classes != b.num_classes || std::memcmp(a.byte_class, b.byte_class, 256) != 0) return "byte classes";
  if (a.rule_start.size() != b.rule_start.size() || a.rule_called != b.rule_called) return "rules";
  std::set<std::pair<int32_t, int32_t>> seen;
  std::vector<std::pair<int32_t, int32_t>> todo;
  for (size_t r = 0; r < a.rule_start.size(); ++r) {
    if ((a.rule_start[r] < 0) != (b.rule_start[r] < 0)) return "rule start";
    if (a.rule_start[r] >= 0) todo.push_back({a.rule_start[r], b.rule_start[r]});
  }
  while (!todo.empty()) {
    auto [x, y] = todo.back();
    todo.pop_back();
    if (!seen.insert({x, y}).second) continue;
    const PdaState &sx = a.states[x], &sy = b.states[y];
    if (sx.rule != sy.rule || sx.final != sy.final || sx.dead_end != sy.dead_end || sx.has_calls != sy.has_calls ||
        sx.calls_end - sx.calls_begin != sy.calls_end - sy.calls_begin)
      return "state " + std::to_string(x) + " / " + std::to_string(y);
    for (int32_t k = 0; k < sx.calls_end - sx.calls_begin; ++k) {
      const PdaCall &cx = a.calls[sx.calls_begin + k], &cy = b.calls[sy.calls_begin + k];
      if (cx.rule != cy.rule || cx.tail != cy.tail) return "call of state " + std::to_string(x);
      todo.push_back({cx.ret, cy.ret});
    }
    for (int32_t c = 0; c < a.num_classes; ++c) {
      const int32_t tx = a.trans[static_cast<size_t>(x) * a.num_classes + c];
      const int32_t ty = b.trans[static_cast<size_t>(y) * b.num_classes + c];
      if ((tx < 0) != (ty < 0)) return "edge of state " + std::to_string(x) + " class " + std::to_string(c);
      if (tx >= 0) todo.push_back({tx, ty});
    }
  }
  return "";
}

// Builds g both ways; returns (plain states, shared states). Errors must agree too.
std::pair<size_t, size_t> expect_same(const Grammar& g, const std::string& what) {
  AutomatonLimits plain_lim, shared_lim;
  plain_lim.share_suffixes = false;
  std::string e_plain, e_shared;
  Pda plain, shared;
  try { plain = build_pda(g, plain_lim); } catch (const GrammarError& e) { e_plain = e.what(); }
  try { shared = build_pda(g, shared_lim); } catch (const GrammarError& e) { e_shared = e.what(); }
  // The unshared build may run out of its state budget where the shared one fits (that is what
  // sharing is for: integer spellings, tracked objects); never the other way round.
  const bool plain_too_large = e_plain.find("grammar too large") != std::string::npos;
  if (!(plain_too_large && e_shared.empty())) {
    EXPECT_EQ(e_plain.empty(), e_shared.empty()) << what << ": " << e_plain << " | " << e_shared;
  }
  if (!e_plain.empty() || !e_shared.empty()) return {0, 0};
  EXPECT_EQ(bisim(plain, shared), "") << what;
  EXPECT_LE(shared.num_states(), plain.num_states()) << what;
  return {plain.num_states(), shared.num_states()};
}

std::pair<size_t, size_t> expect_same_schema(const std::string& schema) {
  return expect_same(lower_so_args("{\"json_schema\": " + schema + "}"), schema);
}

TEST(AutomatonShare, SchemasBisimilarAndSmaller) {
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"name":{"type":"string"},"nickname":{"type":"string"},"age":{"type":"integer"}},"required":["name"]})",
      R"({"type":"object","properties":{"a\"b":{"type":"string"},"é中":{"type":"number"},"a/b\\c":{"type":"boolean"}}})",
      R"({"type":"object","properties":{"x":{"type":"object","properties":{"xa":{"type":"string","maxLength":5},"xb":{}}}},"additionalProperties":{"type":"array","items":{"type":"string"}}})",
      R"({"type":"object","properties":{"k":{"enum":["a","ab","abc"]}},"patternProperties":{"^p_":{"type":"integer"}},"additionalProperties":false})",
      R"({"anyOf":[{"type":"object","properties":{"id":{"type":"string"},"idx":{"type":"integer"}},"required":["id"]},{"type":"array","items":{"type":"object"}}]})",
      R"({"type":"object","properties":{"a":{"type":"string","pattern":"^(ab)*c?$"},"b":{"type":"string","format":"date"}},"minProperties":1,"maxProperties":3})",
      R"({"type":"array","items":{"type":"string","minLength":2,"maxLength":40},"minItems":1,"maxItems":4})",
      R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},"$ref":"#/$defs/n"})",
  };
  size_t plain = 0, shared = 0;
  for (const auto& s : schemas) {
    auto [p, q] = expect_same_schema(s);
    plain += p;
    shared += q;
  }
  EXPECT_LT(shared, plain);  // the key tries under additionalProperties share their tails
}

// Random grammars whose alternatives end in structurally equal (but separately built)
// repeats, inlined rules and nested alternatives: the suffixes entry_to shares.
ExprId random_expr(GrammarBuilder& b, std::mt19937& rng, const std::vector<RuleId>& rules, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 3 ? 1 : 6), byte('a', 'd'), n(2, 3);
  switch (kind(rng)) {
    case 0: return b.byte(static_cast<uint8_t>(byte(rng)));
    case 1: return b.byte_range('a', static_cast<uint8_t>(byte(rng)));
    case 2: {
      std::vector<ExprId> parts;
      for (int i = n(rng); i > 0; --i) parts.push_back(random_expr(b, rng, rules, depth + 1));
      return b.seq(std::move(parts));
    }
    case 3: {
      std::vector<ExprId> parts;
      for (int i = n(rng); i > 0; --i) parts.push_back(random_expr(b, rng, rules, depth + 1));
      if (rng() % 3 == 0) parts.push_back(b.empty());
      return b.alt(std::move(parts));
    }
    case 4: {
      const int lo = static_cast<int>(rng() % 2);
      return b.repeat(b.byte_range('a', 'b'), lo, rng() % 2 ? kUnbounded : lo + 2);
    }
    case 5: return rules.empty() ? b.star(b.byte('c')) : b.ref(rules[rng() % rules.size()]);
    default: {
      // The key-trie shape: nested alternatives each ending in the same kind of tail.
      ExprId tail = rng() % 2 ? b.star(b.byte_range('a', 'c')) : b.repeat(b.byte('d'), 1, 3);
      return b.alt({b.seq({b.byte('a'), tail}), b.seq({b.byte('b'), b.alt({b.byte('c'), b.seq({b.byte('d'), b.star(b.byte_range('a', 'c'))})})})});
    }
  }
}

TEST(AutomatonShare, RandomGrammarsBisimilar) {
  size_t plain = 0, shared = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    std::mt19937 rng(seed);
    GrammarBuilder b;
    std::vector<RuleId> rules;
    const int nrules = static_cast<int>(rng() % 4);
    for (int i = 0; i < nrules; ++i) rules.push_back(b.declare_rule("r" + std::to_string(i)));
    for (int i = 0; i < nrules; ++i) {
      // Rule i refers only to later rules (no left recursion); some stay called, not inlined.
      std::vector<RuleId> later(rules.begin() + i + 1, rules.end());
      b.define_rule(rules[i], b.seq({b.byte('x'), random_expr(b, rng, later, 0)}));
      if (rng() % 3 == 0) b.set_inline(rules[i], false);
    }
    RuleId root = b.declare_rule("root");
    b.define_rule(root, b.seq({random_expr(b, rng, rules, 0), random_expr(b, rng, rules, 0)}));
    auto [p, q] = expect_same(std::move(b).finish(root), "seed " + std::to_string(seed));
    plain += p;
    shared += q;
    if (HasFailure()) return;
  }
  EXPECT_LT(shared, plain);  // some fragments were shared, so the comparison tested something
}

TEST(AutomatonShare, MaskBenchSliceBisimilar) {
  auto tar = shared_dir() / "data/structured/maskbench-dev.tar.gz";
  if (!std::filesystem::exists(tar)) GTEST_SKIP() << "maskbench-dev.tar.gz not found under " << shared_dir();
  const char* bin = std::getenv("DEEPINFER_BINARY_DIR");
  std::filesystem::path out = std::filesystem::path(bin ? bin : "/tmp") / "tmp" / "maskbench";
  if (!std::filesystem::exists(out / "maskbench-dev")) {
    std::filesystem::create_directories(out);
    std::string cmd = "tar xzf '" + tar.string() + "' -C '" + out.string() + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(out / "maskbench-dev")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  size_t plain = 0, shared = 0, checked = 0;
  for (size_t i = 0; i < files.size(); i += 19) {
    std::ifstream f(files[i]);
    nlohmann::ordered_json d = nlohmann::ordered_json::parse(f);
    Grammar g;
    try {
      g = lower_so_args(nlohmann::ordered_json{{"json_schema", d["schema"]}}.dump());
    } catch (const Error&) {
      continue;  // not supported: a compile error either way
    }
    auto [p, q] = expect_same(g, files[i].filename().string());
    plain += p;
    shared += q;
    ++checked;
    if (HasFailure()) return;
  }
  std::printf("maskbench slice: %zu schemas bisimilar, DFA states %zu -> %zu\n", checked, plain, shared);
  EXPECT_GT(checked, 100u);
}

}  // namespace
}  // namespace deepinfer::structured::test
