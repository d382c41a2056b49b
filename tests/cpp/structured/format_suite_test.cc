// JSON-Schema-Test-Suite optional/format (draft 2020-12) with format assertion on: the formats
// lowered exactly must have no false accepts or rejects; the others (leap seconds in time,
// IDNA rules in hostname) are reported, and unsupported ones (idn-*, regex) must not compile.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

using json = nlohmann::ordered_json;

TEST(FormatSuite, ExactFormatsHaveNoFalseAnswers) {
  auto dir = shared_dir() / "data/structured/json-schema-test-suite/draft2020-12/optional/format";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "shared data not found at " << dir;
  const std::set<std::string> exact = {"date", "duration", "email", "ipv4", "ipv6", "iri", "iri-reference",
                                       "json-pointer", "relative-json-pointer", "uri", "uri-reference",
                                       "uri-template", "uuid", "unknown"};
  GrammarCompiler compiler(byte_vocab());
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().stem().string();
    std::ifstream in(e.path());
    json groups = json::parse(in);
    int ok = 0, fa = 0, fr = 0, errors = 0;
    for (const auto& g : groups) {
      std::shared_ptr<const CompiledGrammar> cg;
      try {
        cg = compiler.compile_uncached(json{{"json_schema", g["schema"]}, {"format_assertion", true}}.dump());
      } catch (const GrammarError&) {
        ++errors;
        continue;
      }
      for (const auto& t : g["tests"]) {
        bool got = matches(cg, t["data"].dump()), want = t["valid"].get<bool>();
        if (got == want) { ++ok; continue; }
        (got ? fa : fr)++;
        if (exact.count(name)) ADD_FAILURE() << name << ": " << t["data"].dump() << " (" << t["description"] << ")";
      }
    }
    std::cout << "[format] " << name << " ok " << ok << " fa " << fa << " fr " << fr << " compile_errors " << errors << "\n";
    if (exact.count(name)) {
      EXPECT_EQ(errors, 0) << name;
    }
  }
}

}  // namespace
}  // namespace deepinfer::structured::test
