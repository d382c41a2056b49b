// Special tokens as grammar terminals (`<[id]>` in GBNF and Lark, TokenizerInfo::terminal_ids):
// allowed exactly where the grammar names them, never spelled by text, never allowed elsewhere;
// Lark's %json embeds a JSON schema. The server's forced tool calls are built on both.
#include <gtest/gtest.h>

#include <vector>

#include "deepinfer/error.h"
#include "deepinfer/structured.h"
#include "structured/vocab.h"

namespace deepinfer::structured {
namespace {

// Bytes 0..255, stop 256, special 257 ("|S|", offered as a terminal), special 258 ("|Q|", not
// offered), token 259 "ab" (a normal multi-byte token).
std::shared_ptr<const TokenVocabulary> vocab_with_terminals() {
  TokenizerInfo info = byte_level_tokenizer_info();
  info.token_bytes.resize(260);
  info.token_bytes[257] = "|S|";
  info.token_bytes[258] = "|Q|";
  info.token_bytes[259] = "ab";
  info.special_ids = {257, 258};
  info.terminal_ids = {257};
  return make_vocabulary(info);
}

bool allowed(GrammarMatcher& m, int32_t id) {
  std::vector<int32_t> words(size_t(260 + 31) / 32, 0);
  m.fill_next_token_bitmask(words);
  return (uint32_t(words[size_t(id) / 32]) >> (id % 32)) & 1u;
}

TEST(SpecialTerminal, AllowedExactlyWhereNamed) {
  GrammarCompiler c(vocab_with_terminals());
  auto g = c.compile(R"({"ebnf": "root ::= \"a\" <[257]> \"b\"+"})");
  GrammarMatcher m(g);
  EXPECT_FALSE(allowed(m, 257));  // not before "a"
  ASSERT_TRUE(m.accept_token('a'));
  EXPECT_TRUE(allowed(m, 257));
  EXPECT_FALSE(allowed(m, 258));  // a special token the vocabulary does not offer
  EXPECT_FALSE(allowed(m, '|'));  // the token's text does not spell it
  EXPECT_FALSE(m.accept_bytes("|S|"));
  ASSERT_TRUE(m.accept_token(257));
  EXPECT_FALSE(m.can_terminate());
  ASSERT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_FALSE(allowed(m, 257));
  EXPECT_TRUE(m.accept_token(256));  // stop
}

TEST(SpecialTerminal, ByteFFTokensNeverAllowedOnceTerminalsExist) {
  GrammarCompiler c(vocab_with_terminals());
  auto g = c.compile(R"({"regex": "[\\s\\S]*"})");
  GrammarMatcher m(g);
  EXPECT_TRUE(allowed(m, 'x'));
  EXPECT_TRUE(allowed(m, 259));
  EXPECT_FALSE(allowed(m, 0xFF));  // would spell a terminal's inner bytes
  EXPECT_FALSE(allowed(m, 257));   // a terminal only where a grammar names it
}

TEST(SpecialTerminal, LarkTerminalAndJsonSchema) {
  GrammarCompiler c(vocab_with_terminals());
  auto g = c.compile(R"({"ebnf": "start: \"x\" <[257]> %json {\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"]}"})");
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_token('x'));
  ASSERT_TRUE(m.accept_token(257));
  EXPECT_FALSE(m.accept_bytes("{\"n\":\"s\""));
  ASSERT_TRUE(m.accept_bytes("{\"n\":-17}"));
  EXPECT_TRUE(m.can_terminate());
  GrammarMatcher m2(g);
  ASSERT_TRUE(m2.accept_token('x'));
  ASSERT_TRUE(m2.accept_token(257));
  EXPECT_FALSE(m2.accept_bytes("{}x"));  // "n" is required
}

TEST(SpecialTerminal, TypedErrors) {
  GrammarCompiler c(vocab_with_terminals());
  auto error_of = [&](const std::string& so) {
    try {
      c.compile(so);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of(R"({"ebnf": "root ::= <[258]>"})");
  EXPECT_NE(e.find("<[258]>"), std::string::npos) << e;
  e = error_of(R"({"ebnf": "root ::= \"a\" <[x]>"})");
  EXPECT_NE(e.find("special token"), std::string::npos) << e;
  e = error_of(R"({"ebnf": "root ::= <[99999999999]>"})");
  EXPECT_FALSE(e.empty());
  e = error_of(R"({"ebnf": "start: %json {\"type\": "})");
  EXPECT_NE(e.find("%json"), std::string::npos) << e;
  // A byte vocabulary without terminals refuses any <[id]>.
  GrammarCompiler plain(make_vocabulary(byte_level_tokenizer_info()));
  try {
    plain.compile(R"({"ebnf": "root ::= <[5]>"})");
    ADD_FAILURE() << "compiled a terminal the vocabulary does not offer";
  } catch (const GrammarError& err) {
    EXPECT_NE(std::string(err.what()).find("terminal"), std::string::npos) << err.what();
  }
}

TEST(SpecialTerminal, VocabularyChecksTerminalIds) {
  TokenizerInfo info = byte_level_tokenizer_info();
  info.terminal_ids = {256};  // the stop token
  EXPECT_THROW(make_vocabulary(info), InvalidArgument);
  info.terminal_ids = {9999};
  EXPECT_THROW(make_vocabulary(info), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::structured
