// Tokenizer unit tests: known ids (from HF tokenizers), BPE fast path vs its reference, UTF-8
// handling, streaming, bad files and bad text. Parity on the big corpus lives in
// tests/python/test_tokenizer_parity.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "deepinfer/tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

using namespace deepinfer;
namespace fs = std::filesystem;

namespace {
fs::path shared_dir() {
  const char* s = std::getenv("DEEPINFER_SHARED_DIR");
  if (s) return s;
  const char* src = std::getenv("DEEPINFER_SOURCE_DIR");
  return fs::path(src ? src : ".") / ".." / "shared";
}
fs::path ds_path() { return shared_dir() / "data" / "tokenizers" / "deepseek-v3" / "tokenizer.json"; }
fs::path gpt2_path() { return shared_dir() / "data" / "tokenizers" / "gpt2" / "encoder.json"; }

const Tokenizer& ds() {
  static Tokenizer t = Tokenizer::from_file(ds_path().string());
  return t;
}
#define NEED_SHARED()                                                                   \
  if (!fs::exists(ds_path()) || !fs::exists(gpt2_path()))                               \
  GTEST_SKIP() << "shared tokenizer data not found under " << shared_dir()              \
               << " (set DEEPINFER_SHARED_DIR)"

std::string write_tmp(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / ("di_tok_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// A tiny valid byte-level tokenizer.json with `model_type` and `pretok` spliced in.
std::string tiny_json(const std::string& model_type = "BPE",
                      const std::string& pretok = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})") {
  std::string vocab = "{";
  const auto& ab = tok::ByteAlphabet::get();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tok::append_utf8(s, ab.byte_to_cp[b]);
    if (s == "\"" || s == "\\") s = "\\" + s;
    vocab += "\"" + s + "\":" + std::to_string(b) + ",";
  }
  vocab += "\"ab\":256}";
  return R"({"model":{"type":")" + model_type + R"(","vocab":)" + vocab + R"(,"merges":["a b"]},"pre_tokenizer":)" +
         pretok + R"(,"decoder":{"type":"ByteLevel"},"added_tokens":[{"id":257,"content":"<eos>","special":true}]})";
}
}  // namespace

TEST(Tokenizer, KnownIdsMatchHuggingFace) {
  NEED_SHARED();
  // Reference ids from HF tokenizers 0.23 on the same file.
  EXPECT_EQ(ds().encode("Hello, world!  123456 foo\n\n  bar"),
            (std::vector<int32_t>{19923, 14, 2058, 3, 262, 6895, 18009, 52735, 271, 223, 4758}));
  EXPECT_EQ(ds().encode("<｜User｜>hi<｜Assistant｜>"), (std::vector<int32_t>{128803, 6366, 128804}));
  EXPECT_EQ(ds().encode("Привет мир"), (std::vector<int32_t>{24797, 8919, 74779}));
  EXPECT_EQ(ds().encode("hi", /*add_special_tokens=*/true), (std::vector<int32_t>{0, 6366}));
  EXPECT_EQ(ds().encode(""), std::vector<int32_t>{});
}

TEST(Tokenizer, Gpt2PairLoads) {
  NEED_SHARED();
  Tokenizer g = Tokenizer::from_file(gpt2_path().string());
  EXPECT_EQ(g.vocab_size(), 50257);
  EXPECT_EQ(g.eos_id(), 50256);
  auto ids = g.encode("Hello world<|endoftext|>");
  EXPECT_EQ(ids, (std::vector<int32_t>{15496, 995, 50256}));
  EXPECT_EQ(g.decode(ids), "Hello world<|endoftext|>");
  EXPECT_EQ(g.decode(ids, /*skip_special_tokens=*/true), "Hello world");
}

TEST(Tokenizer, BpeFastPathMatchesReference) {
  NEED_SHARED();
  const auto& bpe = ds().impl().bpe;
  std::mt19937 rng(7);
  const char* alphabet[] = {"a", "e", "t", "h", " ", "in", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "0", "\n", "é"};
  std::vector<int32_t> fast, ref, scratch;
  for (int it = 0; it < 3000; ++it) {
    std::string w;
    int n = int(rng() % (it % 10 == 0 ? 400 : 24)) + 1;  // some words take the long (heap) path
    for (int k = 0; k < n; ++k) w += alphabet[rng() % std::size(alphabet)];
    fast.clear();
    ref.clear();
    bpe.encode_word(w, fast, scratch);
    bpe.encode_word_reference(w, ref);
    ASSERT_EQ(fast, ref) << "word: " << w;
  }
}

TEST(Tokenizer, InvalidUtf8TextIsRejectedWithOffset) {
  NEED_SHARED();
  try {
    ds().encode("good\xC3(bad");
    FAIL() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ds().encode("\xED\xA0\x80"), TokenizerError);  // encoded surrogate
  EXPECT_THROW(ds().encode("\xC0\xAF"), TokenizerError);      // overlong
  std::vector<std::string> batch = {"ok", "bad\xFF"};
  EXPECT_THROW(ds().encode_batch(batch, false, 2), TokenizerError);
}

TEST(Utf8, LossyDecodeFollowsMaximalSubpartRule) {
  auto lossy = [](std::string_view s) {
    std::string o;
    tok::append_lossy(o, s);
    return o;
  };
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("a\xF0\x90\x80" "b"), "a" + R + "b");  // truncated 4-byte sequence: one U+FFFD
  EXPECT_EQ(lossy("\xE0\x80"), R + R);                   // E0 80 is not a valid prefix
  EXPECT_EQ(lossy("\xFF\xFE"), R + R);
  EXPECT_EQ(lossy("\xE4\xB8\xAD"), "\xE4\xB8\xAD");
}

TEST(Tokenizer, DecodeStreamConcatenatesToDecode) {
  NEED_SHARED();
  std::mt19937 rng(11);
  std::vector<int32_t> specials = ds().special_ids();
  for (int it = 0; it < 3000; ++it) {
    std::vector<int32_t> ids;
    int n = int(rng() % 20);
    for (int k = 0; k < n; ++k) {
      int32_t id = rng() % 8 == 0 ? specials[rng() % specials.size()] : int32_t(rng() % ds().vocab_size());
      if (!ds().token_bytes(id).empty()) ids.push_back(id);
    }
    for (bool skip : {false, true}) {
      DecodeStream st(ds(), skip);
      std::string all;
      for (int32_t id : ids) all += st.step(id);
      all += st.finish();
      ASSERT_EQ(all, ds().decode(ids, skip));
    }
  }
  // A multi-byte character split over tokens appears only once complete.
  DecodeStream st(ds());
  std::string text = "👨‍👩‍👧 中文";
  std::string got;
  for (int32_t id : ds().encode(text)) {
    std::string piece = st.step(id);
    EXPECT_EQ(tok::find_invalid_utf8(piece), std::string::npos);
    got += piece;
  }
  EXPECT_EQ(got + st.finish(), text);
}

TEST(Tokenizer, TokenBytesForEveryId) {
  NEED_SHARED();
  EXPECT_EQ(ds().token_bytes(*ds().token_to_id("Ġthe")), " the");
  EXPECT_EQ(ds().token_bytes(0), "<｜begin▁of▁sentence｜>");
  EXPECT_TRUE(ds().is_special(0));
  int empty = 0;
  for (int32_t i = 0; i < ds().vocab_size(); ++i) empty += ds().token_bytes(i).empty();
  EXPECT_EQ(empty, 0);
  EXPECT_THROW(ds().token_bytes(ds().vocab_size()), InvalidArgument);
  EXPECT_THROW(ds().decode(std::vector<int32_t>{1, -5}), InvalidArgument);
}

TEST(Tokenizer, CloneAndBatchAgree) {
  NEED_SHARED();
  Tokenizer c = ds().clone();
  std::vector<std::string> texts = {"one two", "中文 <｜User｜> x", "  \n\t 123456789", "emoji 🙏🏻"};
  auto batch = c.encode_batch(texts, false, 2);
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], ds().encode(texts[i]));
}

TEST(Tokenizer, BadFilesGiveClearErrors) {
  auto expect_err = [](const std::string& path, const std::string& needle) {
    try {
      Tokenizer::from_file(path);
      ADD_FAILURE() << "expected TokenizerError for " << path;
    } catch (const TokenizerError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_err("/nonexistent/tokenizer.json", "not found");
  expect_err(write_tmp("malformed.json", "{\"model\": [1, 2"), "malformed JSON");
  expect_err(write_tmp("unigram.json", tiny_json("WordPiece")), "unsupported model type 'WordPiece'");
  expect_err(write_tmp("pretok.json", tiny_json("BPE", R"({"type":"BertPreTokenizer"})")),
             "unsupported pre_tokenizer type 'BertPreTokenizer'");
  expect_err(write_tmp("nobl.json", tiny_json("BPE", "null")), "no ByteLevel step");
  Tokenizer t = Tokenizer::from_file(write_tmp("ok.json", tiny_json()));
  EXPECT_EQ(t.encode("abab<eos>"), (std::vector<int32_t>{256, 256, 257}));
  EXPECT_EQ(t.decode(t.encode("abab<eos>")), "abab<eos>");
}

TEST(Regex, OnigTranslation) {
  EXPECT_EQ(tok::translate_onig(R"(\s+(?!\S))"), R"([\s\x{85}]+(?![^\s\x{85}]))");
  EXPECT_EQ(tok::translate_onig(R"([^\s\p{L}])").substr(0, 13), R"([^\s\x{85}\p{)");
  std::vector<std::pair<uint32_t, uint32_t>> m;
  tok::Regex("\\s+", "test").find_all("a\xC2\x85 b", m);  // U+0085 is whitespace for Oniguruma
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<uint32_t, uint32_t>{1, 4}));
}

TEST(ChatTemplate, DeepSeekV4Turns) {
  NEED_SHARED();
  std::vector<Message> msgs(2);
  msgs[0].role = "system";
  msgs[0].content = "S";
  msgs[1].role = "user";
  msgs[1].content = "hi";
  EXPECT_EQ(ds().apply_chat_template(msgs), "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜></think>");
  ChatOptions think;
  think.thinking = true;
  EXPECT_EQ(ds().apply_chat_template(msgs, think), "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜><think>");
  msgs[1].role = "wizard";
  EXPECT_THROW(ds().apply_chat_template(msgs), InvalidArgument);
}
