#include "model/registry.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/family.h"
#include "model/deepseek_v41/family.h"

namespace deepinfer::model {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {v4::family(), v41::family()};
  return families;
}

std::string config_architecture(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) DI_THROW(ConfigError, path, ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) DI_THROW(ConfigError, path, ": not a JSON object");
  const auto it = j.find("architectures");
  if (it == j.end()) return "";  // older configs: families decide by model_type
  if (!it->is_array() || it->empty() || !(*it)[0].is_string())
    DI_THROW(ConfigError, path, ": field 'architectures' must be a non-empty array of strings");
  return (*it)[0].get<std::string>();
}

std::unique_ptr<CausalLM> load_model(const std::string& dir, const ModelLoadOptions& options) {
  const std::string arch = config_architecture(dir);
  std::string known;
  for (const ModelFamily& f : model_families())
    for (const std::string& a : f.architectures) {
      if (a == arch || arch.empty()) return f.load(dir, options);
      known += (known.empty() ? "" : ", ") + a;
    }
  DI_THROW(ConfigError, dir, "/config.json: architecture '", arch, "' is not supported; this build knows ", known);
}

bool use_accelerator(const ModelLoadOptions& o) {
  switch (o.env.accelerator) {
    case Accelerator::kNvidia: return true;
    case Accelerator::kAuto:
      if (accelerator_count() > 0) return true;
      DI_INFO("DEEPINFER_ACCELERATOR=auto: the model runs on the CPU (", accelerator_unavailable_reason(),
              "); DEEPINFER_ACCELERATOR=cpu silences this");
      return false;
    default: return false;
  }
}

}  // namespace deepinfer::model
