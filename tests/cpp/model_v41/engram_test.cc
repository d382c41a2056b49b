// Engram hashing (model/deepseek_v41/engram.h): the spec's primes, the reference's row ids
// (tests/data/golden/v41_engram, from transformers' DeepseekV41NgramHashState) fed whole, in chunks
// and after a history restore, a direct implementation of the hash on random streams with DEAD
// tokens and ids past the tokenizer, and the sidecar's checks.
#include "model/deepseek_v41/engram.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "deepinfer/error.h"
#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using json = nlohmann::json;
using v41_test::error_of;
using v41_test::golden;

template <typename T>
std::vector<T> read_raw(const std::filesystem::path& p) {
  const std::string s = v41_test::read_text(p);
  std::vector<T> v(s.size() / sizeof(T));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(T));
  return v;
}

EngramConfig release_engram() {
  return DeepseekV41Config::from_json_string(v41_test::release_json().dump(), "config.json").engram;
}

TEST(V41Engram, SpecPrimes) {
  const auto p = engram_primes(release_engram());
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(p[0].size(), 24u);
  EXPECT_EQ(std::vector<int64_t>(p[0].begin(), p[0].begin() + 8),
            (std::vector<int64_t>{16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183}));
  EXPECT_EQ(p[0].back(), 16000463);
  EXPECT_EQ(p[1].front(), 16000477);
  EXPECT_EQ(p[1].back(), 16000889);
  int64_t s0 = 0, s1 = 0;
  for (int64_t x : p[0]) s0 += x;
  for (int64_t x : p[1]) s1 += x;
  EXPECT_EQ(s0, 384006168);  // engram_num_embeddings of the release
  EXPECT_EQ(s1, 384016682);
  // §9's test config: vocab 1000, 3-grams x 2 heads, layers 1 and 4.
  EngramConfig t;
  t.layer_ids = {1, 4};
  t.max_ngram_size = 3;
  t.n_heads = 2;
  t.vocab_size = 1000;
  const auto q = engram_primes(t);
  EXPECT_EQ(q[0], (std::vector<int64_t>{1009, 1013, 1019, 1021}));
  EXPECT_EQ(q[1], (std::vector<int64_t>{1031, 1033, 1039, 1049}));
}

TEST(V41Engram, MillerRabin) {
  std::vector<bool> sieve(200000, true);
  sieve[0] = sieve[1] = false;
  for (size_t i = 2; i < sieve.size(); ++i)
    if (sieve[i])
      for (size_t j = i * i; j < sieve.size(); j += i) sieve[j] = false;
  for (size_t i = 0; i < sieve.size(); ++i) ASSERT_EQ(is_prime_u64(i), bool(sieve[i])) << i;
  EXPECT_TRUE(is_prime_u64((uint64_t(1) << 61) - 1));
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));            // largest 64-bit prime
  for (uint64_t c : {561ull, 41041ull, 3215031751ull, 3825123056546413051ull}) EXPECT_FALSE(is_prime_u64(c)) << c;
}

struct Case {
  std::string name, config_dir;
  std::filesystem::path sidecar;
};

// The hasher of a reference case: golden configs a / b, or the release's Engram with the V3 map.
EngramHasher hasher_for(const Case& c) {
  DeepseekV41Config cfg;
  if (c.config_dir.empty()) {
    json j = v41_test::release_json();
    j["text_config"]["engram_compressed_vocab_size"] = 98627;  // the DeepSeek-V3 tokenizer's class count
    cfg = DeepseekV41Config::from_json_string(j.dump(), "config.json");
  } else {
    cfg = DeepseekV41Config::from_file(golden(c.config_dir).string());
  }
  return EngramHasher(cfg, EngramSidecar::from_file(c.sidecar.string()));
}

TEST(V41Engram, ReferenceRowIds) {
  const auto d = golden("v41_engram");
  if (!std::filesystem::exists(d / "a_rows.i64")) GTEST_SKIP() << d << " absent";
  std::vector<Case> cases = {{"a", "v41_a", golden("v41_a") / "engram_sidecar.json"},
                             {"b_dead", "v41_b", golden("v41_b") / "engram_sidecar.json"}};
  if (std::filesystem::exists(d / "v3_rows.i64")) cases.push_back({"v3", "", d / "v3_engram_sidecar.json"});
  std::mt19937 gen(5);
  for (const Case& c : cases) {
    const EngramHasher h = hasher_for(c);
    const auto tokens = read_raw<int32_t>(d / (c.name + "_tokens.i32"));
    const auto dead = read_raw<uint8_t>(d / (c.name + "_dead.u8"));
    const auto want = read_raw<int64_t>(d / (c.name + "_rows.i64"));
    const int64_t T = int64_t(tokens.size()), per = h.num_layers() * h.num_columns();
    ASSERT_EQ(int64_t(want.size()), T * per) << c.name;
    std::vector<int64_t> got(want.size(), -1);
    EngramHistory hist = h.start();
    h.row_ids(hist, tokens.data(), T, dead.data(), got.data());
    EXPECT_EQ(got, want) << c.name << " whole stream";
    // In chunks of random odd sizes, the history carried between calls.
    std::fill(got.begin(), got.end(), -1);
    hist = h.start();
    for (int64_t t = 0; t < T;) {
      const int64_t n = std::min<int64_t>(T - t, 1 + 2 * int64_t(gen() % 9));
      h.row_ids(hist, tokens.data() + t, n, dead.data() + t, got.data() + t * per);
      t += n;
    }
    EXPECT_EQ(got, want) << c.name << " chunked";
    // Rollback / prefix hit: restore the history from the committed tokens only, then continue.
    for (int64_t p : {int64_t(1), int64_t(2), T / 2 + 1}) {
      const int64_t keep = std::min<int64_t>(p, h.max_ngram() - 1);
      EngramHistory r = h.history_after(tokens.data() + p - keep, keep, dead.data() + p - keep);
      std::vector<int64_t> tail(size_t((T - p) * per));
      h.row_ids(r, tokens.data() + p, T - p, dead.data() + p, tail.data());
      EXPECT_TRUE(std::equal(tail.begin(), tail.end(), want.begin() + p * per)) << c.name << " restored at " << p;
    }
  }
}

// The hash written out directly from its definition over the whole sequence.
std::vector<int64_t> direct_rows(const EngramHasher& h, const std::vector<int32_t>& tok, const std::vector<uint8_t>& dead) {
  const int64_t N = h.max_ngram(), L = h.num_layers(), C = h.num_columns(), H = C / (N - 1);
  std::vector<int64_t> out;
  for (int64_t t = 0; t < int64_t(tok.size()); ++t) {
    std::vector<int64_t> g(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) {
      bool ok = t - i >= 0;
      for (int64_t j = 0; j <= i && ok; ++j) ok = !dead[size_t(t - j)];
      g[size_t(i)] = ok ? h.class_of(tok[size_t(t - i)]) : h.pad_class();
    }
    for (int64_t l = 0; l < L; ++l)
      for (int64_t n = 2; n <= N; ++n) {
        int64_t x = 0;
        for (int64_t i = 0; i < n; ++i) x ^= g[size_t(i)] * h.multipliers(l)[size_t(i)];
        for (int64_t hd = 0; hd < H; ++hd) {
          const size_t c = size_t((n - 2) * H + hd);
          out.push_back(x % h.primes(l)[c] + h.offsets(l)[c]);
        }
      }
  }
  return out;
}

TEST(V41Engram, DirectHashOnRandomStreams) {
  const auto dir = golden("v41_b");
  if (!std::filesystem::exists(dir / "engram_sidecar.json")) GTEST_SKIP() << dir << " absent";
  DeepseekV41Config cfg = DeepseekV41Config::from_file(dir.string());
  EngramSidecar s = EngramSidecar::from_file((dir / "engram_sidecar.json").string());
  // A tokenizer shorter than the model's vocabulary: ids 200..255 are past it and hash as pad.
  s.classes.resize(200);
  s.num_ids = 200;
  const EngramHasher h(cfg, s);
  EXPECT_EQ(h.class_of(250), h.pad_class());
  EXPECT_EQ(h.class_of(2), h.pad_class());
  EXPECT_THROW(h.class_of(256), InvalidArgument);
  EXPECT_THROW(h.class_of(-1), InvalidArgument);
  std::mt19937 gen(11);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t T = 1 + gen() % 97;
    std::vector<int32_t> tok(T);
    std::vector<uint8_t> dead(T);
    for (size_t i = 0; i < T; ++i) {
      tok[i] = int32_t(gen() % 256);
      dead[i] = gen() % 9 == 0;
    }
    std::vector<int64_t> got(T * size_t(h.num_layers() * h.num_columns()));
    EngramHistory hist = h.start();
    for (size_t t = 0; t < T;) {  // token by token and in pairs
      const size_t n = std::min<size_t>(T - t, 1 + t % 2);
      h.row_ids(hist, tok.data() + t, int64_t(n), dead.data() + t, got.data() + t * size_t(h.num_layers() * h.num_columns()));
      t += n;
    }
    EXPECT_EQ(got, direct_rows(h, tok, dead)) << "trial " << trial;
    for (size_t i = 0; i < got.size(); ++i) {  // every row inside its layer's table
      const int64_t l = int64_t(i / size_t(h.num_columns())) % h.num_layers();
      ASSERT_GE(got[i], 0);
      ASSERT_LT(got[i], cfg.engram.num_embeddings[size_t(l)]);
    }
  }
}

std::string sidecar_json(int64_t vocab, int64_t classes, std::vector<std::pair<int64_t, std::vector<int64_t>>> mult) {
  json j = {{"format", "deepinfer.engram_sidecar"}, {"version", 1}, {"source", "test"}, {"tokenizer_sha256", nullptr},
            {"num_ids", vocab}, {"num_classes", classes}, {"max_ngram_size", mult.empty() ? 4 : mult[0].second.size()}};
  std::vector<int64_t> c(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < vocab; ++t) c[size_t(t)] = t % classes;
  j["classes"] = c;
  j["multipliers"] = json::array();
  for (auto& [l, v] : mult) j["multipliers"].push_back({{"layer", l}, {"values", v}});
  return j.dump();
}

TEST(V41Engram, SidecarChecks) {
  const json rel = v41_test::release_json();
  const DeepseekV41Config cfg = DeepseekV41Config::from_json_string(rel.dump(), "config.json");
  auto mk = [&](std::vector<std::pair<int64_t, std::vector<int64_t>>> m, int64_t classes = 99092, int64_t vocab = 129280) {
    return EngramHasher(cfg, EngramSidecar::from_json_string(sidecar_json(vocab, classes, std::move(m)), "s.json"));
  };
  std::vector<std::pair<int64_t, std::vector<int64_t>>> m;
  for (int l = 0; l < 2; ++l)
    m.push_back({kReleaseEngramLayers[l], std::vector<int64_t>(kReleaseMultipliers[l], kReleaseMultipliers[l] + 4)});
  EXPECT_NO_THROW(mk(m));
  EXPECT_EQ(mk(m).num_columns(), 24);
  auto bad = m;
  bad[1].second[2] += 2;  // odd, in range, but not the released value
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { mk(bad); }), "multipliers[1].values[2]");
  bad = m;
  bad[0].second[0] += 1;  // even
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { mk(bad); }), "not an odd value");
  bad = m;
  bad[1].first = 13;
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { mk(bad); }), "is for layer 13");
  bad = m;
  bad.pop_back();
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { mk(bad); }), "multipliers for 1 layers");
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { mk(m, 99091); }), "engram_compressed_vocab_size = 99092");
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { mk(m, 99092, 129281); }), "exceeds the model's vocab_size");
  // The file on its own: first-appearance numbering, counts, format.
  json j = json::parse(sidecar_json(300, 100, {}));
  j["classes"][5] = 50;
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { EngramSidecar::from_json_string(j.dump(), "s.json"); }), "classes[5]");
  j = json::parse(sidecar_json(300, 100, {}));
  j["num_classes"] = 101;
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { EngramSidecar::from_json_string(j.dump(), "s.json"); }), "num_classes 101");
  j["format"] = "something";
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { EngramSidecar::from_json_string(j.dump(), "s.json"); }), "not a deepinfer");
  // A missing sidecar says how to make one.
  V41_EXPECT_HAS(error_of<CheckpointError>([&] { EngramHasher::load(cfg, "/nonexistent/model"); }),
                 "tools/make_engram_sidecar.py");
}

}  // namespace
}  // namespace deepinfer::model::v41
