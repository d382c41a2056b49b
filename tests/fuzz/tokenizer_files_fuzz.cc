// tokenizer.json + tokenizer_config.json -> Tokenizer::from_file. The input holds both files,
// split at the first NUL byte (no NUL: no tokenizer_config.json). An accepted tokenizer must
// encode and decode a few fixed texts without anything but named errors.
#include "deepinfer/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  static const auto dir = [] {
    auto d = di_fuzz::scratch_dir() / "tok";
    std::filesystem::create_directories(d);
    return d;
  }();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t nul = in.find('\0');
  di_fuzz::write_file(dir / "tokenizer.json", in.substr(0, nul));
  std::error_code ec;
  if (nul == std::string_view::npos) std::filesystem::remove(dir / "tokenizer_config.json", ec);
  else di_fuzz::write_file(dir / "tokenizer_config.json", in.substr(nul + 1));
  di_fuzz::expect_named_error([&] {
    Tokenizer t = Tokenizer::from_file(dir.string());
    for (std::string_view text : {"Hello world", "  a\tb\n\n", "naïve 東京 1234", ""}) {
      di_fuzz::expect_named_error([&] {
        std::vector<int32_t> ids = t.encode(text, true);
        for (int32_t id : ids) FUZZ_ASSERT(id >= 0 && id < t.vocab_size(), "id %d of %d", id, t.vocab_size());
        (void)t.decode(ids);
      });
    }
  });
  return 0;
}
