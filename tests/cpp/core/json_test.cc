// core/json.h, core/strings.h, core/file.h: depth-bounded parsing, iterative snippets, UTF-8
// escaping of messages, and reading only regular files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/file.h"
#include "core/json.h"
#include "core/strings.h"

using namespace deepinfer;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
std::string nested(size_t depth, const std::string& open = "[", const std::string& close = "]",
                   const std::string& leaf = "0") {
  std::string s;
  s.reserve(depth * (open.size() + close.size()) + leaf.size());
  for (size_t i = 0; i < depth; ++i) s += open;
  s += leaf;
  for (size_t i = 0; i < depth; ++i) s += close;
  return s;
}
}  // namespace

TEST(JsonDepth, PreScanCountsOnlyBracketsOutsideStrings) {
  EXPECT_EQ(json_depth_exceeded_at("[[1]]", 2), std::string_view::npos);
  EXPECT_EQ(json_depth_exceeded_at("[[1]]", 1), 1u);
  EXPECT_EQ(json_depth_exceeded_at(R"({"a": "[[[[[[", "b": "\"[[[["})", 1), std::string_view::npos);
  EXPECT_EQ(json_depth_exceeded_at(R"(["\\", [0]])", 1), 7u);  // the escaped backslash ends, the string closes
  EXPECT_EQ(json_depth_exceeded_at(nested(256), 256), std::string_view::npos);
  EXPECT_EQ(json_depth_exceeded_at(nested(257), 256), 256u);
}

TEST(JsonDepth, HundredThousandDeepIsANamedErrorNotACrash) {
  for (const auto& [open, close, leaf] : {std::tuple<std::string, std::string, std::string>{"[", "]", "0"},
                                          {"{\"a\":", "}", "1"}}) {
    json j;
    std::string why;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(parse_json_bounded(nested(100000, open, close, leaf), j, &why));
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    EXPECT_NE(why.find("nested deeper than 256 levels (at byte "), std::string::npos) << why;
  }
  json ok;
  EXPECT_TRUE(parse_json_bounded(nested(256), ok, nullptr));
  EXPECT_EQ(ok.dump().size(), 2 * 256 + 1u);  // dump of an accepted value is bounded too
}

TEST(JsonDepth, ThrowingFormNamesOriginAndEscapesBytes) {
  try {
    parse_json_or_throw<ConfigError>("{\"a\": \xff\xfe}", "dir/config.json");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("dir/config.json: not valid JSON: ", 0), 0u) << m;
    EXPECT_EQ(first_invalid_utf8(m), std::string::npos) << m;  // nlohmann quoted the raw bytes
    EXPECT_NE(m.find("\\xff"), std::string::npos) << m;
  }
}

TEST(JsonSnippet, IterativeCappedAndValidUtf8) {
  EXPECT_EQ(json_snippet(json::parse(R"({"a":[1,2,{"b":null}],"c":"x"})")), R"({"a":[1,2,{"b":null}],"c":"x"})");
  EXPECT_EQ(json_snippet(json::array()), "[]");
  EXPECT_EQ(json_snippet(json::parse("[[[[1]]]]"), 160, 2), "[[[...]]]");
  // 100,000 levels built by hand (no parse): the snippet walks it without recursion.
  json deep = 0;
  for (int i = 0; i < 100000; ++i) deep = json::array({std::move(deep)});
  EXPECT_EQ(json_snippet(deep, 40, 3), "[[[[...]]]]");
  std::string s = json_snippet(deep, 40, 1 << 30);
  EXPECT_LE(s.size(), 40u + 3);
  EXPECT_EQ(s.substr(s.size() - 3), "...");
  // Long strings are cut on a character boundary.
  std::string cut = json_snippet(json(std::string(100, 'x') + "\xc3\xa9\xc3\xa9\xc3\xa9"), 102);
  EXPECT_EQ(first_invalid_utf8(cut), std::string::npos) << cut;
  // Invalid UTF-8 inside a string value (possible when built in C++, not parsed).
  EXPECT_EQ(first_invalid_utf8(json_snippet(json(std::string("a\xff")))), std::string::npos);
  // Tear-down of a deep value: nlohmann 3.11 destroys iteratively.
  deep = nullptr;
}

TEST(Utf8Escape, KeepsValidTextAndEscapesEveryBadByte) {
  EXPECT_EQ(escape_invalid_utf8("plain é ∑ 😀"), "plain é ∑ 😀");
  EXPECT_EQ(escape_invalid_utf8("a\xffz"), "a\\xffz");
  EXPECT_EQ(escape_invalid_utf8("\xc3"), "\\xc3");                  // truncated
  EXPECT_EQ(escape_invalid_utf8("\xc0\xaf"), "\\xc0\\xaf");         // overlong
  EXPECT_EQ(escape_invalid_utf8("\xed\xa0\x80"), "\\xed\\xa0\\x80"); // surrogate
  EXPECT_EQ(escape_invalid_utf8("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(first_invalid_utf8("ok\xe2\x82"), 2u);
  // Random bytes always come out valid.
  uint64_t x = 88172645463325252ull;
  for (int k = 0; k < 2000; ++k) {
    std::string s;
    for (int i = 0; i < 24; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      s += char(x & 0xff);
    }
    EXPECT_EQ(first_invalid_utf8(escape_invalid_utf8(s)), std::string::npos);
  }
}

TEST(RegularFile, ReadsFilesAndRefusesPipesAndFolders) {
  fs::path d = fs::path(testing::TempDir()) / ("di_core_file_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "a.txt") << "hello";
  std::string text, why;
  ASSERT_TRUE(read_regular_file((d / "a.txt").string(), text, &why)) << why;
  EXPECT_EQ(text, "hello");
  EXPECT_FALSE(read_regular_file((d / "a.txt").string(), text, &why, 3));
  EXPECT_NE(why.find("more than the 3-byte limit"), std::string::npos) << why;
  EXPECT_FALSE(read_regular_file((d / "missing").string(), text, &why));
  EXPECT_NE(why.find("cannot open"), std::string::npos) << why;
  EXPECT_FALSE(read_regular_file(d.string(), text, &why));
  EXPECT_NE(why.find("a directory"), std::string::npos) << why;
  ASSERT_EQ(::mkfifo((d / "pipe").c_str(), 0600), 0);
  auto t0 = std::chrono::steady_clock::now();
  try {
    read_regular_file_or_throw<ConfigError>((d / "pipe").string());
    FAIL() << "a named pipe was read";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is a named pipe, not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  fs::remove_all(d);
}

// A number past double's range (nlohmann's out_of_range 406, which escaped parsers catching
// only parse_error) is a parse failure naming the field's path and the byte.
TEST(JsonBounded, NumberOutOfRangeNamesTheField) {
  std::string why;
  json j;
  EXPECT_FALSE(parse_json_bounded(R"({"a": {"b": [1, 2, {"c": -1e999}]}})", j, &why));
  EXPECT_NE(why.find("field 'a.b[2].c'"), std::string::npos) << why;
  EXPECT_NE(why.find("-1e999"), std::string::npos) << why;
  EXPECT_NE(why.find("outside the range of a double"), std::string::npos) << why;
  EXPECT_NE(why.find("(at byte 25)"), std::string::npos) << why;  // where -1e999 starts

  std::string where;
  EXPECT_TRUE(json_number_out_of_range("1e999", &where));
  EXPECT_NE(where.find("(top level)"), std::string::npos) << where;
  EXPECT_TRUE(json_number_out_of_range(R"([0, [1e400]])", &where));
  EXPECT_NE(where.find("field '[1][0]'"), std::string::npos) << where;
  // Syntax errors and huge integers (kept as doubles by nlohmann) are not overflows.
  EXPECT_FALSE(json_number_out_of_range(R"({"a": })", &where));
  EXPECT_FALSE(json_number_out_of_range("123456789012345678901234567890", &where));
  EXPECT_FALSE(json_number_out_of_range(R"({"x": 1e308})", &where));
  EXPECT_TRUE(parse_json_bounded(R"({"x": 1e308})", j, &why));
}
