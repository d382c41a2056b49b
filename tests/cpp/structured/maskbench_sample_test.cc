// MaskBench (JSONSchemaBench) sample: a deterministic ~200-schema slice of maskbench-dev.
// For each schema that compiles, valid instances must be accepted and invalid ones rejected.
// The full run (all 5,797 schemas, real tokens, side by side with xgrammar/llguidance) is
// bench/structured_bench.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

using json = nlohmann::ordered_json;

std::filesystem::path unpack_maskbench() {
  auto tar = shared_dir() / "data/structured/maskbench-dev.tar.gz";
  if (!std::filesystem::exists(tar)) return {};
  const char* bin = std::getenv("DEEPINFER_BINARY_DIR");
  std::filesystem::path out = std::filesystem::path(bin ? bin : "/tmp") / "tmp" / "maskbench";
  if (!std::filesystem::exists(out / "maskbench-dev")) {
    std::filesystem::create_directories(out);
    std::string cmd = "tar xzf '" + tar.string() + "' -C '" + out.string() + "'";
    if (std::system(cmd.c_str()) != 0) return {};
  }
  return out / "maskbench-dev";
}

json shuffle_keys(const json& v, std::mt19937& rng) {
  if (v.is_array()) {
    json out = json::array();
    for (const auto& x : v) out.push_back(shuffle_keys(x, rng));
    return out;
  }
  if (!v.is_object()) return v;
  std::vector<std::string> keys;
  for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
  std::shuffle(keys.begin(), keys.end(), rng);
  json out = json::object();
  for (const auto& k : keys) out[k] = shuffle_keys(v[k], rng);
  return out;
}

TEST(MaskBenchSample, CompiledSchemasAreExact) {
  auto dir = unpack_maskbench();
  if (dir.empty()) GTEST_SKIP() << "maskbench-dev.tar.gz not found under " << shared_dir();
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  GrammarCompiler compiler(byte_vocab());
  int sampled = 0, compiled = 0, passed = 0, fa = 0, fr = 0, shuffled_fr = 0, shuffled_fa = 0;
  // DEEPINFER_MASKBENCH_STRIDE=1 checks every schema (minutes; not in CI).
  const char* stride_env = std::getenv("DEEPINFER_MASKBENCH_STRIDE");
  const size_t stride = stride_env ? std::max(1, std::atoi(stride_env)) : 29;
  std::mt19937 rng(5);
  for (size_t i = 0; i < files.size(); i += stride) {
    ++sampled;
    std::ifstream in(files[i]);
    json doc = json::parse(in);
    std::shared_ptr<const CompiledGrammar> g;
    try {
      g = compiler.compile_uncached(json{{"json_schema", doc["schema"]}}.dump());
    } catch (const GrammarError&) {
      continue;
    }
    ++compiled;
    bool ok = true;
    for (const auto& t : doc["tests"]) {
      const bool want = t["valid"].get<bool>();
      // The instance as written, and with every object's keys shuffled (same validity: JSON
      // Schema does not look at key order, and a model writes keys in the order it likes).
      const json shuffled = shuffle_keys(t["data"], rng);
      for (const json* inst : {&t["data"], &shuffled}) {
        const bool got = matches(g, inst->dump());
        if (got == want) continue;
        ok = false;
        if (inst == &shuffled) (got ? shuffled_fa : shuffled_fr)++;
        else (got ? fa : fr)++;
        ADD_FAILURE() << files[i].filename().string() << ": " << inst->dump().substr(0, 300) << " expected "
                      << (want ? "accept" : "reject");
      }
    }
    passed += ok;
  }
  std::cout << "[maskbench-sample] sampled " << sampled << " compiled " << compiled << " passed " << passed
            << " false_accepts " << fa << " false_rejects " << fr << " shuffled_keys false_accepts " << shuffled_fa
            << " false_rejects " << shuffled_fr << "\n";
  EXPECT_EQ(fa, 0);
  EXPECT_EQ(fr, 0);
  EXPECT_EQ(shuffled_fa, 0);
  EXPECT_EQ(shuffled_fr, 0);
}

}  // namespace
}  // namespace deepinfer::structured::test
