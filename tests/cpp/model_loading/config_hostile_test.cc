// Hostile config.json values and non-finite weights (issue #20): each is a named error within a
// time budget, never a crash (SIGFPE, stack overflow), a hang or NaN logits.
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/numeric.h"
#include "core/strings.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "model/deepseek_v4/weights.h"
#include "test_util.h"

using namespace deepinfer;
using namespace deepinfer::model::v4;
using namespace di_test;
using json = nlohmann::json;

namespace {
json base(CheckpointLayout layout) {
  DeepseekV4Config c = default_model_config(layout);
  c.vocab_size = 512;
  return json::parse(c.to_json_string());
}

// Parses `j` (as text) expecting a ConfigError within the budget; returns the message.
std::string config_error(const std::string& text, double budget_s = 2.0) {
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of<ConfigError>([&] { DeepseekV4Config::from_json_string(text, "m/config.json"); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), budget_s) << e;
  EXPECT_EQ(first_invalid_utf8(e), std::string::npos) << e;
  return e;
}
std::string config_error(const json& j) { return config_error(j.dump()); }

std::string deep(size_t depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); }

// `j` with key `k` replaced by raw JSON text `value` (for values nlohmann would not build).
std::string with_raw(json j, const std::string& k, const std::string& value) {
  j[k] = "@@RAW@@";
  std::string s = j.dump();
  size_t p = s.find("\"@@RAW@@\"");
  return s.replace(p, 9, value);
}
}  // namespace

TEST(ConfigHostile, BothLayoutsStillParse) {
  for (auto layout : {CheckpointLayout::kOfficial, CheckpointLayout::kTransformers})
    EXPECT_NO_THROW(DeepseekV4Config::from_json_string(base(layout).dump(), "m/config.json"));
}

TEST(ConfigHostile, DeepValuesInFields) {
  json j = base(CheckpointLayout::kOfficial);
  for (const char* field : {"vocab_size", "compress_ratios", "rope_scaling"})
    EXPECT_HAS(config_error(with_raw(j, field, deep(100000))),
               "m/config.json: not valid JSON: nested deeper than 256 levels");
  // A shallow but wrong value is quoted briefly.
  EXPECT_HAS(config_error(with_raw(j, "vocab_size", deep(40))), "field 'vocab_size': expected an integer, got [[[[");
}

TEST(ConfigHostile, WeightBlockSizeZeroIsAnErrorNotSigfpe) {
  json j = base(CheckpointLayout::kOfficial);
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {0, 0}}};
  EXPECT_HAS(config_error(j), "field 'quantization_config.weight_block_size': block edge must be in [1, 4096], got [0,0]");
  j["quantization_config"]["weight_block_size"] = {-128, -128};
  EXPECT_HAS(config_error(j), "weight_block_size");
  j["quantization_config"]["quant_method"] = 7;
  EXPECT_HAS(config_error(j), "quantization_config.quant_method");
}

TEST(ConfigHostile, BoundedIterationsAndPositiveReals) {
  json j = base(CheckpointLayout::kTransformers);
  auto err = [&](const char* k, json v) {
    json c = j;
    c[k] = v;
    return config_error(c);
  };
  EXPECT_HAS(err("hc_sinkhorn_iters", 1e12), "field 'hc_sinkhorn_iters': must be <= 10000");
  EXPECT_HAS(err("rms_norm_eps", -1), "field 'rms_norm_eps': must be > 0");
  EXPECT_HAS(err("rms_norm_eps", 0), "field 'rms_norm_eps': must be > 0");
  EXPECT_HAS(err("hc_eps", 0), "field 'hc_eps': must be > 0");
  json hf = j;
  hf["rope_parameters"]["main"]["rope_theta"] = 0;  // the transformers layout's own spelling
  EXPECT_HAS(config_error(hf), "field 'rope_theta': must be > 0");
  hf = j;
  hf["rope_parameters"]["compress"]["rope_theta"] = -5;
  EXPECT_HAS(config_error(hf), "field 'compress_rope_theta': must be > 0");
  json off = base(CheckpointLayout::kOfficial);
  off["rope_theta"] = 0;
  EXPECT_HAS(config_error(off), "field 'rope_theta': must be > 0");
  EXPECT_HAS(err("routed_scaling_factor", 0), "field 'routed_scaling_factor': must be > 0");
  EXPECT_HAS(err("swiglu_limit", -1), "field 'swiglu_limit': must be >= 0");
  EXPECT_HAS(err("partial_rotary_factor", 7), "field 'partial_rotary_factor': must be in (0, 1]");
  // A number past double's range is named by its field (core/json.cpp json_number_out_of_range).
  EXPECT_HAS(config_error(with_raw(j, "rms_norm_eps", "1e999")),
             "field 'rms_norm_eps': the number 1e999 (at byte");
  EXPECT_HAS(config_error(with_raw(j, "rms_norm_eps", "1e999")), "is outside the range of a double");
}

TEST(ConfigHostile, IntegersOutOfRange) {
  json j = base(CheckpointLayout::kOfficial);
  auto err = [&](const char* k, const std::string& raw) { return config_error(with_raw(j, k, raw)); };
  EXPECT_HAS(err("vocab_size", "18446744073709551615"), "field 'vocab_size': integer 18446744073709551615 is out of range");
  EXPECT_HAS(err("vocab_size", "1e300"), "field 'vocab_size': expected an integer, got 1e+300");
  EXPECT_HAS(err("hidden_size", "1099511627776"), "field 'hidden_size': must be <= 16777216");
  EXPECT_HAS(err("num_hidden_layers", "100000"), "num_hidden_layers=100000");
  EXPECT_HAS(err("eos_token_id", "512"), "field 'eos_token_id': 512 is not a token id in [0, vocab_size=512)");
  EXPECT_HAS(err("bos_token_id", "-1"), "field 'bos_token_id'");
  json c = j;
  c["compress_ratios"][0] = int64_t(1) << 40;
  EXPECT_HAS(config_error(c), "field 'compress_ratios[0]': invalid ratio");
}

TEST(ConfigHostile, ConfigFileThatIsANamedPipe) {
  fs::path d = fresh_dir("cfg_fifo");
  ASSERT_EQ(::mkfifo((d / "config.json").c_str(), 0600), 0);
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of<ConfigError>([&] { DeepseekV4Config::from_file(d.string()); });
  EXPECT_HAS(e, "config.json: is a named pipe, not a regular file");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// ---- finite weights ----

namespace {
fs::path make_checkpoint(const std::string& name) {
  fs::path d = fresh_dir(name);
  DeepseekV4Config c = default_model_config(CheckpointLayout::kTransformers);
  c.vocab_size = 512;
  write_random_checkpoint(d.string(), c, {.seed = 3, .layout = CheckpointLayout::kTransformers, .dtype = DType::kBF16});
  return d;
}

// Rewrites `name` in model.safetensors with element `at` set to `v` (in the tensor's dtype).
void poke(const fs::path& d, const std::string& name, int64_t at, float v) {
  io::SafetensorsWriter w;
  {
    auto f = io::SafetensorsFile::open((d / "model.safetensors").string());
    for (const auto& ti : f->tensors()) {
      Tensor t = f->tensor(ti).contiguous();
      if (ti.name == name) {
        Tensor copy = Tensor::empty(t.shape(), t.dtype());
        std::memcpy(copy.raw_data(), t.raw_data(), t.nbytes());
        ASSERT_TRUE(t.dtype() == DType::kBF16 || t.dtype() == DType::kF32);
        if (t.dtype() == DType::kF32) copy.data<float>()[at] = v;
        else copy.data<uint16_t>()[at] = f32_to_bf16(v);
        t = copy;
      }
      w.add(ti.name, t);
    }
  }
  w.write((d / "model.safetensors").string());
}

DeepseekV4Weights load(const fs::path& d) {
  return DeepseekV4Weights::load(d.string(), DeepseekV4Config::from_file(d.string()), {.progress = false});
}
}  // namespace

TEST(FiniteWeights, NanAndInfNameFileTensorAndElement) {
  fs::path d = make_checkpoint("nan");
  EXPECT_NO_THROW(load(d));
  const std::string t = "model.layers.1.self_attn.kv_proj.weight";
  poke(d, t, 37, std::nanf(""));
  std::string e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "model.safetensors: tensor '" + t + "' holds NaN at element 37");
  poke(d, t, 37, 1.0f);
  poke(d, "model.norm.weight", 5, -INFINITY);
  e = error_of<CheckpointError>([&] { load(d); });
  EXPECT_HAS(e, "tensor 'model.norm.weight' holds Inf at element 5");
}
