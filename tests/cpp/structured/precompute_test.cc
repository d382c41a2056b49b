// Pair mask caches (pair_cache.cpp) and the mask precompute (mask_cache.cpp precompute_masks,
// StructuredWorkers::precompute_async): the pair walk equals its plain twin on every (state,
// caller return state) pair, masks with pairs and precomputed caches equal accept_token token
// by token and equal the masks of a grammar that precomputed nothing, and the budgets hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "structured/compiled.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

// Every single byte plus `extra` random tokens of 2..max_len bytes over JSON punctuation,
// letters, digits and UTF-8 pieces, so quotes and delimiters end up mid-token.
std::shared_ptr<const TokenVocabulary> mixed_vocab(uint32_t seed, int extra, int max_len) {
  std::mt19937 rng(seed);
  const std::vector<std::string> pieces = {"a", "b", "k", "1", "7", "0", " ", "\"", ":", ",", "{", "}", "[", "]",
                                           "\\", "n", "u", "-", ".", "e", "é", "中", "true", "null", "\"a\":", "\",\"", "}]", "\"}]", "\"}"};
  TokenizerInfo info;
  for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  std::uniform_int_distribution<int> len(2, max_len), pick(0, static_cast<int>(pieces.size()) - 1);
  for (int k = 0; k < extra; ++k) {
    std::string t;
    const int n = len(rng);
    while (static_cast<int>(t.size()) < n) t += pieces[pick(rng)];
    info.token_bytes.push_back(t);
  }
  std::sort(info.token_bytes.begin() + 256, info.token_bytes.end());
  info.token_bytes.erase(std::unique(info.token_bytes.begin() + 256, info.token_bytes.end()), info.token_bytes.end());
  info.token_bytes.push_back("<eos>");
  info.stop_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
  return make_vocabulary(info);
}

const char* const kGrammars[] = {
    R"({"json_schema": {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}, "i": {"type": "integer"}}, "required": ["s"]}})",
    R"({"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 5}})",
    R"({"json_schema": {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}, "b": {"type": "boolean"}}, "additionalProperties": {"type": "number"}}})",
    R"({"json_schema": {"type": "object", "properties": {"k1": {"type": "string"}, "k2": {"type": "integer"}, "k3": {"type": "string"}, "k4": {"type": "number"}, "k5": {"type": "string"}, "k6": {"type": "integer"}, "k7": {"type": "string"}, "k8": {"type": "string"}, "k9": {"type": "integer"}, "k10": {"type": "string"}}, "required": ["k1", "k9"]}})",
    R"({"json_schema": {"type": "object", "properties": {"t": {"type": "string", "maxLength": 140}, "u": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}})",
    R"({"json_schema": {"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "string", "maxLength": 7}}}}}})",
    R"({"json_object": true})",
    // A tracked object inside an array: `"}]` after a string value must wait for the required
    // keys (a pair cache of the object's states once allowed it whatever keys were written).
    R"({"json_schema": {"type": "array", "items": {"type": "object", "properties": {"k1": {"type": "string"}, "k2": {"type": "integer"}, "k3": {"type": "string"}, "k4": {"type": "number"}, "k5": {"type": "string"}, "k6": {"type": "integer"}, "k7": {"type": "string"}, "k8": {"type": "string"}, "k9": {"type": "integer"}, "k10": {"type": "string"}}, "required": ["k1", "k9"]}}})",
};

std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(PairMaskCache, FastEqualsReferenceOnEveryCallSite) {
  for (uint32_t seed : {3u, 19u}) {
    auto v = mixed_vocab(seed, 333, seed == 3 ? 9 : 17);
    GrammarCompiler c(v);
    for (const char* args : kGrammars) {
      auto g = c.compile_uncached(args);
      const CompiledGrammarImpl& impl = g->impl();
      const Pda& pda = impl.pda;
      int64_t compared = 0;
      for (const PdaCall& call : pda.calls) {
        if (call.tail) continue;
        for (int32_t s = 0; s < static_cast<int32_t>(pda.num_states()); ++s) {
          if (pda.states[s].rule != call.rule) continue;
          auto fast = impl.compute_pair_cache(s, call.ret);
          auto ref = impl.compute_pair_cache(s, call.ret, /*reference=*/true);
          if (ref->gave_up) {  // only for a rule with key-set checks, then in both walks
            ASSERT_TRUE(fast->gave_up) << args << " state " << s;
            continue;
          }
          if (fast->gave_up) continue;  // the caller then walks the state's own set
          ASSERT_EQ(sorted(fast->accepted_ids), sorted(ref->accepted_ids)) << args << " state " << s << " ret " << call.ret;
          ASSERT_EQ(fast->uncertain, ref->uncertain) << args << " state " << s << " ret " << call.ret;
          // Pair-accepted and pair-uncertain tokens are among the state's own uncertain ones.
          auto base = impl.state_cache(s);
          for (int32_t t : fast->accepted_ids) {
            const int32_t rank = static_cast<int32_t>(std::find(v->tok_ids_.begin(), v->tok_ids_.end(), t) - v->tok_ids_.begin());
            ASSERT_TRUE(std::any_of(base->uncertain.begin(), base->uncertain.end(),
                                    [&](const RankRange& r) { return r.lo <= rank && rank < r.hi; }))
                << args << " state " << s << " token " << t;
          }
          compared += !ref->accepted_ids.empty();
        }
      }
      if (std::string(args).find("\"s\"") != std::string::npos) {
        EXPECT_GT(compared, 0) << args;
      }
    }
  }
}

// Random walks (mostly valid tokens) through each grammar three ways: a grammar that
// precomputed all it could, one cut after a few states, one that precomputed nothing. Every
// mask bit must equal accept_token, and the three masks must be equal.
TEST(PairMaskCache, MasksMatchAcceptTokenWithAndWithoutPrecompute) {
  for (uint32_t seed : {5u, 23u}) {
    auto v = mixed_vocab(seed, 301, 11);
    GrammarCompiler c(v);
    const int32_t vs = vocabulary_size(*v);
    const size_t nw = static_cast<size_t>(vs + 31) / 32;
    std::mt19937 rng(seed);
    for (const char* args : kGrammars) {
      auto full = c.compile_uncached(args), part = c.compile_uncached(args), none = c.compile_uncached(args);
      const MaskPrecomputeResult rf = full->precompute_masks({.time_budget_ms = 60000});
      EXPECT_TRUE(rf.complete) << args;
      EXPECT_GT(rf.states, 0) << args;
      part->precompute_masks({.time_budget_ms = 60000, .max_cache_bytes = 1});  // one state, then the byte budget
      for (int rep = 0; rep < 3; ++rep) {
        GrammarMatcher a(full), b(part), n(none);
        std::vector<int32_t> wa(nw), wb(nw), wn(nw);
        for (int step = 0; step < 60 && !a.is_terminated(); ++step) {
          a.fill_next_token_bitmask(wa);
          b.fill_next_token_bitmask(wb);
          n.fill_next_token_bitmask(wn);
          ASSERT_EQ(wa, wn) << args << " seed " << seed << " step " << step;
          ASSERT_EQ(wb, wn) << args << " seed " << seed << " step " << step;
          std::vector<int32_t> allowed;
          for (int32_t t = 0; t < vs; ++t) {
            const bool bit = wa[t >> 5] >> (t & 31) & 1;
            GrammarMatcher probe = a.clone();
            ASSERT_EQ(bit, probe.accept_token(t)) << args << " seed " << seed << " step " << step << " token " << t;
            if (bit && !v->is_stop(t)) allowed.push_back(t);
          }
          if (allowed.empty()) break;
          const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
          ASSERT_TRUE(a.accept_token(t));
          ASSERT_TRUE(b.accept_token(t));
          ASSERT_TRUE(n.accept_token(t));
        }
      }
    }
  }
}

// The case a pair cache once got wrong (Github_easy, a tracked object in an array): after a
// string value, `"}]` must wait until every required key is written, with and without the
// precompute, at every position of a walk through two items.
TEST(PairMaskCache, TrackedObjectInArrayWaitsForRequiredKeys) {
  // Enough tokens holding quotes and brackets that the string states have >= 64 uncertain
  // tokens (CompiledGrammarImpl::kMinPairTokens), so the pair path is taken.
  auto v = mixed_vocab(41, 900, 7);
  GrammarCompiler c(v);
  const char* args = kGrammars[std::size(kGrammars) - 1];
  const int32_t vs = vocabulary_size(*v);
  std::vector<int32_t> w((vs + 31) / 32);
  for (double budget : {0.0, 60000.0}) {
    auto g = c.compile_uncached(args);
    g->precompute_masks({.time_budget_ms = budget});
    GrammarMatcher m(g);
    const std::string text = R"([{"k1":"x","k3":"y","k9":1,"k5":"z"},{"k9":2,"k7":"q","k1":"r"}])";
    for (size_t i = 0; i < text.size(); ++i) {
      m.fill_next_token_bitmask(w);
      for (int32_t t = 0; t < vs; ++t) {
        GrammarMatcher probe = m.clone();
        ASSERT_EQ(static_cast<bool>(w[t >> 5] >> (t & 31) & 1), probe.accept_token(t))
            << "budget " << budget << " after " << text.substr(0, i) << " token " << v->bytes(t);
      }
      ASSERT_TRUE(m.accept_bytes(text.substr(i, 1))) << text.substr(0, i + 1);
    }
  }
}

TEST(MaskPrecompute, BudgetsAndCancel) {
  auto v = mixed_vocab(7, 257, 13);
  GrammarCompiler c(v);
  const char* args = kGrammars[3];
  // Off: nothing filled.
  auto g0 = c.compile_uncached(args);
  MaskPrecomputeResult r = g0->precompute_masks({.time_budget_ms = 0});
  EXPECT_EQ(r.states, 0);
  EXPECT_FALSE(r.complete);
  // Cancelled before the start: nothing filled.
  std::atomic<bool> cancel{true};
  r = g0->precompute_masks({.time_budget_ms = 60000}, &cancel);
  EXPECT_EQ(r.states, 0);
  EXPECT_FALSE(r.complete);
  // Byte budget: stops right after the first entry.
  r = g0->precompute_masks({.time_budget_ms = 60000, .max_cache_bytes = 1});
  EXPECT_GE(r.states, 1);
  EXPECT_FALSE(r.complete);
  // Unbounded: every reachable state, and a second call finds them all cached.
  auto g1 = c.compile_uncached(args);
  r = g1->precompute_masks({.time_budget_ms = 60000});
  EXPECT_TRUE(r.complete);
  EXPECT_GT(r.pairs, 0);
  EXPECT_LE(r.states, g1->num_states());
  const MaskPrecomputeResult again = g1->precompute_masks({.time_budget_ms = 60000});
  EXPECT_EQ(again.states, r.states);
  EXPECT_EQ(again.pairs, r.pairs);
  EXPECT_LT(again.ms, r.ms + 1000);
}

TEST(MaskPrecompute, WorkersPrecomputeAfterCompile) {
  auto v = mixed_vocab(31, 277, 10);
  EXPECT_THROW(StructuredWorkers(1, {.time_budget_ms = 1e9}), InvalidArgument);
  EXPECT_THROW(StructuredWorkers(1, {.time_budget_ms = 10, .max_cache_bytes = -1}), InvalidArgument);
  GrammarCompiler c(v);
  const int32_t vs = vocabulary_size(*v);
  std::vector<int32_t> wa((vs + 31) / 32), wb((vs + 31) / 32);
  {
    StructuredWorkers w(2, {.time_budget_ms = 60000});
    auto f = w.compile_async(c, kGrammars[0]);
    auto g = f.get();
    // A grammar dropped before its precompute runs is skipped (weak reference).
    w.precompute_async(c.compile_uncached(kGrammars[2]));
    // Masks while the precompute may still run equal a fresh grammar's.
    auto fresh = c.compile_uncached(kGrammars[0]);
    GrammarMatcher a(g), b(fresh);
    for (const char* piece : {"{", "\"s\"", ":", "\"x", "y\"", ",", "\"n\":", "-1", "2.5", "}"}) {
      a.fill_next_token_bitmask(wa);
      b.fill_next_token_bitmask(wb);
      ASSERT_EQ(wa, wb) << piece;
      ASSERT_TRUE(a.accept_bytes(piece)) << piece;
      ASSERT_TRUE(b.accept_bytes(piece)) << piece;
    }
  }  // destroying the workers cancels a precompute still running and joins
  // Off: compile_async still compiles, nothing else queued.
  StructuredWorkers off(1, {.time_budget_ms = 0});
  EXPECT_GT(off.compile_async(c, kGrammars[1]).get()->num_states(), 0);
}

}  // namespace
}  // namespace deepinfer::structured::test

namespace deepinfer::structured::test {
namespace {

// Schema i of a family of distinct objects (8 properties named after i, 2 required) and a
// valid instance of it.
std::string family_schema(int i) {
  const char* types[] = {"string", "integer", "number", "boolean"};
  std::string props;
  for (int j = 0; j < 8; ++j)
    props += (j ? ", " : "") + ("\"g" + std::to_string(i) + "_" + std::to_string(j) + "\": {\"type\": \"" + types[j % 4] + "\"}");
  return R"({"json_schema": {"type": "object", "properties": {)" + props + R"(}, "required": ["g)" + std::to_string(i) +
         R"(_0", "g)" + std::to_string(i) + R"(_1"]}})";
}
std::string family_instance(int i) {
  const std::string p = "\"g" + std::to_string(i) + "_";
  return "{" + p + "1\":-17," + p + "0\":\"a\\u00e9b\"," + p + "3\":true," + p + "2\":2.5e3}";
}

// Masks of `g` along `text` equal those of a fresh grammar that precomputed nothing; with
// release_at < text.size(), g's caches are released there, mid-walk.
void expect_masks_equal_fresh(GrammarCompiler& c, const std::shared_ptr<const CompiledGrammar>& g,
                              const std::string& args, const std::string& text, size_t release_at = SIZE_MAX) {
  const int32_t vs = vocabulary_size(*c.vocabulary());
  std::vector<int32_t> wa((vs + 31) / 32), wb((vs + 31) / 32);
  GrammarMatcher a(g), b(c.compile_uncached(args));
  for (size_t i = 0; i < text.size(); ++i) {
    if (i == release_at) g->release_mask_caches();
    a.fill_next_token_bitmask(wa);
    b.fill_next_token_bitmask(wb);
    ASSERT_EQ(wa, wb) << args << " after " << text.substr(0, i);
    ASSERT_TRUE(a.accept_bytes(text.substr(i, 1))) << text.substr(0, i + 1);
    ASSERT_TRUE(b.accept_bytes(text.substr(i, 1))) << text.substr(0, i + 1);
  }
}

TEST(MaskPrecompute, WorkersGlobalCapReleasesLeastRecentlyUsed) {
  auto v = mixed_vocab(53, 700, 11);
  GrammarCompiler c(v);
  EXPECT_THROW(StructuredWorkers(1, {.max_total_bytes = -1}), InvalidArgument);
  // One grammar's full precompute, measured; the cap holds about three of them.
  auto probe = c.compile_uncached(family_schema(999));
  ASSERT_TRUE(probe->precompute_masks({.time_budget_ms = 60000}).complete);
  const int64_t one = probe->mask_cache_bytes();
  ASSERT_GT(one, 0);
  EXPECT_EQ(probe->release_mask_caches(), one);
  EXPECT_EQ(probe->mask_cache_bytes(), 0);
  const int64_t cap = one * 7 / 2;
  constexpr int kGrammars = 12;
  std::vector<std::shared_ptr<const CompiledGrammar>> gs;
  // One worker: compile i + 1 runs after precompute i, so each get() sees the ledger settled
  // up to the previous grammar.
  StructuredWorkers w(1, {.time_budget_ms = 60000, .max_cache_bytes = 16 << 20, .max_total_bytes = cap});
  for (int i = 0; i < kGrammars; ++i) {
    gs.push_back(w.compile_async(c, family_schema(i)).get());
    EXPECT_LE(w.precompute_stats().bytes, cap) << i;
  }
  while (w.precompute_stats().finished < kGrammars) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const StructuredWorkers::PrecomputeStats st = w.precompute_stats();
  int64_t live = 0;
  for (const auto& g : gs) live += g->mask_cache_bytes();
  EXPECT_EQ(live, st.bytes);  // no mask calls: the ledger is exact
  EXPECT_LE(live, cap);
  EXPECT_GE(st.released, kGrammars - 4);
  EXPECT_GE(st.grammars, 2);
  EXPECT_EQ(st.skipped, 0);
  EXPECT_EQ(gs.front()->mask_cache_bytes(), 0);  // least recently used: released
  EXPECT_GT(gs.back()->mask_cache_bytes(), 0);   // the newest keeps its caches
  // A new request for a released grammar (a compiler cache hit) precomputes it again, as the
  // most recent, and releases the oldest still held.
  EXPECT_EQ(w.compile_async(c, family_schema(0)).get(), gs.front());
  while (w.precompute_stats().finished < kGrammars + 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GT(gs.front()->mask_cache_bytes(), 0);
  EXPECT_GT(w.precompute_stats().released, st.released);
  EXPECT_LE(w.precompute_stats().bytes, cap);
  // Masks are those of a grammar that precomputed nothing: released, kept, and released mid-walk.
  for (int i : {0, 1, kGrammars / 2, kGrammars - 1})
    expect_masks_equal_fresh(c, gs[size_t(i)], family_schema(i), family_instance(i));
  expect_masks_equal_fresh(c, gs.back(), family_schema(kGrammars - 1), family_instance(kGrammars - 1), 9);
  // A cap below one grammar's budget still bounds it; a zero cap precomputes nothing.
  StructuredWorkers tiny(2, {.time_budget_ms = 60000, .max_total_bytes = one / 3});
  for (int i = 20; i < 26; ++i) gs.push_back(tiny.compile_async(c, family_schema(i)).get());
  while (tiny.precompute_stats().finished < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_LE(tiny.precompute_stats().bytes, one / 3);
  StructuredWorkers none(1, {.time_budget_ms = 60000, .max_total_bytes = 0});
  auto g0 = none.compile_async(c, family_schema(40)).get();
  while (none.precompute_stats().finished == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(g0->mask_cache_bytes(), 0);
  expect_masks_equal_fresh(c, g0, family_schema(40), family_instance(40));
}

// A compile is never queued behind a precompute: on one worker, the second request's compile
// runs while the first grammar's precompute is still unfinished (it stops for the compile and
// resumes after, to the same caches).
TEST(MaskPrecompute, CompileGoesBeforeARunningPrecompute) {
  auto v = mixed_vocab(59, 2500, 13);
  GrammarCompiler c(v);
  auto probe = c.compile_uncached(family_schema(70));
  const MaskPrecomputeResult full = probe->precompute_masks({.time_budget_ms = 60000});
  ASSERT_TRUE(full.complete);
  ASSERT_GT(full.ms, 5) << "the precompute must outlast posting the next compile";
  StructuredWorkers w(1, {.time_budget_ms = 60000});
  auto a = w.compile_async(c, family_schema(71)).get();
  auto b = w.compile_async(c, family_schema(72)).get();
  EXPECT_EQ(w.precompute_stats().finished, 0);  // before: b's compile waited for a's precompute
  while (w.precompute_stats().finished < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Resumed to the end: the states and pairs of an uninterrupted precompute of the same grammar,
  // and nothing left for another one to fill.
  auto ref = c.compile_uncached(family_schema(71));
  const MaskPrecomputeResult rr = ref->precompute_masks({.time_budget_ms = 60000});
  ASSERT_TRUE(rr.complete);
  const int64_t before = a->mask_cache_bytes();
  const MaskPrecomputeResult again = a->precompute_masks({.time_budget_ms = 60000});
  EXPECT_TRUE(again.complete);
  EXPECT_EQ(again.states, rr.states);
  EXPECT_EQ(again.pairs, rr.pairs);
  EXPECT_EQ(again.bytes, rr.bytes);
  EXPECT_EQ(a->mask_cache_bytes(), before);
  expect_masks_equal_fresh(c, a, family_schema(71), family_instance(71));
  expect_masks_equal_fresh(c, b, family_schema(72), family_instance(72));
}

}  // namespace
}  // namespace deepinfer::structured::test
