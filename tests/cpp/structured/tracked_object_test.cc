// Objects with more declared properties than the grammar enumerates orders for: the matcher
// tracks the set of keys written (grammar.h, GrammarMark). Checked against a direct model of
// the schema (required keys, no duplicates, additionalProperties), for masks exactly equal to
// "the token leads somewhere a completion exists" on a multi-byte vocabulary, and for the
// fast mask walk equal to the reference walk on every state.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "structured/compiled.h"
#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

using json = nlohmann::ordered_json;

// 12 properties k0..k11 (k3 and k7 share prefixes with others), the even ones required.
json big_schema(bool additional) {
  json s = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
  const char* names[] = {"k0", "k1", "k10", "k11", "alpha", "alphabet", "b", "beta", "k2", "k3", "name", "nickname"};
  for (int i = 0; i < 12; ++i) {
    s["properties"][names[i]] = i % 3 == 0 ? json{{"type", "integer"}} : json{{"type", "string"}};
    if (i % 2 == 0) s["required"].push_back(names[i]);
  }
  if (!additional) s["additionalProperties"] = false;
  return s;
}

std::string args_of(const json& schema) { return json{{"json_schema", schema}}.dump(); }

// The object text for members (name, value text) in the given order.
std::string object_text(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out = "{";
  for (size_t i = 0; i < members.size(); ++i) out += (i ? "," : "") + json(members[i].first).dump() + ":" + members[i].second;
  return out + "}";
}

TEST(TrackedObject, AnyOrderExactlyTheValidObjects) {
  for (bool additional : {false, true}) {
    const json schema = big_schema(additional);
    GrammarCompiler c(byte_vocab());
    auto g = c.compile_uncached(args_of(schema));
    std::vector<std::string> names;
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) names.push_back(it.key());
    std::set<std::string> req;
    for (const auto& r : schema["required"]) req.insert(r.get<std::string>());
    std::mt19937 rng(7 + additional);
    int accepted = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<std::string> keys;
      for (const auto& n : names)
        if (req.count(n) || rng() % 2) keys.push_back(n);
      if (trial % 5 == 1 && !keys.empty()) keys.erase(keys.begin() + rng() % keys.size());  // maybe a required one
      if (trial % 7 == 2) keys.push_back(keys[rng() % keys.size()]);                       // a duplicate
      if (trial % 11 == 3) keys.push_back("zz_other");
      std::shuffle(keys.begin(), keys.end(), rng);
      std::vector<std::pair<std::string, std::string>> members;
      for (const auto& k : keys) {
        const bool integer = schema["properties"].contains(k) && schema["properties"][k]["type"] == "integer";
        members.push_back({k, integer ? "12" : "\"v\""});
      }
      std::set<std::string> uniq(keys.begin(), keys.end());
      bool valid = uniq.size() == keys.size();
      for (const auto& r : req) valid = valid && uniq.count(r);
      if (!additional && uniq.count("zz_other")) valid = false;
      const std::string text = object_text(members);
      EXPECT_EQ(matches(g, text), valid) << text;
      accepted += valid;
    }
    EXPECT_GT(accepted, 100);  // both outcomes are exercised
    EXPECT_FALSE(matches(g, "{}"));
  }
}

TEST(TrackedObject, NoRequiredAcceptsEmptyAndRejectsWrongValue) {
  json s = big_schema(false);
  s.erase("required");
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(args_of(s));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, R"({"nickname":"x","name":"y","k0":3})"));
  EXPECT_FALSE(matches(g, R"({"k0":"x"})"));       // k0 is an integer
  EXPECT_FALSE(matches(g, R"({"name":"x","name":"y"})"));
  EXPECT_FALSE(matches(g, R"({"nam":"x"})"));
}

// A vocabulary of all bytes plus multi-byte tokens that cross key, separator and value
// boundaries, as a BPE vocabulary's would.
std::shared_ptr<const TokenVocabulary> json_vocab() {
  TokenizerInfo info;
  for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"\"k", "\"k1", "\"k10\":", "\"name\"", "\"nickname\":\"", "\":", "\",\"", ",\"", "\"}", "},",
                        "12,", "12}", "\"alpha", "bet\"", "beta\":", "{\"", "\"v\"", "\"v\",\"", "\"v\"}", "\"zz",
                        "\"b\":", ":\"", "1,\"k"})
    info.token_bytes.push_back(t);
  info.token_bytes.push_back("<eos>");
  info.stop_ids = {static_cast<int32_t>(info.token_bytes.size() - 1)};
  return make_vocabulary(info);
}

// Along random walks, the token mask equals the tokens after which the byte-level matcher
// (whose masks allow exactly the bytes with a completion, by the same argument inductively)
// is alive: never a token into a dead end, never a token missing.
TEST(TrackedObject, MasksAllowExactlyTheLiveTokens) {
  auto v = json_vocab();
  for (bool additional : {false, true}) {
    const std::string args = args_of(big_schema(additional));
    GrammarCompiler ct(v), cb(byte_vocab());
    auto gt = ct.compile_uncached(args), gb = cb.compile_uncached(args);
    const int32_t vs = v->vocab_size();
    std::vector<int32_t> words((vs + 31) / 32), bwords((257 + 31) / 32);
    std::mt19937 rng(11 + additional);
    for (int walk = 0; walk < 8; ++walk) {
      GrammarMatcher mt(gt), mb(gb);
      for (int step = 0; step < 120 && !mt.is_terminated(); ++step) {
        mt.fill_next_token_bitmask(words);
        std::vector<int32_t> allowed;
        for (int32_t t = 0; t < vs; ++t) {
          const bool in_mask = words[t >> 5] >> (t & 31) & 1;
          bool live;
          if (v->is_stop(t)) {
            live = mb.can_terminate();
          } else {
            GrammarMatcher probe = mb.clone();
            live = probe.accept_bytes(v->bytes(t));
            if (live && !probe.can_terminate()) {
              probe.fill_next_token_bitmask(bwords);
              live = std::any_of(bwords.begin(), bwords.end(), [](int32_t w) { return w != 0; });
            }
          }
          ASSERT_EQ(in_mask, live) << "walk " << walk << " step " << step << " token '" << v->bytes(t) << "'";
          if (in_mask) allowed.push_back(t);
        }
        ASSERT_FALSE(allowed.empty()) << "dead end at walk " << walk << " step " << step;
        // Prefer multi-byte tokens and avoid stopping early, so walks get deep into objects.
        std::vector<int32_t> multi;
        for (int32_t t : allowed)
          if (t >= 256 && !v->is_stop(t)) multi.push_back(t);
        const auto& pool = !multi.empty() && rng() % 2 ? multi : allowed;
        int32_t t = pool[rng() % pool.size()];
        if (v->is_stop(t) && allowed.size() > 1 && step < 100) t = allowed[(rng() % (allowed.size() - 1))];
        ASSERT_TRUE(mt.accept_token(t));
        if (v->is_stop(t)) {
          ASSERT_TRUE(mb.accept_token(256));
        } else {
          ASSERT_TRUE(mb.accept_bytes(v->bytes(t)));
        }
      }
    }
  }
}

TEST(TrackedObject, FastWalkEqualsReference) {
  auto v = json_vocab();
  for (bool additional : {false, true}) {
    GrammarCompiler c(v);
    auto g = c.compile_uncached(args_of(big_schema(additional)));
    const CompiledGrammarImpl& impl = g->impl();
    ASSERT_FALSE(impl.pda.guards.empty());
    for (int32_t s = 0; s < static_cast<int32_t>(impl.pda.num_states()); ++s) {
      auto fast = impl.compute_state_cache(s);
      auto ref = impl.compute_state_cache_reference(s);
      std::vector<int32_t> fa = fast->accepted_ids, ra = ref->accepted_ids;
      for (const auto* c2 : {fast.get(), ref.get()}) {
        auto& out = c2 == fast.get() ? fa : ra;
        for (size_t w = 0; w < c2->accepted_bits.size(); ++w)
          for (int b = 0; b < 32; ++b)
            if (c2->accepted_bits[w] >> b & 1) out.push_back(static_cast<int32_t>(w * 32 + b));
        std::sort(out.begin(), out.end());
      }
      ASSERT_EQ(fa, ra) << "state " << s;
      ASSERT_EQ(fast->uncertain, ref->uncertain) << "state " << s;
    }
  }
}

// 300 properties, all required: compiles small and fast (no orders enumerated), accepts a
// reversed order, rejects one key missing.
TEST(TrackedObject, ThreeHundredKeysCompileSmall) {
  json s = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()},
            {"additionalProperties", false}};
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 300; ++i) {
    const std::string k = "field_" + std::to_string(i);
    s["properties"][k] = {{"type", "integer"}};
    s["required"].push_back(k);
    members.push_back({k, std::to_string(i)});
  }
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(args_of(s));
  EXPECT_LT(g->num_states(), 20000);
  std::reverse(members.begin(), members.end());
  EXPECT_TRUE(matches(g, object_text(members)));
  members.pop_back();
  EXPECT_FALSE(matches(g, object_text(members)));
}

}  // namespace
}  // namespace deepinfer::structured::test

namespace deepinfer::structured::test {
namespace {

// uniqueItems over a finite set of scalars: every order, no value twice, exact; masks never
// allow a repeated value (its last byte) or a separator when every value is written.
TEST(TrackedObject, UniqueItemsOfScalars) {
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(
      R"({"json_schema": {"type": "array", "uniqueItems": true, "items": {"enum": ["a", "ab", "b", true, null]}}})");
  for (const char* ok : {"[]", R"(["ab","a"])", R"([null,true,"b","ab","a"])", R"(["b"])"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"(["a","a"])", R"([true,null,true])", R"(["c"])", R"([false])", R"(["a","b","a"])"})
    EXPECT_FALSE(matches(g, bad)) << bad;
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes(R"(["a",)"));
  std::vector<int32_t> w(9);
  m.fill_next_token_bitmask(w);
  EXPECT_TRUE(w['"' >> 5] >> ('"' & 31) & 1);  // "ab" or "b" may follow
  ASSERT_TRUE(m.accept_bytes("\"a"));
  m.fill_next_token_bitmask(w);
  EXPECT_FALSE(w['"' >> 5] >> ('"' & 31) & 1);  // "a" again: not allowed
  EXPECT_TRUE(w['b' >> 5] >> ('b' & 31) & 1);
  // Booleans; minItems 1; a limiting maxItems is still an error (needs a count).
  auto bools = c.compile_uncached(R"({"json_schema": {"type": "array", "uniqueItems": true, "minItems": 1, "items": {"type": "boolean"}}})");
  EXPECT_TRUE(matches(bools, "[false,true]"));
  EXPECT_FALSE(matches(bools, "[]"));
  EXPECT_FALSE(matches(bools, "[true,true]"));
  EXPECT_THROW(c.compile_uncached(R"({"json_schema": {"uniqueItems": true, "maxItems": 2, "items": {"enum": ["a", "b", "c"]}}})"),
               GrammarError);
  EXPECT_TRUE(matches(c.compile_uncached(R"({"json_schema": {"uniqueItems": true, "maxItems": 1}})"), "[[1,2]]"));
}

}  // namespace
}  // namespace deepinfer::structured::test
