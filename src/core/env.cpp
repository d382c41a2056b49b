#include "core/env.h"

#include <cstdlib>
#include <string>

#include "core/check.h"

namespace deepinfer {
namespace {
const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}
bool parse_bool(const char* name, const char* v) {
  std::string s(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  DI_THROW(InvalidArgument, "environment variable ", name, "='", s, "' is not a boolean (use 0 or 1)");
}
int parse_int(const char* name, const char* v, int lo, int hi) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (!end || *end || x < lo || x > hi)
    DI_THROW(InvalidArgument, "environment variable ", name, "='", v, "' must be an integer in [", lo, ", ", hi, "]");
  return int(x);
}
}  // namespace

const char* accelerator_name(Accelerator a) {
  switch (a) {
    case Accelerator::kAuto: return "auto";
    case Accelerator::kCPU: return "cpu";
    case Accelerator::kNvidia: return "nvidia";
    case Accelerator::kAscend: return "ascend";
  }
  return "?";
}

EnvConfig EnvConfig::from_environment() {
  EnvConfig c;
  if (const char* v = get("DEEPINFER_ACCELERATOR")) {
    std::string s(v);
    if (s == "cpu") c.accelerator = Accelerator::kCPU;
    else if (s == "nvidia" || s == "cuda") c.accelerator = Accelerator::kNvidia;
    else if (s == "ascend") c.accelerator = Accelerator::kAscend;
    else DI_THROW(InvalidArgument, "DEEPINFER_ACCELERATOR='", s, "' is not one of: nvidia, cpu, ascend");
  }
  if (const char* v = get("DEEPINFER_HF_MODEL_DIR")) c.hf_model_dir = v;
  if (const char* v = get("DEEPINFER_USE_NEXTN_DECODE")) c.use_nextn_decode = parse_int("DEEPINFER_USE_NEXTN_DECODE", v, 0, 16);
  if (const char* v = get("DEEPINFER_ENABLE_MTP_VARLEN")) c.enable_mtp_varlen = parse_bool("DEEPINFER_ENABLE_MTP_VARLEN", v);
  if (const char* v = get("DEEPINFER_BATCH_INVARIANT")) c.batch_invariant = parse_bool("DEEPINFER_BATCH_INVARIANT", v);
  if (const char* v = get("DEEPINFER_ASYNC_SCHEDULING")) c.async_scheduling = parse_bool("DEEPINFER_ASYNC_SCHEDULING", v);
  if (const char* v = get("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE")) c.yoco_truncation_mode = v;
  if (const char* v = get("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS"))
    c.yoco_keep_tokens = parse_int("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", v, 0, 1 << 20);
  if (const char* v = get("DEEPINFER_CUDA_GRAPHS")) c.cuda_graphs = parse_bool("DEEPINFER_CUDA_GRAPHS", v);
  if (const char* v = get("DEEPINFER_DEVICE_SAMPLING")) c.device_sampling = parse_bool("DEEPINFER_DEVICE_SAMPLING", v);
  return c;
}

}  // namespace deepinfer
