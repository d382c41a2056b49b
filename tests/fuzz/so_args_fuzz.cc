// so_args -> GrammarCompiler::compile -> a GrammarMatcher walked for up to 48 tokens over a
// byte-level vocabulary plus a few multi-byte tokens. The first input byte picks the form:
// 0 regex, 1 JSON schema text, 2 EBNF (GBNF), 3 Lark, 4 choice (lines), 5 raw so_args JSON;
// the rest is its text. Oracle: every token the mask allows is accepted by accept_token, a
// disallowed one is refused without a state change, and rollback restores the step count.
// (Exercises src/structured, another helper's code: crashes found here are reported to them.)
#include <fuzzer/FuzzedDataProvider.h>

#include <nlohmann/json.hpp>

#include "deepinfer/structured.h"
#include "fuzz_util.h"

namespace {
using namespace deepinfer;

structured::GrammarCompiler& compiler() {
  static structured::GrammarCompiler* c = [] {
    structured::TokenizerInfo info = structured::byte_level_tokenizer_info();
    for (const char* s : {"\"a\"", "{\"", "\": ", "true", "null", "12", "ab", "\xc3\xa9", " \n"})
      info.token_bytes.push_back(s);
    return new structured::GrammarCompiler(structured::make_vocabulary(std::move(info)),
                                           {.time_limit_ms = 2000, .cache_capacity = 4});
  }();
  return *c;
}

std::string so_args_of(uint8_t kind, std::string_view text) {
  using json = nlohmann::json;
  constexpr auto kReplace = json::error_handler_t::replace;  // invalid UTF-8 -> U+FFFD
  const std::string s(text);
  switch (kind % 6) {
    case 0: return json{{"regex", s}}.dump(-1, ' ', false, kReplace);
    case 1: return json{{"json_schema", s}}.dump(-1, ' ', false, kReplace);
    case 2: case 3: return json{{"ebnf", s}}.dump(-1, ' ', false, kReplace);
    case 4: {
      json choices = json::array();
      size_t b = 0;
      for (size_t e; (e = s.find('\n', b)) != std::string::npos; b = e + 1) choices.push_back(s.substr(b, e - b));
      choices.push_back(s.substr(b));
      return json{{"choice", choices}}.dump(-1, ' ', false, kReplace);
    }
    default: return s;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider in(data + 1, size - 1);
  const std::string text = in.ConsumeRandomLengthString(4096);
  std::shared_ptr<const structured::CompiledGrammar> g;
  if (!di_fuzz::expect_named_error([&] { g = compiler().compile(so_args_of(data[0], text)); })) return 0;
  structured::GrammarMatcher m(g);
  const int32_t vocab = structured::vocabulary_size(*compiler().vocabulary());
  std::vector<int32_t> words(size_t(vocab + 31) / 32);
  for (int step = 0; step < 48 && !m.is_terminated(); ++step) {
    m.fill_next_token_bitmask(words);
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < vocab; ++t)
      if (words[size_t(t) / 32] >> (t % 32) & 1) allowed.push_back(t);
    const int32_t before = m.num_accepted();
    const int32_t probe = in.ConsumeIntegralInRange<int32_t>(0, vocab - 1);
    const bool mask_says = words[size_t(probe) / 32] >> (probe % 32) & 1;
    if (!mask_says) {
      FUZZ_ASSERT(!m.accept_token(probe), "token %d accepted but masked out", probe);
      FUZZ_ASSERT(m.num_accepted() == before, "a refused token changed the state");
    }
    if (allowed.empty()) break;
    const int32_t pick = allowed[in.ConsumeIntegralInRange<size_t>(0, allowed.size() - 1)];
    FUZZ_ASSERT(m.accept_token(pick), "token %d allowed by the mask but refused", pick);
    if (in.ConsumeBool() && m.num_accepted() > 0 && !m.is_terminated()) {
      m.rollback(1);
      FUZZ_ASSERT(m.num_accepted() == before, "rollback(1) did not restore the step count");
      FUZZ_ASSERT(m.accept_token(pick), "token %d refused after a rollback", pick);
    }
    if (in.remaining_bytes() == 0) break;
  }
  return 0;
}
