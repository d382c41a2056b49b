// Arbitrary bytes -> encode / decode / DecodeStream on the DeepSeek-V3 tokenizer (shared data).
// Invalid UTF-8 must be a TokenizerError; for valid text: ids in range, decode(encode(t)) == t
// when no added token matched (they may strip whitespace), and the streamed pieces concatenate
// to decode(ids); encode(t, add_special_tokens=true) is exactly the fixed framing (the ids
// encode("a", true) puts around encode("a")) around encode(t).
//
// Speed (docs/HARDENING.md, long runs): the tokenizer is loaded once, in LLVMFuzzerInitialize;
// the add_special_tokens encode, which repeats the whole BPE work of the first, runs only for
// inputs up to kFramingCheckBytes (the framing does not depend on the text, so a short input
// checks it as well as a long one); src/tokenizer/bpe.cpp is built without comparison tracing
// (tests/fuzz/CMakeLists.txt), which was 60% of the time on long words.
#include <algorithm>
#include <cstdio>

#include "deepinfer/tokenizer.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer_impl.h"

namespace {
const deepinfer::Tokenizer* tokenizer() {
  static const deepinfer::Tokenizer* t = [] {
    std::string p = di_fuzz::deepseek_tokenizer_path();
    if (p.empty()) {
      std::fprintf(stderr, "tokenizer_text: shared data not found (set DEEPINFER_SHARED_DIR)\n");
      std::exit(2);
    }
    return new deepinfer::Tokenizer(deepinfer::Tokenizer::from_file(p));
  }();
  return t;
}

constexpr size_t kFramingCheckBytes = 512;

// The ids add_special_tokens=true puts before and after the text's own ids.
struct Framing {
  std::vector<int32_t> prefix, suffix;
};
const Framing& framing() {
  static const Framing f = [] {
    const deepinfer::Tokenizer& t = *tokenizer();
    const std::vector<int32_t> plain = t.encode("a"), framed = t.encode("a", true);
    auto at = std::search(framed.begin(), framed.end(), plain.begin(), plain.end());
    if (plain.empty() || at == framed.end()) {
      std::fprintf(stderr, "tokenizer_text: encode(\"a\", true) does not contain encode(\"a\")\n");
      std::exit(2);
    }
    return Framing{{framed.begin(), at}, {at + std::ptrdiff_t(plain.size()), framed.end()}};
  }();
  return f;
}
}  // namespace

// Loading the 7.5 MB tokenizer takes seconds under ASan: done here, outside libFuzzer's -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
  framing();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  const Tokenizer& t = *tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  if (!di_fuzz::expect_named_error([&] { ids = t.encode(text); })) return 0;
  bool added = false;
  for (int32_t id : ids) {
    FUZZ_ASSERT(id >= 0 && id < t.vocab_size(), "id %d", id);
    added |= (t.impl().flags[size_t(id)] & Tokenizer::Impl::kAdded) != 0;
  }
  const std::string back = t.decode(ids);
  if (!added) FUZZ_ASSERT(back == text, "decode(encode(text)) differs (%zu vs %zu bytes)", back.size(), text.size());
  DecodeStream ds(t);
  std::string streamed;
  for (int32_t id : ids) streamed += ds.step(id);
  streamed += ds.finish();
  FUZZ_ASSERT(streamed == back, "DecodeStream pieces differ from decode");
  if (size <= kFramingCheckBytes) {
    const Framing& f = framing();
    std::vector<int32_t> want = f.prefix;
    want.insert(want.end(), ids.begin(), ids.end());
    want.insert(want.end(), f.suffix.begin(), f.suffix.end());
    FUZZ_ASSERT(t.encode(text, true) == want, "add_special_tokens=true is not the framing around encode(text)");
  }
  return 0;
}
