// Number spellings under numeric bounds: at zero bounds every JSON spelling (exponents of any
// sign and size, -0, 0.0, long mantissas) is decided by its exact value; other bounds keep the
// plain-decimal language and are checked here for the spellings it covers.
#include <gtest/gtest.h>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

struct Case {
  const char* bounds;  // JSON members added to {"type": "number"}
  const char* text;
  bool valid;  // by the exact decimal value
};

TEST(NumberSpelling, ZeroBoundsTakeEverySpelling) {
  const Case cases[] = {
      {R"("minimum": 0)", "5e-06", true},      {R"("minimum": 0)", "-5e-06", false},
      {R"("minimum": 0)", "-0", true},         {R"("minimum": 0)", "-0.0e5", true},
      {R"("minimum": 0)", "0E+0", true},       {R"("minimum": 0)", "1e999", true},
      {R"("minimum": 0)", "0.000e-3", true},   {R"("minimum": 0)", "-1e-999", false},
      {R"("minimum": 0)", "12.50", true},      {R"("minimum": 0)", "01", false},  // not JSON
      {R"("exclusiveMinimum": 0)", "0", false}, {R"("exclusiveMinimum": 0)", "0.0", false},
      {R"("exclusiveMinimum": 0)", "-0", false}, {R"("exclusiveMinimum": 0)", "1e-999", true},
      {R"("exclusiveMinimum": 0)", "0.0001", true}, {R"("exclusiveMinimum": 0)", "0.00e1", false},
      {R"("maximum": 0)", "-5e-06", true},     {R"("maximum": 0)", "5e-06", false},
      {R"("maximum": 0)", "-0", true},         {R"("maximum": 0)", "0.0E-7", true},
      {R"("exclusiveMaximum": 0)", "-1E-3", true}, {R"("exclusiveMaximum": 0)", "-0", false},
      {R"("minimum": 0, "maximum": 0)", "-0.0e3", true}, {R"("minimum": 0, "maximum": 0)", "1e-9", false},
      {R"("minimum": 0, "exclusiveMaximum": 0)", "0", false},
      // A non-zero bound: plain decimal spellings, exactly.
      {R"("minimum": 1)", "1.5", true},        {R"("minimum": 1)", "0.5", false},
      {R"("minimum": 1)", "1", true},          {R"("minimum": 1)", "-0", false},
      {R"("maximum": 2.5)", "2.50", true},     {R"("maximum": 2.5)", "2.5000001", false},
  };
  GrammarCompiler c(byte_vocab());
  for (const Case& k : cases) {
    auto g = c.compile_uncached(std::string(R"({"json_schema": {"type": "number", )") + k.bounds + "}}");
    EXPECT_EQ(matches(g, k.text), k.valid) << k.bounds << " on " << k.text;
  }
}

}  // namespace
}  // namespace deepinfer::structured::test
