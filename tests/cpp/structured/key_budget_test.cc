// The per-byte token budget behind the shared mask-cache keys (vocab.cpp after_byte_,
// mask_cache.cpp shared_key): the bound is sound on random vocabularies, and grammars that
// differ only past the bytes a token can reach after a quote share mask entries while every
// mask bit still equals accept_token.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "structured/compiled.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

// All single bytes plus `extra` random tokens of 2..max_len bytes; the quote only ever
// starts a short punctuation token, so after_byte_['"'] is small.
std::shared_ptr<const TokenVocabulary> budget_vocab(uint32_t seed, int extra, int max_len, TokenizerInfo* out) {
  std::mt19937 rng(seed);
  const std::vector<std::string> pieces = {"a", "b", "k", "e", "y", "0", "7", " ", ":", "-", "."};
  TokenizerInfo info;
  for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  std::uniform_int_distribution<int> len(2, max_len), pick(0, static_cast<int>(pieces.size()) - 1);
  for (int k = 0; k < extra; ++k) {
    std::string t;
    const int n = len(rng);
    while (static_cast<int>(t.size()) < n) t += pieces[pick(rng)];
    info.token_bytes.push_back(t);
  }
  for (const char* p : {"\",", "\":", "\",\"", "\"}", "{\"", ",\""}) info.token_bytes.push_back(p);
  std::sort(info.token_bytes.begin() + 256, info.token_bytes.end());
  info.token_bytes.erase(std::unique(info.token_bytes.begin() + 256, info.token_bytes.end()), info.token_bytes.end());
  info.token_bytes.push_back("<eos>");
  info.stop_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
  *out = info;
  return make_vocabulary(info);
}

TEST(KeyBudget, AfterByteBoundsEveryToken) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    TokenizerInfo info;
    auto v = budget_vocab(seed, 300, 6 + 4 * static_cast<int>(seed), &info);
    std::array<int32_t, 256> need;
    need.fill(-1);
    for (size_t t = 0; t + 1 < info.token_bytes.size(); ++t) {
      const std::string& s = info.token_bytes[t];
      for (size_t i = 0; i < s.size(); ++i) {
        const int b = static_cast<uint8_t>(s[i]);
        need[b] = std::max(need[b], static_cast<int32_t>(s.size() - i - 1));
      }
    }
    for (int b = 0; b < 256; ++b) EXPECT_GE(v->after_byte_[b], need[b]) << "byte " << b << " seed " << seed;
    EXPECT_LE(v->after_byte_['"'], 3) << "seed " << seed;
  }
}

// Objects whose keys differ only after a few bytes: their value states see the same few bytes
// past the closing quote and share entries; the masks must stay exact.
TEST(KeyBudget, SharedEntriesKeepMasksExact) {
  TokenizerInfo info;
  auto v = budget_vocab(9, 400, 12, &info);
  GrammarCompiler c(v);
  const int32_t vs = vocabulary_size(*v);
  std::vector<int32_t> words((vs + 31) / 32);
  std::mt19937 rng(3);
  for (const char* args :
       {R"({"json_schema": {"type": "object", "properties": {"a": {"type": "string"}, "bkey": {"type": "integer"}}, "required": ["a", "bkey"], "additionalProperties": false}})",
        R"({"json_schema": {"type": "object", "properties": {"a": {"type": "string"}, "bkye": {"type": "integer"}}, "required": ["a", "bkye"], "additionalProperties": false}})",
        R"({"json_schema": {"type": "object", "properties": {"a": {"type": "string"}, "byyy7": {"type": "number"}}, "required": ["a"], "additionalProperties": false}})",
        R"({"json_schema": {"type": "array", "items": {"type": "string", "maxLength": 5}}})"}) {
    auto g = c.compile(args);
    for (int rep = 0; rep < 4; ++rep) {
      GrammarMatcher m(g);
      for (int step = 0; step < 25 && !m.is_terminated(); ++step) {
        m.fill_next_token_bitmask(words);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vs; ++t) {
          const bool bit = words[t >> 5] >> (t & 31) & 1;
          GrammarMatcher probe = m.clone();
          ASSERT_EQ(bit, probe.accept_token(t)) << args << " step " << step << " token " << t;
          if (bit) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        ASSERT_TRUE(m.accept_token(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]));
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::structured::test
