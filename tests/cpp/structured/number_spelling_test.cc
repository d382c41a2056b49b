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

// Integer bounds over the whole int64 range: exact, compiled in milliseconds (the digit-range
// construction had doubled per digit: 2.8 s for 1e18).
TEST(NumberSpelling, Int64RangeBoundsAreExactAndFast) {
  GrammarCompiler c(byte_vocab());
  auto g = c.compile_uncached(
      R"({"json_schema": {"type": "integer", "minimum": -9223372036854775807, "maximum": 9223372036854775807}})");
  EXPECT_LT(g->compile_ms(), 50.0);
  EXPECT_TRUE(matches(g, "9223372036854775807"));
  EXPECT_FALSE(matches(g, "9223372036854775808"));
  EXPECT_TRUE(matches(g, "-9223372036854775807"));
  EXPECT_FALSE(matches(g, "-9223372036854775808"));
  auto h = c.compile_uncached(R"({"json_schema": {"type": "integer", "minimum": 3, "maximum": 1e18}})");
  EXPECT_LT(h->compile_ms(), 50.0);
  EXPECT_TRUE(matches(h, "1000000000000000000"));
  EXPECT_FALSE(matches(h, "1000000000000000001"));
  EXPECT_FALSE(matches(h, "2"));
  auto e = c.compile_uncached(R"({"json_schema": {"type": "integer", "exclusiveMaximum": 9007199254740992}})");
  EXPECT_TRUE(matches(e, "9007199254740991"));
  EXPECT_FALSE(matches(e, "9007199254740992"));
  EXPECT_THROW(c.compile_uncached(R"({"json_schema": {"type": "integer", "maximum": 18446744073709551615}})"), GrammarError);
}

}  // namespace
}  // namespace deepinfer::structured::test
