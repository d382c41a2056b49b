// DeepInfer's so_args spellings: {"schema_type", "schema"}, and trigger_token_ids /
// bound_token_id (free tokens until the trigger has appeared, the rest of the trigger forced
// once the bound token is generated, then the grammar), through masks, accept, rollback.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "structured/vocab.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

// Bytes 0..255, then <think> (256), </think> (257), <x> (258), <eos> (259, stop).
constexpr int32_t kThink = 256, kEndThink = 257, kX = 258, kEos = 259;
std::shared_ptr<const TokenVocabulary> vocab() {
  TokenizerInfo info;
  for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"<think>", "</think>", "<x>", "<eos>"}) info.token_bytes.push_back(t);
  info.stop_ids = {kEos};
  info.special_ids = {kThink, kEndThink, kX};
  return make_vocabulary(info);
}

std::vector<int32_t> allowed(GrammarMatcher& m) {
  std::vector<int32_t> w(9), out;
  m.fill_next_token_bitmask(w);
  for (int32_t t = 0; t < 260; ++t)
    if (w[t >> 5] >> (t & 31) & 1) out.push_back(t);
  return out;
}

TEST(Trigger, FreeUntilTriggerThenGrammar) {
  GrammarCompiler c(vocab());
  auto g = c.compile(R"({"schema_type": "regex", "schema": "a+", "trigger_token_ids": [257]})");
  GrammarMatcher m(g);
  EXPECT_EQ(allowed(m).size(), 260u);  // free: every token, specials and stop included
  EXPECT_TRUE(m.can_terminate());
  for (int32_t t : std::vector<int32_t>{'x', kThink, 'y', 'a', kX}) EXPECT_TRUE(m.accept_token(t));
  EXPECT_TRUE(m.accept_token(kEndThink));
  EXPECT_EQ(allowed(m), std::vector<int32_t>{'a'});
  EXPECT_FALSE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token('a'));
  EXPECT_EQ(allowed(m), (std::vector<int32_t>{'a', kEos}));
  EXPECT_TRUE(m.accept_token(kEos));
  EXPECT_TRUE(m.is_terminated());
  // Rollback across the trigger restores the free phase.
  m.rollback(3);
  EXPECT_EQ(allowed(m).size(), 260u);
  EXPECT_TRUE(m.accept_token('z'));
}

TEST(Trigger, MultiTokenTriggerMatchesOverlaps) {
  GrammarCompiler c(vocab());
  // Trigger "<x> <x> </think>" found inside "<x> <x> <x> </think>" (KMP keeps the overlap).
  auto g = c.compile(R"({"regex": "b", "trigger_token_ids": [258, 258, 257]})");
  GrammarMatcher m(g);
  for (int32_t t : {kX, kX, kX}) EXPECT_TRUE(m.accept_token(t));
  EXPECT_EQ(allowed(m).size(), 260u);
  EXPECT_TRUE(m.accept_token(kEndThink));
  EXPECT_EQ(allowed(m), std::vector<int32_t>{'b'});
}

TEST(Trigger, BoundForcesTheRestOfTheTrigger) {
  GrammarCompiler c(vocab());
  auto g = c.compile(R"({"schema_type": "json", "schema": {"type": "boolean"},
                         "trigger_token_ids": [258, 257], "bound_token_id": 256})");
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_token('q'));
  EXPECT_TRUE(m.accept_token(kThink));  // the bound: from now on the trigger is forced
  EXPECT_EQ(allowed(m), std::vector<int32_t>{kX});
  EXPECT_FALSE(m.can_terminate());
  EXPECT_FALSE(m.accept_token('q'));
  EXPECT_EQ(m.forced_tokens(2), (std::vector<int32_t>{kX, kEndThink}));
  EXPECT_TRUE(m.accept_token(kX));
  EXPECT_EQ(allowed(m), std::vector<int32_t>{kEndThink});
  EXPECT_TRUE(m.accept_token(kEndThink));
  EXPECT_EQ(allowed(m), (std::vector<int32_t>{'f', 't'}));
  // A partly matched trigger continues from where it was when the bound comes.
  GrammarMatcher m2(g);
  EXPECT_TRUE(m2.accept_token(kX));
  EXPECT_TRUE(m2.accept_token(kThink));  // resets the match (kThink is not the trigger's 2nd)
  EXPECT_EQ(allowed(m2), std::vector<int32_t>{kX});
}

TEST(Trigger, SchemaTypeSpellingsAndErrors) {
  GrammarCompiler c(vocab());
  EXPECT_TRUE(matches(c.compile(R"({"schema_type": "ebnf", "schema": "root ::= \"hi\""})"), "hi"));
  EXPECT_TRUE(matches(c.compile(R"({"schema_type": "json", "schema": "{\"type\": \"integer\"}"})"), "12"));
  for (const char* bad : {R"({"schema_type": "xml", "schema": "a"})", R"({"schema_type": "regex"})",
                          R"({"regex": "a", "bound_token_id": 5})", R"({"regex": "a", "trigger_token_ids": [1], "bound_token_ids": [2]})",
                          R"({"regex": "a", "trigger_token_ids": [999]})", R"({"regex": "a", "trigger_token_ids": 3})",
                          R"({"regex": "a", "trigger_token_ids": [1], "bound_token_id": -1})"})
    EXPECT_THROW(c.compile(bad), InvalidArgument) << bad;
}

}  // namespace
}  // namespace deepinfer::structured::test
