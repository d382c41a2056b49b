// Fuzzed conversations -> Tokenizer::apply_chat_template (the DeepSeek-V4 chat format) or
// apply_chat_template_v41 (V4.1's), picked by the input: roles,
// contents, reasoning, tool calls with JSON (or not) arguments, tools / response_format JSON and
// options all come from the input. Bad roles or JSON are InvalidArgument; an accepted prompt is
// valid UTF-8 whenever every input string was, and encodes without error.
#include <fuzzer/FuzzedDataProvider.h>

#include "core/strings.h"
#include "deepinfer/tokenizer.h"
#include "fuzz_util.h"

namespace {
const deepinfer::Tokenizer* tokenizer() {
  static const deepinfer::Tokenizer* t = [] {
    std::string p = di_fuzz::deepseek_tokenizer_path();
    if (p.empty()) {
      std::fprintf(stderr, "chat_template: shared data not found (set DEEPINFER_SHARED_DIR)\n");
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
  FuzzedDataProvider in(data, size);
  static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool", "bogus"};
  std::vector<Message> msgs(in.ConsumeIntegralInRange<size_t>(0, 6));
  bool all_valid = true;
  auto text = [&](size_t max_len) {
    std::string s = in.ConsumeRandomLengthString(max_len);
    all_valid &= first_invalid_utf8(s) == std::string::npos;
    return s;
  };
  for (Message& m : msgs) {
    m.role = kRoles[in.ConsumeIntegralInRange<size_t>(0, 5)];
    m.content = text(256);
    if (in.ConsumeBool()) m.reasoning_content = text(64);
    const size_t calls = in.ConsumeIntegralInRange<size_t>(0, 2);
    for (size_t k = 0; k < calls; ++k) m.tool_calls.push_back({text(8), text(16), text(256)});
    if (in.ConsumeBool()) m.tool_call_id = text(8);
    if (in.ConsumeBool()) m.tools_json = text(512);
    if (in.ConsumeBool()) m.response_format_json = text(256);
  }
  const bool v41 = in.ConsumeBool();  // the V4.1 format (chat_dsv41.cpp) or V4's
  const bool gen = in.ConsumeBool(), think = in.ConsumeBool(), drop = in.ConsumeBool(), bos = in.ConsumeBool();
  const std::string effort = in.PickValueInArray({"", "high", "max", "low", "1", "100", "101", "x"});
  const Tokenizer& t = *tokenizer();
  std::string prompt;
  const bool ok = di_fuzz::expect_named_error([&] {
    if (v41) prompt = t.apply_chat_template_v41(msgs, ChatOptionsV41{gen, think, effort, drop, bos});
    else prompt = t.apply_chat_template(msgs, ChatOptions{gen, think, effort, drop, bos});
  });
  if (!ok) return 0;
  if (all_valid) {
    FUZZ_ASSERT(first_invalid_utf8(prompt) == std::string::npos, "prompt is not valid UTF-8");
    (void)t.encode(prompt);
  }
  return 0;
}
