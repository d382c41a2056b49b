// The fast mask walk (mask_walk.cpp) against its plain reference walk on every automaton state,
// over random vocabularies: counted text (maxLength strings, {m,n} repeats, with and without
// multi-byte characters), keys under additionalProperties, and subtrees deeper or shallower
// than the counter's remaining length. Also the vocabulary's per-node subtree heights.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "structured/compiled.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

std::vector<int32_t> accepted_of(const StateMaskCache& c) {
  std::vector<int32_t> out = c.accepted_ids;
  for (size_t w = 0; w < c.accepted_bits.size(); ++w)
    for (int b = 0; b < 32; ++b)
      if (c.accepted_bits[w] >> b & 1) out.push_back(static_cast<int32_t>(w * 32 + b));
  std::sort(out.begin(), out.end());
  return out;
}

// All single bytes (so every text is reachable) plus `extra` random tokens of 2..max_len
// bytes drawn from an alphabet of JSON punctuation, letters, digits and UTF-8 pieces (whole
// characters and stray lead/continuation bytes).
std::shared_ptr<const TokenVocabulary> random_vocab(uint32_t seed, int extra, int max_len) {
  std::mt19937 rng(seed);
  const std::vector<std::string> pieces = {"a", "b", "z", "A", "0", "7", " ", "\"", ":", ",", "{", "}", "[", "]",
                                           "\\", "n", "u", "-", ".", "e", "é", "中", "😀", "\xC3", "\xA9", "\xF0\x9F"};
  TokenizerInfo info;
  for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  std::uniform_int_distribution<int> len(2, max_len), pick(0, static_cast<int>(pieces.size()) - 1);
  // Mostly plain text (long runs of letters) so that whole subtrees qualify for skipping.
  std::uniform_int_distribution<int> coin(0, 3);
  for (int k = 0; k < extra; ++k) {
    std::string t;
    const int n = len(rng);
    while (static_cast<int>(t.size()) < n) t += coin(rng) ? pieces[pick(rng) % 3] : pieces[pick(rng)];
    info.token_bytes.push_back(t);
  }
  std::sort(info.token_bytes.begin() + 256, info.token_bytes.end());
  info.token_bytes.erase(std::unique(info.token_bytes.begin() + 256, info.token_bytes.end()), info.token_bytes.end());
  info.token_bytes.push_back("<eos>");
  info.stop_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
  return make_vocabulary(info);
}

void expect_fast_equals_reference(const std::shared_ptr<const TokenVocabulary>& v, const std::string& args) {
  GrammarCompiler c(v);
  auto g = c.compile_uncached(args);
  const CompiledGrammarImpl& impl = g->impl();
  for (int32_t s = 0; s < static_cast<int32_t>(impl.pda.num_states()); ++s) {
    auto fast = impl.compute_state_cache(s);
    auto ref = impl.compute_state_cache_reference(s);
    ASSERT_EQ(accepted_of(*fast), accepted_of(*ref)) << args << " state " << s;
    ASSERT_EQ(fast->uncertain, ref->uncertain) << args << " state " << s;
    // Uncertain ranks: non-empty ranges, increasing, never adjacent (merged), in range.
    for (size_t j = 0; j < fast->uncertain.size(); ++j) {
      const RankRange& r = fast->uncertain[j];
      ASSERT_LT(r.lo, r.hi) << args << " state " << s << " range " << j;
      ASSERT_GE(r.lo, j == 0 ? 0 : fast->uncertain[j - 1].hi + 1) << args << " state " << s << " range " << j;
      ASSERT_LE(r.hi, static_cast<int32_t>(v->tok_ids_.size())) << args << " state " << s << " range " << j;
    }
  }
}

const char* const kGrammars[] = {
    R"({"json_schema": {"type": "string", "maxLength": 5}})",
    R"({"json_schema": {"type": "string", "minLength": 3, "maxLength": 30}})",
    R"({"json_schema": {"type": "object", "properties": {"info": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}}, "required": ["n"]}})",
    R"({"json_schema": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 200}}, "additionalProperties": {"type": "string", "minLength": 2}}})",
    R"({"json_schema": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 4}})",
    R"({"regex": "[a-z]{2,9}x"})",
    R"({"regex": "(é|[a-c]){0,7}!"})",
    R"({"regex": "[^\"]{4,40}\"(ab|b){1,3}"})",
    R"({"regex": "[0-9]{3,5}(\\.[0-9]{1,20})?"})",
    R"({"json_schema": {"type": "array", "items": {"type": "number"}}})",
    R"({"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}, "m": {"type": "number"}, "s": {"type": "string"}}}})",
    R"({"json_object": true})",
    // Searched patterns (minimised string DFAs, text that keeps every state alive) alone, with
    // a length bound and inside an object.
    R"({"json_schema": {"type": "string", "pattern": "ab"}})",
    R"({"json_schema": {"type": "string", "pattern": "[0-9a]+", "minLength": 4, "maxLength": 6}})",
    R"({"json_schema": {"type": "object", "properties": {"k": {"type": "string", "pattern": "z|b0"}, "e": {"type": "string", "pattern": "^a.*é$"}}}})",
    // Searched patterns that text can break (a second match dies, a pattern not allowed):
    // alive only for some bytes (text_death), in a called string and at the root.
    R"({"json_schema": {"type": "string", "oneOf": [{"pattern": "ab"}, {"pattern": "z7"}, {"pattern": "bb"}]}})",
    R"({"json_schema": {"type": "array", "items": {"type": "string", "oneOf": [{"pattern": "aaz"}, {"pattern": "a0"}]}}})",
    R"({"json_schema": {"type": "object", "properties": {"s": {"type": "string", "not": {"pattern": "zaz"}}}}})",
    // Counters over a character class (no quote, no multi-byte text): minLength = maxLength.
    R"({"json_schema": {"type": "string", "pattern": "^[ab0-9 ]+$", "minLength": 6, "maxLength": 6}})",
    R"({"json_schema": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[ -z]+$", "minLength": 9, "maxLength": 9}}}})",
    // Every ASCII text byte counted but no multi-byte character: not the all-text counter.
    R"({"json_schema": {"type": "string", "pattern": "^[ -\u007f]{2,9}$"}})",
    R"({"regex": "[ -\\x7f]{0,5}"})",
    // Counted strings past the direct bound (256): called blocks of 128 characters.
    R"({"json_schema": {"type": "string", "minLength": 140, "maxLength": 300}})",
    R"({"json_schema": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 1000}}}})",
};

TEST(MaskWalkRandom, FastEqualsReferenceOnCountedText) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    auto v = random_vocab(seed, 400, seed == 3 ? 48 : 12);
    for (const char* args : kGrammars) expect_fast_equals_reference(v, args);
  }
}

// height_[i] is the longest path below node i (checked against the tokens directly).
TEST(MaskWalkRandom, SubtreeHeights) {
  auto v = random_vocab(7, 300, 20);
  for (size_t i = 0; i < v->num_nodes(); ++i) {
    int32_t h = 0;
    for (int32_t j = static_cast<int32_t>(i) + 1; j < v->end_[i]; ++j) h = std::max(h, v->depth_[j] - v->depth_[i]);
    ASSERT_EQ(v->height_[i], h) << "node " << i;
  }
}

// Strict UTF-8 check of JSON string text (a truncated last character allowed), by brute force.
bool json_text(const std::string& s) {
  for (size_t k = 0; k < s.size();) {
    const uint8_t b = static_cast<uint8_t>(s[k]);
    if (b < 0x80) {
      if (b < 0x20 || b == '"' || b == '\\') return false;
      ++k;
      continue;
    }
    int n = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (!n) return false;
    uint8_t lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
    for (int j = 1; j < n; ++j) {
      if (k + j >= s.size()) return true;  // truncated at the end
      const uint8_t c = static_cast<uint8_t>(s[k + j]);
      if (j == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return false;
    }
    k += n;
  }
  return true;
}

// parent_: the node one byte up, whose subtree holds the node (walk_ranks climbs it to skip
// every token sharing a dead prefix).
TEST(MaskWalkRandom, Parents) {
  auto v = random_vocab(13, 500, 10);
  ASSERT_EQ(v->parent_.size(), v->num_nodes());
  ASSERT_EQ(v->parent_[0], -1);
  for (size_t i = 1; i < v->num_nodes(); ++i) {
    const int32_t p = v->parent_[i];
    ASSERT_GE(p, 0) << "node " << i;
    ASSERT_LT(p, static_cast<int32_t>(i)) << "node " << i;
    ASSERT_EQ(v->depth_[p] + 1, v->depth_[i]) << "node " << i;
    ASSERT_GE(v->end_[p], v->end_[i]) << "node " << i;
  }
}

// text_run_end_ / text_run_height_ against the tokens: a node is text when every token below
// it is JSON string text from the node's byte on; runs are maximal among consecutive siblings.
TEST(MaskWalkRandom, TextRuns) {
  auto v = random_vocab(9, 500, 10);
  const size_t n = v->num_nodes();
  std::vector<std::string> path(n);  // bytes from the root to node i
  std::vector<int32_t> at(v->max_depth_ + 1, 0);
  for (size_t i = 1; i < n; ++i) {
    path[i] = path[at[v->depth_[i] - 1]] + static_cast<char>(v->byte_[i]);
    at[v->depth_[i]] = static_cast<int32_t>(i);
  }
  auto is_text = [&](size_t i) {
    for (size_t j = i; j < static_cast<size_t>(v->end_[i]); ++j)
      if (!json_text(path[j].substr(v->depth_[i] - 1))) return false;
    return true;
  };
  for (size_t i = 1; i < n; ++i) {
    int32_t want_end = static_cast<int32_t>(i), want_h = 0;
    for (size_t k = i; k < n && v->depth_[k] == v->depth_[i] && is_text(k); k = v->end_[k]) {
      want_end = v->end_[k];
      want_h = std::max(want_h, v->height_[k] + 1);
      if (k != i && k > i && v->depth_[k] < v->depth_[i]) break;
    }
    ASSERT_EQ(v->text_run_end_[i], want_end) << "node " << i << " '" << path[i] << "'";
    if (want_end > static_cast<int32_t>(i)) { ASSERT_EQ(v->text_run_height_[i], want_h) << "node " << i; }
  }
}

// Masks agree with accept_token on random walks through counted strings (the runtime path:
// shared cache, uncertain tokens re-walked with the real stack).
TEST(MaskWalkRandom, MasksMatchAcceptToken) {
  auto v = random_vocab(11, 400, 16);
  GrammarCompiler c(v);
  std::mt19937 rng(5);
  const int32_t vs = vocabulary_size(*v);
  std::vector<int32_t> words((vs + 31) / 32);
  for (const char* args : kGrammars) {
    auto g = c.compile(args);
    for (int rep = 0; rep < 5; ++rep) {
      GrammarMatcher m(g);
      for (int step = 0; step < 30 && !m.is_terminated(); ++step) {
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

namespace deepinfer::structured::test {
namespace {

// Counted strings past the direct bound (256) are called 128-character blocks (counted_repeat): at a
// block's end nearly every token is uncertain and re-walked with the real stack, where the
// text chain (matcher.cpp) accepts whole runs of text siblings. Masks must still equal
// accept_token at every position, across block ends and up to the maximum length.
TEST(MaskWalkRandom, MasksMatchAcceptTokenAcrossBlocks) {
  const char* const grammars[] = {
      R"({"json_schema": {"type": "string", "maxLength": 140}})",
      R"({"json_schema": {"type": "string", "minLength": 130, "maxLength": 200}})",
      R"({"json_schema": {"type": "string", "maxLength": 300}})",
      R"({"json_schema": {"type": "string", "minLength": 250, "maxLength": 400}})",
      R"({"json_schema": {"type": "object", "properties": {"k": {"oneOf": [{"type": "string", "maxLength": 32767, "minLength": 50}, {"type": "null"}]}}, "required": ["k"]}})",
      R"({"json_schema": {"type": "array", "items": {"type": "string", "maxLength": 1000}, "maxItems": 3}})",
  };
  for (uint32_t seed : {11u, 12u}) {
    auto v = random_vocab(seed, 400, seed == 12 ? 40 : 16);
    GrammarCompiler c(v);
    std::mt19937 rng(seed);
    const int32_t vs = vocabulary_size(*v);
    std::vector<int32_t> words((vs + 31) / 32);
    for (const char* args : grammars) {
      auto g = c.compile(args);
      for (int rep = 0; rep < 3; ++rep) {
        GrammarMatcher m(g);
        for (int step = 0; step < 200 && !m.is_terminated(); ++step) {
          m.fill_next_token_bitmask(words);
          std::vector<int32_t> allowed, text;
          for (int32_t t = 0; t < vs; ++t) {
            const bool bit = words[t >> 5] >> (t & 31) & 1;
            GrammarMatcher probe = m.clone();
            ASSERT_EQ(bit, probe.accept_token(t)) << args << " seed " << seed << " step " << step << " token " << t;
            if (!bit) continue;
            allowed.push_back(t);
            const std::string& b = v->bytes(t);
            if (b.find('"') == std::string::npos && b.find('\\') == std::string::npos) text.push_back(t);
          }
          if (allowed.empty()) break;
          // Mostly text, so the walk reaches block ends and the maximum length.
          const auto& pool = !text.empty() && rng() % 8 ? text : allowed;
          ASSERT_TRUE(m.accept_token(pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)]));
        }
      }
    }
  }
}

// The same over a vocabulary large enough (> 2,048 uncertain tokens at a block's end) for the
// re-walk's wide paths: every all-text token ORed in at once when the text chain holds for
// kMaxTextLe characters (vocab.h text_le_ids_), runs below multi-byte prefixes (é, 中, 😀 and
// truncated characters), plain text chain steps; and short walks of a few long tokens
// (>= 64 bytes), which now build a chain too. Every mask bit equals accept_token.
TEST(MaskWalkRandom, MasksMatchAcceptTokenAcrossBlocksWideVocabulary) {
  // > kMaxPairSteps all-text tokens, so a block end's pair walk gives up (as on a real
  // vocabulary) and the re-walk sees the state's whole uncertain set.
  auto v = random_vocab(31, 12000, 90);
  GrammarCompiler c(v);
  std::mt19937 rng(31);
  const int32_t vs = vocabulary_size(*v);
  std::vector<int32_t> words((vs + 31) / 32);
  const struct {
    const char* args;
    int reps;
  } cases[] = {
      // 44 characters after the second block's end: there the chain holds for fewer than
      // kMaxTextLe characters, so the all-text set must not be ORed in.
      {R"({"json_schema": {"type": "string", "maxLength": 300}})", 8},
      {R"({"json_schema": {"type": "object", "properties": {"k": {"oneOf": [{"type": "string", "maxLength": 32767, "minLength": 50}, {"type": "null"}]}}, "required": ["k"]}})", 1},
  };
  for (const auto& tc : cases) {
    auto g = c.compile(tc.args);
    for (int rep = 0; rep < tc.reps; ++rep) {
      GrammarMatcher m(g);
      for (int step = 0; step < 14 && !m.is_terminated(); ++step) {
        m.fill_next_token_bitmask(words);
        std::vector<int32_t> allowed, text;
        for (int32_t t = 0; t < vs; ++t) {
          const bool bit = words[t >> 5] >> (t & 31) & 1;
          GrammarMatcher probe = m.clone();
          ASSERT_EQ(bit, probe.accept_token(t)) << tc.args << " rep " << rep << " step " << step << " token " << t;
          if (!bit) continue;
          allowed.push_back(t);
          const std::string& b = v->bytes(t);
          if (b.find('"') == std::string::npos && b.find('\\') == std::string::npos) text.push_back(t);
        }
        if (allowed.empty()) break;
        const auto& pool = !text.empty() && rng() % 8 ? text : allowed;
        ASSERT_TRUE(m.accept_token(pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)]));
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::structured::test

namespace deepinfer::structured::test {
namespace {

// Counted strings alone, lengths 0..300 with random bounds on either side of the direct bound
// (256) and the 128-character blocks: "a"*L (and "é"*L) closes exactly when the bounds allow,
// and the fast walk equals the reference walk on every state of each grammar.
TEST(MaskWalkRandom, CountedStringLengthsAroundBlocks) {
  auto v = random_vocab(21, 200, 10);
  GrammarCompiler c(v);
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> len(0, 300);
  const int32_t quote = '"';
  for (int k = 0; k < 24; ++k) {
    int mn = len(rng), mx = len(rng);
    if (mn > mx) std::swap(mn, mx);
    if (k % 6 == 0) mn = 0;
    if (k % 6 == 1) mx = mn;
    if (k == 2) mn = 127, mx = 129;
    if (k == 3) mn = 255, mx = 257;
    std::string args = R"({"json_schema": {"type": "string", "minLength": )" + std::to_string(mn) +
                       (k % 5 == 4 ? std::string() : R"(, "maxLength": )" + std::to_string(mx)) + "}}";
    const bool open_max = k % 5 == 4;
    auto g = c.compile(args);
    for (const std::string& ch : std::vector<std::string>{"a", "é"}) {
      GrammarMatcher m(g);
      ASSERT_TRUE(m.accept_token(quote)) << args;
      for (int l = 0; l <= 300; ++l) {
        GrammarMatcher probe = m.clone();
        const bool want = l >= mn && (open_max || l <= mx);
        ASSERT_EQ(probe.accept_token(quote) && probe.can_terminate(), want) << args << " length " << l << " " << ch;
        bool ok = true;
        for (unsigned char b : ch) ok = ok && m.accept_token(b);
        ASSERT_EQ(ok, open_max || l + 1 <= mx) << args << " length " << l + 1 << " " << ch;
        if (!ok) break;
      }
    }
    if (k < 6) expect_fast_equals_reference(v, args);
  }
}

}  // namespace
}  // namespace deepinfer::structured::test
