// DeepSeek-V4 config.json text -> DeepseekV4Config::from_json_string. An accepted config must
// describe itself and round-trip through to_json_string (the documented contract).
#include "fuzz_util.h"
#include "model/deepseek_v4/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::model::v4;
  const std::string text(reinterpret_cast<const char*>(data), size);
  DeepseekV4Config c;
  if (!di_fuzz::expect_named_error([&] { c = DeepseekV4Config::from_json_string(text, "fuzz/config.json"); })) return 0;
  FUZZ_ASSERT(int64_t(c.layer_types.size()) == c.num_layers && int64_t(c.compress_ratio.size()) == c.num_layers &&
                  int64_t(c.mlp_types.size()) == c.num_layers,
              "per-layer tables do not match num_layers=%lld", (long long)c.num_layers);
  (void)c.summary();
  (void)c.schedule_str();
  DeepseekV4Config back = DeepseekV4Config::from_json_string(c.to_json_string(), "fuzz/round_trip.json");
  FUZZ_ASSERT(back.vocab_size == c.vocab_size && back.hidden_size == c.hidden_size && back.num_layers == c.num_layers &&
                  back.layer_types == c.layer_types && back.compress_ratio == c.compress_ratio &&
                  back.mlp_types == c.mlp_types && back.fp8_block == c.fp8_block,
              "to_json_string does not round-trip");
  return 0;
}
