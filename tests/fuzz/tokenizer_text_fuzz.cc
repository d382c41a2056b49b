// Arbitrary bytes -> encode / decode / DecodeStream on the DeepSeek-V3 tokenizer (shared data).
// Invalid UTF-8 must be a TokenizerError; for valid text: ids in range, decode(encode(t)) == t
// when no added token matched (they may strip whitespace), and the streamed pieces concatenate
// to decode(ids).
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
}  // namespace

// Loading the 7.5 MB tokenizer takes seconds under ASan: done here, outside libFuzzer's -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer();
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
  std::vector<int32_t> with_bos = t.encode(text, true);
  FUZZ_ASSERT(with_bos.size() >= ids.size(), "add_special_tokens lost ids");
  return 0;
}
