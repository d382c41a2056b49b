// Masks off the critical path: compile_async, a batch's masks filled in parallel (equal to
// filling them one by one), and per-draft-position masks for speculative decoding.
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

const char* const kArgs[] = {
    R"({"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}})",
    R"({"regex": "[a-c]{2,5}x"})",
    R"({"json_schema": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}})",
    R"({"ebnf": "root ::= \"(\" root \")\" | \"z\""})"};

TEST(Workers, CompileAsyncMatchesCompileAndCarriesErrors) {
  GrammarCompiler c(byte_vocab());
  StructuredWorkers w(2);
  auto f = w.compile_async(c, kArgs[1]);
  auto bad = w.compile_async(c, R"({"regex": "(unclosed"})");
  auto g = f.get();
  EXPECT_TRUE(matches(g, "abx"));
  EXPECT_FALSE(matches(g, "ax"));
  EXPECT_THROW(bad.get(), GrammarError);
  EXPECT_EQ(w.compile_async(c, kArgs[1]).get(), g);  // the compiler's cache
  // A cached grammar is ready at once (never queued behind another compile).
  auto again = w.compile_async(c, kArgs[1]);
  EXPECT_EQ(again.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(again.get(), g);
  EXPECT_EQ(c.find_cached(kArgs[1]), g);
  EXPECT_EQ(c.find_cached(kArgs[0]), nullptr);
  EXPECT_EQ(c.find_cached("{not json"), nullptr);
}

TEST(Workers, ParallelMasksEqualSequential) {
  auto v = byte_vocab();
  GrammarCompiler c(v);
  StructuredWorkers w(3);
  const size_t row = static_cast<size_t>(v->vocab_size() + 31) / 32;
  std::vector<GrammarMatcher> ms;
  const char* prefixes[] = {"{\"a\":1", "ab", "[true,", "(("};
  for (int rep = 0; rep < 4; ++rep)
    for (int i = 0; i < 4; ++i) {
      ms.emplace_back(c.compile(kArgs[i]));
      ASSERT_TRUE(ms.back().accept_bytes(std::string(prefixes[i]).substr(0, rep)));
    }
  std::vector<GrammarMatcher*> ptrs;
  for (auto& m : ms) ptrs.push_back(&m);
  std::vector<int32_t> par(ptrs.size() * row, -1), seq(ptrs.size() * row, -1);
  w.fill_next_token_bitmasks(ptrs, par, row);
  for (size_t i = 0; i < ptrs.size(); ++i) ptrs[i]->fill_next_token_bitmask(std::span<int32_t>(seq).subspan(i * row, row));
  EXPECT_EQ(par, seq);
  std::vector<int32_t> small(row);
  EXPECT_THROW(w.fill_next_token_bitmasks(ptrs, small, row), InvalidArgument);
}

TEST(Workers, DraftMasksEqualStepByStep) {
  auto v = byte_vocab();
  GrammarCompiler c(v);
  const size_t row = static_cast<size_t>(v->vocab_size() + 31) / 32;
  GrammarMatcher m(c.compile(kArgs[0]));
  ASSERT_TRUE(m.accept_bytes("{"));
  const std::string draft_text = "\"a\":12q";  // 'q' is rejected: rows stop after it
  std::vector<int32_t> draft(draft_text.begin(), draft_text.end());
  std::vector<int32_t> words((draft.size() + 1) * row, -1);
  const int32_t rows = m.fill_draft_bitmasks(draft, words, row);
  EXPECT_EQ(rows, 7);  // 6 accepted draft tokens + the row after them
  EXPECT_EQ(m.num_accepted(), 1);  // unchanged
  GrammarMatcher step = m.clone();
  std::vector<int32_t> want(row);
  for (int32_t k = 0; k < rows; ++k) {
    step.fill_next_token_bitmask(want);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), words.begin() + k * row)) << "row " << k;
    if (k + 1 < rows) { ASSERT_TRUE(step.accept_token(draft[k])); }
  }
  EXPECT_FALSE(step.accept_token('q'));
}

// Jobs with drafts (the engine's speculative steps) on the workers: each job's rows equal its
// matcher's own fill_draft_bitmasks, `filled` says how many, the matchers are unchanged.
TEST(Workers, DraftJobsEqualSequential) {
  auto v = byte_vocab();
  GrammarCompiler c(v);
  StructuredWorkers w(2);
  const size_t row = static_cast<size_t>(v->vocab_size() + 31) / 32;
  const char* prefixes[] = {"{", "a", "[", "("};
  const char* drafts[] = {"\"a\":12q", "bc", "true,fal", "((z"};
  std::vector<GrammarMatcher> ms;
  std::vector<std::vector<int32_t>> ds;
  for (int rep = 0; rep < 3; ++rep)
    for (int i = 0; i < 4; ++i) {
      ms.emplace_back(c.compile(kArgs[i]));
      ASSERT_TRUE(ms.back().accept_bytes(prefixes[i]));
      const std::string d = rep == 0 ? "" : std::string(drafts[i]).substr(0, size_t(rep) * 3);
      ds.emplace_back(d.begin(), d.end());
    }
  std::vector<std::vector<int32_t>> words(ms.size()), ref(ms.size());
  std::vector<MaskJob> jobs;
  for (size_t i = 0; i < ms.size(); ++i) {
    words[i].assign((ds[i].size() + 1) * row, -1);
    ref[i].assign((ds[i].size() + 1) * row, -1);
    jobs.push_back({&ms[i], ds[i], words[i], row, 0});
  }
  w.fill_bitmasks(jobs);
  for (size_t i = 0; i < ms.size(); ++i) {
    const int32_t n = ds[i].empty() ? (ms[i].fill_next_token_bitmask(std::span<int32_t>(ref[i]).first(row)), 1)
                                    : ms[i].fill_draft_bitmasks(ds[i], ref[i], row);
    EXPECT_EQ(jobs[i].filled, n) << "job " << i;
    EXPECT_TRUE(std::equal(ref[i].begin(), ref[i].begin() + long(size_t(n) * row), words[i].begin())) << "job " << i;
    EXPECT_EQ(ms[i].num_accepted(), 1) << "job " << i << " moved its matcher";
  }
  ASSERT_FALSE(ds[5].empty());
  std::vector<MaskJob> small = {{&ms[5], ds[5], std::span<int32_t>(words[5]).first(row), row, 0}};
  EXPECT_THROW(w.fill_bitmasks(small), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::structured::test
