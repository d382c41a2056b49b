// DeepSeek-V4.1 config.json text -> DeepseekV41Config::from_json_string; an accepted config must
// describe itself (summary, schedule) without anything but named errors.
#include "fuzz_util.h"
#include "model/deepseek_v41/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::model::v41;
  const std::string text(reinterpret_cast<const char*>(data), size);
  di_fuzz::expect_named_error([&] {
    DeepseekV41Config c = DeepseekV41Config::from_json_string(text, "fuzz/config.json");
    (void)c.summary();
    (void)c.schedule_str();
  });
  return 0;
}
