// JSON-Schema-Test-Suite (draft 2020-12): for every schema that compiles, each test instance
// serialized compactly must be accepted exactly when it is valid.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

using json = nlohmann::ordered_json;

struct SuiteStats {
  int schemas = 0, compiled = 0, tests = 0, false_accepts = 0, false_rejects = 0;
};

void run_file(const std::filesystem::path& file, GrammarCompiler& compiler, SuiteStats& st, bool format_assertion) {
  std::ifstream in(file);
  json groups = json::parse(in);
  for (const auto& g : groups) {
    ++st.schemas;
    json args = {{"json_schema", g["schema"]}, {"format_assertion", format_assertion}};
    std::shared_ptr<const CompiledGrammar> cg;
    try {
      cg = compiler.compile_uncached(args.dump());
    } catch (const GrammarError&) {
      continue;
    }
    ++st.compiled;
    for (const auto& t : g["tests"]) {
      ++st.tests;
      bool got = matches(cg, t["data"].dump());
      bool want = t["valid"].get<bool>();
      if (got == want) continue;
      (got ? st.false_accepts : st.false_rejects)++;
      ADD_FAILURE() << file.filename().string() << " / " << g["description"] << " / " << t["description"]
                    << ": data " << t["data"].dump() << " expected " << (want ? "accept" : "reject");
    }
  }
}

TEST(JsonSchemaSuite, Draft2020CompiledSchemasAreExact) {
  auto dir = shared_dir() / "data/structured/json-schema-test-suite/draft2020-12";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "shared data not found at " << dir;
  GrammarCompiler compiler(byte_vocab());
  SuiteStats st;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) run_file(f, compiler, st, /*format_assertion=*/false);
  std::cout << "[suite] schemas " << st.schemas << " compiled " << st.compiled << " tests " << st.tests
            << " false_accepts " << st.false_accepts << " false_rejects " << st.false_rejects << "\n";
  EXPECT_EQ(st.false_accepts, 0);
  EXPECT_EQ(st.false_rejects, 0);
  EXPECT_GE(st.compiled, 165);  // regression guard; many suite files test unsupported keywords
}

}  // namespace
}  // namespace deepinfer::structured::test
