// The model registry: families by config.json `architectures`, clear errors for unknown ones, and
// the backend choice from the options.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "deepinfer/error.h"
#include "golden.h"
#include "model/registry.h"

namespace deepinfer::model {
namespace {

TEST(Registry, LoadsAFixtureAndRefusesUnknownArchitectures) {
  const std::string dir = deepinfer::testing::golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture absent";
  ModelLoadOptions o;
  o.env.accelerator = Accelerator::kCPU;
  o.progress = false;
  auto m = load_model(dir, o);
  ASSERT_TRUE(m);
  EXPECT_NE(m->describe().find("DeepseekV4ForCausalLM"), std::string::npos) << m->describe();
  // An unknown architecture: the error names it and lists the known ones.
  const std::string bad = ::testing::TempDir() + "/registry_unknown";
  std::filesystem::create_directories(bad);
  std::ofstream(bad + "/config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  try {
    load_model(bad, o);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("LlamaForCausalLM"), std::string::npos) << w;
    EXPECT_NE(w.find("DeepseekV4ForCausalLM"), std::string::npos) << w;
  }
  std::ofstream(bad + "/config.json") << R"({"architectures": 3})";
  EXPECT_THROW(config_architecture(bad), ConfigError);
}

TEST(Registry, AcceleratorChoice) {
  ModelLoadOptions o;
  o.env.accelerator = Accelerator::kCPU;
  EXPECT_FALSE(use_accelerator(o));
  o.env.accelerator = Accelerator::kNvidia;
  EXPECT_TRUE(use_accelerator(o));
  o.env.accelerator = Accelerator::kAuto;
  EXPECT_EQ(use_accelerator(o), accelerator_count() > 0);
}

}  // namespace
}  // namespace deepinfer::model
