// JSON Schema coverage beyond the basics (issue #4): long length/count bounds, decimal numeric
// bounds, multipleOf with bounds, `not` as a per-type difference, oneOf proven exclusive,
// dependentRequired / dependentSchemas, \p{..} classes. Each schema is checked on hand-picked
// instances and, where a reference is simple, on random ones.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace deepinfer::structured::test {
namespace {

std::shared_ptr<const CompiledGrammar> schema(const std::string& s) {
  GrammarCompiler c(byte_vocab());
  return c.compile_uncached("{\"json_schema\": " + s + "}");
}
void expect_lang(const std::shared_ptr<const CompiledGrammar>& g, std::initializer_list<std::string> ok,
                 std::initializer_list<std::string> bad) {
  for (const auto& x : ok) EXPECT_TRUE(matches(g, x)) << x;
  for (const auto& x : bad) EXPECT_FALSE(matches(g, x)) << x;
}
std::string error_of(const std::string& s) {
  try {
    schema(s);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchemaCoverage, LongLengthAndCountBounds) {
  auto g = schema(R"({"type": "string", "maxLength": 32767})");
  EXPECT_TRUE(matches(g, "\"" + std::string(32767, 'a') + "\""));
  EXPECT_FALSE(matches(g, "\"" + std::string(32768, 'a') + "\""));
  EXPECT_TRUE(matches(g, "\"\""));
  auto h = schema(R"({"type": "string", "minLength": 200, "maxLength": 1000})");
  for (int n : {199, 200, 201, 255, 256, 257, 999, 1000, 1001})
    EXPECT_EQ(matches(h, "\"" + std::string(n, 'x') + "\""), n >= 200 && n <= 1000) << n;
  EXPECT_TRUE(matches(h, "\"" + std::string(100, 'x') + std::string(100, 'y') + "\\n\""));
  auto m = schema(R"({"type": "string", "minLength": 5000})");
  EXPECT_FALSE(matches(m, "\"" + std::string(4999, 'a') + "\""));
  EXPECT_TRUE(matches(m, "\"" + std::string(7000, 'a') + "\""));
  auto a = schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 1500})");
  auto arr = [](int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? ",7" : "7");
    return s + "]";
  };
  for (int n : {0, 1, 2, 64, 65, 1499, 1500, 1501}) EXPECT_EQ(matches(a, arr(n)), n >= 2 && n <= 1500) << n;
  EXPECT_NE(error_of(R"({"type": "string", "maxLength": 1e12})").find("#/maxLength"), std::string::npos);
}

// Reference for decimal bounds: values are scaled by 10^6 (all test numbers have <= 6 decimals).
int64_t scaled(const std::string& t) {
  bool neg = t[0] == '-';
  std::string s = neg ? t.substr(1) : t;
  size_t dot = s.find('.');
  std::string ip = s.substr(0, dot), fp = dot == std::string::npos ? "" : s.substr(dot + 1);
  fp.resize(6, '0');
  int64_t v = std::stoll(ip) * 1000000 + std::stoll(fp);
  return neg ? -v : v;
}

TEST(JsonSchemaCoverage, DecimalBoundsRandom) {
  std::mt19937 rng(7);
  const char* bounds[] = {"-2.5", "-1", "-0.25", "0", "0.001", "0.5", "1.75", "3", "12.125", "100.5"};
  auto rand_num = [&]() {
    std::string s;
    if (rng() % 3 == 0) s += '-';
    int ip = rng() % 4 == 0 ? static_cast<int>(rng() % 150) : static_cast<int>(rng() % 4);
    s += std::to_string(ip);
    int fd = static_cast<int>(rng() % 5);
    if (fd) {
      s += '.';
      for (int i = 0; i < fd; ++i) s += static_cast<char>('0' + rng() % 10);
    }
    return s;
  };
  for (int trial = 0; trial < 24; ++trial) {
    std::string lo = bounds[rng() % 10], hi = bounds[rng() % 10];
    bool lo_x = rng() % 2, hi_x = rng() % 2, has_lo = rng() % 4 != 0, has_hi = rng() % 4 != 0;
    std::string s = R"({"type": "number")";
    if (has_lo) s += std::string(", \"") + (lo_x ? "exclusiveMinimum" : "minimum") + "\": " + lo;
    if (has_hi) s += std::string(", \"") + (hi_x ? "exclusiveMaximum" : "maximum") + "\": " + hi;
    s += "}";
    auto g = schema(s);
    for (int k = 0; k < 150; ++k) {
      std::string x = k < 10 ? std::string(k % 2 ? "-" : "") + (has_lo ? lo : hi) : rand_num();
      if (x.rfind("--", 0) == 0) x = x.substr(2);
      int64_t v = scaled(x);
      bool want = (!has_lo || (lo_x ? v > scaled(lo) : v >= scaled(lo))) && (!has_hi || (hi_x ? v < scaled(hi) : v <= scaled(hi)));
      EXPECT_EQ(matches(g, x), want) << s << " on " << x;
    }
  }
}

TEST(JsonSchemaCoverage, MultipleOfWithBounds) {
  expect_lang(schema(R"({"type": "integer", "multipleOf": 5, "minimum": 7, "exclusiveMaximum": 30})"),
              {"10", "25", "15.0"}, {"5", "30", "12", "-10"});
  expect_lang(schema(R"({"type": "number", "multipleOf": 0.25, "maximum": 1.5, "minimum": -0.5})"),
              {"0", "0.25", "1.5", "-0.5", "1.50", "0.750"}, {"0.3", "1.75", "-0.75", "0.125"});
  expect_lang(schema(R"({"type": "number", "multipleOf": 1.5})"), {"3", "4.5", "-1.5", "0", "30.00"},
              {"1", "2.25", "4.6"});
  expect_lang(schema(R"({"type": "integer", "multipleOf": 1.5})"), {"3", "6", "-9"}, {"1.5", "4", "5"});
  expect_lang(schema(R"({"type": "integer", "multipleOf": 0.5})"), {"1", "2", "-3"}, {"1.5"});
}

TEST(JsonSchemaCoverage, NotOverEnumConstAndTypes) {
  expect_lang(schema(R"({"type": "string", "not": {"enum": ["a", "b"]}})"), {R"("c")", R"("ab")", R"("")"},
              {R"("a")", R"("b")", "1"});
  expect_lang(schema(R"({"not": {"const": null}})"), {"1", R"("x")", "{}", "[]", "false"}, {"null"});
  expect_lang(schema(R"({"type": ["integer", "string"], "not": {"enum": [1, "x"]}})"), {"2", R"("y")", "-1"},
              {"1", "1.0", R"("x")"});
  expect_lang(schema(R"({"type": "string", "not": {"pattern": "^a"}})"), {R"("ba")", R"("")"}, {R"("ab")", R"("a")"});
  expect_lang(schema(R"({"type": "boolean", "not": {"const": true}})"), {"false"}, {"true"});
  // Objects: failing a properties/required schema is a union of patches.
  expect_lang(schema(R"({"type": "object", "not": {"required": ["a", "b"], "properties": {"a": {"type": "string"}}}})"),
              {"{}", R"({"a":"x"})", R"({"b":1})", R"({"a":1,"b":2})"}, {R"({"a":"x","b":2})", R"({"b":2,"a":"y"})"});
  expect_lang(schema(R"({"type": "number", "not": {"minimum": 3, "exclusiveMaximum": 5.5}})"),
              {"2.999", "5.5", "-1", "7"}, {"3", "4.2", "5.49"});
  expect_lang(schema(R"({"not": {"multipleOf": 2}})"), {"3", "2.5"}, {"4", "-2", "0", R"("x")", "{}"});
  // Arrays: too short, too long, or some item failing the item schema.
  expect_lang(schema(R"({"type": "array", "not": {"items": {"type": "integer"}, "minItems": 1, "maxItems": 2}})"),
              {"[]", "[1,2,3]", R"(["a"])", R"([1,[]])"}, {"[1]", "[1,2]", "7"});
  // not (A or B) per branch; not not X = X.
  expect_lang(schema(R"({"not": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["a"]}]}})"),
              {"1", "{}", R"({"b":1})", "[]"}, {R"("s")", R"({"a":1})"});
  expect_lang(schema(R"({"not": {"not": {"type": "integer", "minimum": 3}}})"), {"3", "4"}, {"2", "3.5", R"("x")"});
  // Members failing additionalProperties / patternProperties / propertyNames: a witness member.
  expect_lang(schema(R"({"type": "object", "properties": {"a": {}}, "not": {"properties": {"a": {}}, "additionalProperties": false}})"),
              {R"({"b":1})", R"({"a":1,"c":2})"}, {"{}", R"({"a":1})"});
  expect_lang(schema(R"({"type": "object", "not": {"patternProperties": {"^x": {"type": "integer"}}}})"),
              {R"({"x1":"s"})", R"({"a":1,"xy":[]})"}, {"{}", R"({"x1":2})", R"({"a":"s"})"});
  expect_lang(schema(R"({"type": "object", "properties": {"ab": {"type": "integer"}}, "not": {"propertyNames": {"maxLength": 1}}})"),
              {R"({"ab":1})", R"({"cd":"x"})"}, {"{}", R"({"a":1})", R"({"ab":"s"})"});
  EXPECT_NE(error_of(R"({"not": {"minProperties": 2}})").find("#/not"), std::string::npos);
  EXPECT_NE(error_of(R"({"not": {"uniqueItems": true}})").find("#/not"), std::string::npos);
}

TEST(JsonSchemaCoverage, OneOfProvenExclusive) {
  // A discriminator: required "kind" with different consts, any-JSON payloads.
  auto g = schema(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "a"}, "v": {}}, "required": ["kind"]},
      {"type": "object", "properties": {"kind": {"const": "b"}, "w": {}}, "required": ["kind"]}]})");
  expect_lang(g, {R"({"kind":"a","v":[1,{"x":2}]})", R"({"w":{},"kind":"b"})"}, {R"({"kind":"c"})", R"({"v":1})"});
  // Required in one branch, forbidden in the other.
  expect_lang(schema(R"({"oneOf": [
      {"type": "object", "required": ["x"]},
      {"type": "object", "properties": {"y": {}}, "additionalProperties": false}]})"),
              {R"({"x":[1]})", R"({"y":{"z":1}})", "{}"}, {"1"});
  // Overlapping non-regular branches: each branch and not the others.
  expect_lang(schema(R"({"oneOf": [{"type": "object"}, {"required": ["a"]}]})"),
              {"{}", R"({"b":[1]})", "1", R"("s")"}, {R"({"a":1})", R"({"b":2,"a":{}})"});
  expect_lang(schema(R"({"type": "object", "oneOf": [
      {"required": ["id", "win"], "properties": {"id": {"type": "string"}}},
      {"required": ["id", "lose"], "properties": {"id": {"type": "string"}, "lose": {"type": "object"}}}]})"),
              {R"({"id":"g","win":{"m":1}})", R"({"id":"g","lose":{}})", R"({"id":"g","win":1,"lose":2})"},
              {R"({"id":"g","win":{},"lose":{}})", R"({"id":1,"win":{}})", R"({"id":"g"})"});
  EXPECT_NE(error_of(R"({"oneOf": [{"type": "object"}, {"minProperties": 1}]})").find("#/oneOf/1"), std::string::npos);
}

TEST(JsonSchemaCoverage, DependentRequiredAndSchemas) {
  auto g = schema(R"({"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b", "c"]}})");
  expect_lang(g, {"{}", R"({"b":1})", R"({"a":1,"b":2,"c":3})", R"({"c":3,"b":2,"a":1})"},
              {R"({"a":1})", R"({"a":1,"b":2})", R"({"a":1,"c":2})"});
  // More names than an any-order object tracks: split on the trigger instead.
  auto many = schema(R"({"type": "object", "properties": {"p1": {}, "p2": {}, "p3": {}, "p4": {}, "p5": {}, "p6": {},
                         "p7": {}, "p8": {}, "p9": {}}, "dependentRequired": {"p1": ["p9"]}})");
  expect_lang(many, {"{}", R"({"p2":1})", R"({"p1":1,"p9":2})"}, {R"({"p1":1})", R"({"p1":1,"p2":2})"});
  auto d7 = schema(R"({"$schema": "http://json-schema.org/draft-07/schema#", "dependencies": {"bar": ["foo"], "q": {"properties": {"n": {"type": "integer"}}, "required": ["n"]}}})");
  expect_lang(d7, {"{}", R"({"foo":1,"bar":2})", R"({"q":1,"n":2})", "[1]", "7"},
              {R"({"bar":2})", R"({"q":1})", R"({"q":1,"n":"x"})"});
  auto ds = schema(R"({"type": "object", "additionalProperties": false, "properties": {"card": {"type": "string"}, "addr": {"type": "string"}},
                      "dependentSchemas": {"card": {"required": ["addr"]}}})");
  expect_lang(ds, {"{}", R"({"addr":"x"})", R"({"card":"1","addr":"x"})"}, {R"({"card":"1"})", R"({"z":1})"});
}

TEST(JsonSchemaCoverage, Contains) {
  expect_lang(schema(R"({"type": "array", "contains": {"type": "string"}})"),
              {R"(["a"])", R"([1,"a",2])", R"([{},[],"x","y"])"}, {"[]", "[1,2]", R"([["a"]])"});
  expect_lang(schema(R"({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5},
                         "minContains": 2, "maxContains": 3})"),
              {"[5,6]", "[1,5,2,6,3]", "[5,6,7]"}, {"[5]", "[5,6,7,8]", "[1,2]", R"([5,6,"x"])"});
  expect_lang(schema(R"({"prefixItems": [{"type": "string"}], "contains": {"const": 1}, "maxItems": 3})"),
              {R"(["a",1])", R"(["a",2,1])"}, {R"([1])", R"(["a",2])", R"(["a",2,3,1])"});
  expect_lang(schema(R"({"contains": {"type": "object", "required": ["k"]}, "minContains": 0, "maxContains": 1})"),
              {"[]", R"([{"k":1}])", R"([{},{"j":2}])", "7"}, {R"([{"k":1},{"k":2}])"});
}

TEST(JsonSchemaCoverage, AllOfMerges) {
  // Each side's additionalProperties applies to the keys it does not declare.
  expect_lang(schema(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": false},
                                   {"properties": {"b": {}}, "additionalProperties": {"type": "string"}}]})"),
              {"{}"}, {R"({"a":1})", R"({"b":"s"})", R"({"a":"x"})", R"({"c":"s"})"});
  expect_lang(schema(R"({"allOf": [{"additionalProperties": {"type": "integer"}}, {"properties": {"a": {"minimum": 2}}}]})"),
              {R"({"a":3,"z":1})", "{}"}, {R"({"a":1})", R"({"a":2.5})", R"({"z":"s"})"});
  expect_lang(schema(R"({"allOf": [{"prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
                                   {"prefixItems": [{"minimum": 0}, {"maxLength": 1}]}]})"),
              {"[]", "[1]", R"([1,"a","bc"])"}, {"[-1]", R"([1,"ab"])", R"(["x"])", "[1,2]"});
  expect_lang(schema(R"({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}, {"pattern": "x"}]})"),
              {R"("axb")", R"("axxb")"}, {R"("ab")", R"("xb")", R"("axbc")"});
  expect_lang(schema(R"({"enum": ["ab", "ac", "bc"], "allOf": [{"pattern": "^a"}, {"pattern": "c$"}]})"), {R"("ac")"},
              {R"("ab")", R"("bc")"});
  expect_lang(schema(R"({"allOf": [{"propertyNames": {"maxLength": 2}}, {"propertyNames": {"pattern": "^a"}}]})"),
              {R"({"ab":1})", "{}"}, {R"({"abc":1})", R"({"b":1})"});
  expect_lang(schema(R"({"type": "integer", "allOf": [{"not": {"const": 1}}, {"not": {"const": 2}}]})"),
              {"0", "3"}, {"1", "2", "2.0"});
}

TEST(JsonSchemaCoverage, IfThenElse) {
  expect_lang(schema(R"({"type": "object", "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
                         "then": {"required": ["x"]}, "else": {"required": ["y"]}})"),
              {R"({"kind":"a","x":1})", R"({"kind":"b","y":1})", R"({"y":{}})"},
              {R"({"kind":"a","y":1})", R"({"kind":"b","x":1})", "{}"});
  expect_lang(schema(R"({"if": {"type": "string"}, "then": {"maxLength": 2}, "else": {"type": "integer"}})"),
              {R"("ab")", "3"}, {R"("abc")", "1.5", "null"});
  expect_lang(schema(R"({"if": {"minimum": 10}, "then": {"multipleOf": 5}})"), {"15", "3", R"("s")"}, {"12"});
}

TEST(JsonSchemaCoverage, MoreFormats) {
  expect_lang(schema(R"({"type": "string", "format": "json-pointer"})"), {R"("")", R"("/a/b~0~1")", R"("/")"},
              {R"("a")", R"("/a~2")"});
  expect_lang(schema(R"({"type": "string", "format": "relative-json-pointer"})"), {R"("0")", R"("1/a")", R"("2#")"},
              {R"("/a")", R"("01")", R"("-1")"});
  expect_lang(schema(R"({"type": "string", "format": "iri"})"), {R"("http://ƒøø.ßår/?∂éœ=πîx#πîüx")"}, {R"("x y")"});
  expect_lang(schema(R"({"type": "string", "format": "uri-template"})"),
              {R"("http://example.com/dictionary/{term:1}/{term}")", R"("a{+x,y*}")"}, {R"("http://x/{term")", R"("{}")"});
}

TEST(JsonSchemaCoverage, Unevaluated) {
  expect_lang(schema(R"({"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}], "unevaluatedProperties": {"type": "integer"}})"),
              {R"({"a":"x","b":[],"c":1})", "{}", "[1]"}, {R"({"c":"x"})"});
  // A nested unevaluatedProperties sees only its own subschema.
  expect_lang(schema(R"({"allOf": [{"properties": {"a": {}}}, {"unevaluatedProperties": false}]})"), {"{}", "1"},
              {R"({"a":1})"});
  expect_lang(schema(R"({"prefixItems": [{"type": "string"}], "unevaluatedItems": {"type": "integer"}})"),
              {R"(["a",1,2])", "[]"}, {R"(["a","b"])", "[1]"});
  // anyOf: every branch that holds evaluates (split by the set of branches that hold).
  expect_lang(schema(R"({"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "required": ["b"]}],
                         "unevaluatedProperties": false})"),
              {"{}", R"({"a":1})", R"({"a":1,"b":2})", R"({"b":2})", "7"}, {R"({"c":1})", R"({"a":1,"c":2})"});
  EXPECT_NE(error_of(R"({"dependentSchemas": {"a": {"properties": {"b": {}}}}, "unevaluatedProperties": false})")
                .find("#/unevaluatedProperties"),
            std::string::npos);
  // A recursive $ref inside a closed schema is an error, not a crash.
  EXPECT_NE(error_of(R"({"allOf": [{"$ref": "#"}], "unevaluatedProperties": false})"), "");
}

TEST(JsonSchemaCoverage, UnicodeClasses) {
  GrammarCompiler c(byte_vocab());
  auto re = [&](const std::string& r) { return c.compile_uncached(nlohmann::json{{"regex", r}}.dump()); };
  auto letters = re("\\p{L}+");
  EXPECT_TRUE(matches(letters, "abcÄéж漢字"));
  EXPECT_FALSE(matches(letters, "ab1"));
  EXPECT_FALSE(matches(letters, "a b"));
  auto lu = re("\\p{Lu}\\p{Ll}*");
  EXPECT_TRUE(matches(lu, "Ünïcode"));
  EXPECT_FALSE(matches(lu, "ünicode"));
  auto notnum = re("[\\P{N}]+");
  EXPECT_TRUE(matches(notnum, "abc"));
  EXPECT_FALSE(matches(notnum, "a٣"));  // ARABIC-INDIC DIGIT THREE is Nd
  EXPECT_TRUE(matches(re("\\p{Sc}"), "€"));
  EXPECT_TRUE(matches(re("\\pN\\p{^L}"), "5!"));
  EXPECT_THROW(re("\\p{Greek}"), GrammarError);
  expect_lang(schema(R"({"type": "string", "pattern": "^\\p{Lu}"})"), {R"("Éa")"}, {R"("éa")"});
}

}  // namespace
}  // namespace deepinfer::structured::test
