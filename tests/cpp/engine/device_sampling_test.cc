// Host-side checks of the device-sampling switch (the GPU comparison itself is
// tests/cpp/cuda_model/engine_gpu_test.cc): the DEEPINFER_DEVICE_SAMPLING parser, and that a
// model without device logits (the toy model, the CPU model) always samples on the host.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.h"
#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (const char* old = std::getenv("DEEPINFER_DEVICE_SAMPLING")) saved = old, had = true;
    if (value) setenv("DEEPINFER_DEVICE_SAMPLING", value, 1);
    else unsetenv("DEEPINFER_DEVICE_SAMPLING");
  }
  ~EnvGuard() {
    if (had) setenv("DEEPINFER_DEVICE_SAMPLING", saved.c_str(), 1);
    else unsetenv("DEEPINFER_DEVICE_SAMPLING");
  }
  std::string saved;
  bool had = false;
};
}  // namespace

TEST(DeviceSampling, EnvSwitchParses) {
  {
    EnvGuard g(nullptr);
    EXPECT_TRUE(EnvConfig::from_environment().device_sampling);
  }
  {
    EnvGuard g("1");
    EXPECT_TRUE(EnvConfig::from_environment().device_sampling);
  }
  {
    EnvGuard g("0");
    EXPECT_FALSE(EnvConfig::from_environment().device_sampling);
  }
  {
    EnvGuard g("maybe");
    EXPECT_THROW(EnvConfig::from_environment(), InvalidArgument);
    LLMConfig c;
    c.model = "builtin:toy";
    EXPECT_THROW({ LLM llm(c); }, InvalidArgument);
  }
}

TEST(DeviceSampling, ModelWithoutDeviceLogitsSamplesOnHost) {
  EngineConfig ec;
  ec.device_sampling = true;
  Engine eng(ec, std::make_unique<ToyModel>(), make_toy_codec(320));
  EXPECT_FALSE(eng.model().supports_device_logits());
  EXPECT_EQ(eng.runner().device_sampler(), nullptr);
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 5;
  p.max_tokens = 6;
  p.ignore_eos = true;
  eng.add_request("a", PromptInput::from_token_ids({0, 70, 71}), p, 0);
  while (eng.has_unfinished()) eng.step();
  EXPECT_EQ(eng.runner().stats().device_steps, 0);
  EXPECT_EQ(eng.runner().stats().host_steps, 6);
  EXPECT_THROW(eng.model().forward_device(model::ForwardBatch{}), InternalError);
}
