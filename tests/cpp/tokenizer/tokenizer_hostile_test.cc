// Hostile tokenizer.json / tokenizer_config.json (issue #20): negative or huge ids, deeply
// nested Sequence steps, wrong JSON types, files that are pipes. Each is a TokenizerError naming
// the file and field within a time budget, with a valid UTF-8 message.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/strings.h"
#include "deepinfer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

using namespace deepinfer;
namespace fs = std::filesystem;

namespace {
fs::path tmp_dir() {
  fs::path d = fs::temp_directory_path() / ("di_tok_hostile_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string write_tmp(const std::string& name, const std::string& text) {
  fs::path p = tmp_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
  return p.string();
}

std::string byte_vocab() {
  std::string vocab;
  const auto& ab = tok::ByteAlphabet::get();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tok::append_utf8(s, ab.byte_to_cp[b]);
    if (s == "\"" || s == "\\") s = "\\" + s;
    vocab += "\"" + s + "\":" + std::to_string(b) + ",";
  }
  return vocab + "\"ab\":256";
}

struct Parts {
  std::string vocab_extra;  // appended inside model.vocab
  std::string merges = R"(["a b"])";
  std::string pretok = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";
  std::string normalizer = "null";
  std::string added = R"([{"id":257,"content":"<eos>","special":true}])";
  std::string post = "null";
};

std::string tokenizer_json(const Parts& p) {
  return R"({"model":{"type":"BPE","vocab":{)" + byte_vocab() + p.vocab_extra + R"(},"merges":)" + p.merges +
         R"(},"normalizer":)" + p.normalizer + R"(,"pre_tokenizer":)" + p.pretok +
         R"(,"post_processor":)" + p.post + R"(,"decoder":{"type":"ByteLevel"},"added_tokens":)" + p.added + "}";
}

std::string load_error(const std::string& text, double budget_s = 3.0) {
  std::string path = write_tmp("t.json", text);
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    Tokenizer::from_file(path);
    ADD_FAILURE() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    msg = e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), budget_s) << msg;
  EXPECT_EQ(first_invalid_utf8(msg), std::string::npos) << msg;
  return msg;
}

// `depth` Sequence steps around `leaf` ("pretokenizers" / "normalizers" lists).
std::string nested_sequence(size_t depth, const std::string& list_key, const std::string& leaf) {
  std::string open = R"({"type":"Sequence",")" + list_key + R"(":[)", s;
  s.reserve(depth * (open.size() + 2) + leaf.size());
  for (size_t i = 0; i < depth; ++i) s += open;
  s += leaf;
  for (size_t i = 0; i < depth; ++i) s += "]}";
  return s;
}
#define EXPECT_HAS(s, needle) EXPECT_NE((s).find(needle), std::string::npos) << (s)
}  // namespace

TEST(TokenizerHostile, BaselineLoads) {
  Tokenizer t = Tokenizer::from_file(write_tmp("ok.json", tokenizer_json({})));
  EXPECT_EQ(t.encode("abab<eos>"), (std::vector<int32_t>{256, 256, 257}));
}

TEST(TokenizerHostile, NegativeAndHugeIds) {
  Parts p;
  p.added = R"([{"id":-5,"content":"<bad>","special":true}])";
  EXPECT_HAS(load_error(tokenizer_json(p)), "added_tokens[0].id: expected a token id in [0, 4194304), got -5");
  p.added = R"([{"id":1099511627776,"content":"<bad>"}])";  // 2^40 used to become 0
  EXPECT_HAS(load_error(tokenizer_json(p)), "added_tokens[0].id: expected a token id in [0, 4194304), got 1099511627776");
  p = {};
  p.vocab_extra = R"(,"zz":1099511627776)";
  EXPECT_HAS(load_error(tokenizer_json(p)), R"(model.vocab["zz"]: expected a token id)");
  p.vocab_extra = R"(,"zz":18446744073709551615)";
  EXPECT_HAS(load_error(tokenizer_json(p)), R"(model.vocab["zz"]: expected a token id)");
  p.vocab_extra = R"(,"zz":2.5)";
  EXPECT_HAS(load_error(tokenizer_json(p)), R"(model.vocab["zz"]: expected a token id)");
  p = {};
  p.post = R"({"type":"RobertaProcessing","cls":["<s>",-3],"sep":["</s>",2]})";
  EXPECT_HAS(load_error(tokenizer_json(p)), "post_processor.cls[1]: expected a token id");
  // Found by fuzz_tokenizer_files (tests/fuzz/regressions/tokenizer_files/post_processor_id_past_vocab):
  // an in-range id that is no token of the vocabulary came out of encode(add_special_tokens=true).
  p.post = R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<eos>"}},{"Sequence":{"id":"A"}}],)"
           R"("special_tokens":{"<eos>":{"ids":[518]}}})";
  EXPECT_HAS(load_error(tokenizer_json(p)), "post_processor: token id 518 is not a token of the vocabulary (size 258)");
}

TEST(TokenizerHostile, DeeplyNestedSequences) {
  const std::string bl = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";
  Parts p;
  p.pretok = nested_sequence(100000, "pretokenizers", bl);
  EXPECT_HAS(load_error(tokenizer_json(p)), "malformed JSON: nested deeper than 256 levels");
  p = {};
  p.normalizer = nested_sequence(100000, "normalizers", R"({"type":"Prepend","prepend":"x"})");
  EXPECT_HAS(load_error(tokenizer_json(p)), "malformed JSON: nested deeper than 256 levels");
  // Nesting inside the limit still works (each Sequence is two JSON levels).
  p = {};
  p.pretok = nested_sequence(100, "pretokenizers", bl);
  Tokenizer t = Tokenizer::from_file(write_tmp("nest_ok.json", tokenizer_json(p)));
  EXPECT_EQ(t.encode("ab"), std::vector<int32_t>{256});
}

TEST(TokenizerHostile, WrongJsonTypesAreTokenizerErrors) {
  auto err = [](auto edit) {
    Parts p;
    edit(p);
    return load_error(tokenizer_json(p));
  };
  EXPECT_HAS(err([](Parts& p) { p.pretok = R"({"type":"ByteLevel","add_prefix_space":"yes"})"; }),
             "add_prefix_space: expected a boolean");
  EXPECT_HAS(err([](Parts& p) { p.pretok = R"({"type":"Sequence","pretokenizers":{"a":1}})"; }),
             "pre_tokenizer.pretokenizers: expected an array");
  EXPECT_HAS(err([](Parts& p) {
               p.pretok = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":5},"behavior":"Isolated"},)"
                          R"({"type":"ByteLevel"}]})";
             }),
             "pre_tokenizer.pretokenizers[0].pattern.Regex: expected a string");
  EXPECT_HAS(err([](Parts& p) { p.merges = R"([["a", 7]])"; }), "model.merges[0]: expected 'a b' or [a, b]");
  EXPECT_HAS(err([](Parts& p) { p.merges = R"({"a": "b"})"; }), "model.merges: expected an array");
  EXPECT_HAS(err([](Parts& p) { p.added = R"({"id": 3})"; }), "added_tokens: expected an array");
  EXPECT_HAS(err([](Parts& p) { p.added = R"([{"id":258,"content":"<x>","special":"no"}])"; }),
             "special: expected a boolean");
  EXPECT_HAS(err([](Parts& p) {
               p.post = R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}}],)"
                        R"("special_tokens":{"<s>":{"ids":"1"}}})";
             }),
             "expected an array");
}

TEST(TokenizerHostile, ConfigWithWrongTypes) {
  fs::path d = tmp_dir() / "cfg";
  fs::create_directories(d);
  std::ofstream(d / "tokenizer.json") << tokenizer_json({});
  std::ofstream(d / "tokenizer_config.json") << R"({"add_bos_token": "true", "bos_token": "<eos>"})";
  try {
    Tokenizer::from_file(d.string());
    ADD_FAILURE() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    EXPECT_HAS(std::string(e.what()), "tokenizer_config.json: add_bos_token: expected a boolean");
  }
  std::ofstream(d / "tokenizer_config.json", std::ios::trunc) << "{\"bos_token\": " + std::string(100000, '[') + "}";
  try {
    Tokenizer::from_file(d.string());
    ADD_FAILURE() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    EXPECT_HAS(std::string(e.what()), "nested deeper than 256 levels");
  }
}

TEST(TokenizerHostile, NamedPipeTokenizerFile) {
  fs::path d = tmp_dir() / "fifo";
  fs::create_directories(d);
  fs::remove(d / "tokenizer.json");
  ASSERT_EQ(::mkfifo((d / "tokenizer.json").c_str(), 0600), 0);
  auto t0 = std::chrono::steady_clock::now();
  try {
    Tokenizer::from_file(d.string());
    ADD_FAILURE() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    EXPECT_HAS(std::string(e.what()), "tokenizer.json: is a named pipe, not a regular file");
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST(TokenizerHostile, ChatTemplateDeepToolJson) {
  Tokenizer t = Tokenizer::from_file(write_tmp("chat.json", tokenizer_json({})));
  std::vector<Message> msgs(2);
  msgs[0].role = "system";
  msgs[0].tools_json = std::string(100000, '[') + std::string(100000, ']');
  msgs[1].role = "user";
  msgs[1].content = "hi";
  try {
    t.apply_chat_template(msgs);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_HAS(std::string(e.what()), "nested deeper than 256 levels");
  }
  msgs[0].tools_json.clear();
  msgs.emplace_back();
  msgs.back().role = "assistant";
  msgs.back().tool_calls.push_back({"", "f", "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}"});
  try {
    t.apply_chat_template(msgs);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_HAS(std::string(e.what()), "arguments: JSON nested deeper than 256 levels");
  }
}
