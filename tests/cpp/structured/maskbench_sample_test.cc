// MaskBench (JSONSchemaBench) sample: a deterministic ~200-schema slice of maskbench-dev.
// For each schema that compiles, valid instances must be accepted and invalid ones rejected.
// The full run (all 5,797 schemas, real tokens, side by side with xgrammar/llguidance) is
// bench/structured_bench.py.
#include <gtest/gtest.h>

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

TEST(MaskBenchSample, CompiledSchemasAreExact) {
  auto dir = unpack_maskbench();
  if (dir.empty()) GTEST_SKIP() << "maskbench-dev.tar.gz not found under " << shared_dir();
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  GrammarCompiler compiler(byte_vocab());
  int sampled = 0, compiled = 0, passed = 0, fa = 0, fr = 0;
  for (size_t i = 0; i < files.size(); i += 29) {
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
      bool got = matches(g, t["data"].dump()), want = t["valid"].get<bool>();
      if (got == want) continue;
      ok = false;
      (got ? fa : fr)++;
      ADD_FAILURE() << files[i].filename().string() << ": " << t["data"].dump().substr(0, 300) << " expected "
                    << (want ? "accept" : "reject");
    }
    passed += ok;
  }
  std::cout << "[maskbench-sample] sampled " << sampled << " compiled " << compiled << " passed " << passed
            << " false_accepts " << fa << " false_rejects " << fr << "\n";
  EXPECT_EQ(fa, 0);
  EXPECT_EQ(fr, 0);
}

}  // namespace
}  // namespace deepinfer::structured::test
