#include "core/env.h"

#include <cstdlib>
#include <string>

#include "core/check.h"

namespace deepinfer {
namespace {
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

void parse_accelerator(EnvConfig& e, const char* name, const char* v) {
  const std::string s(v);
  if (s == "cpu") e.accelerator = Accelerator::kCPU;
  else if (s == "nvidia" || s == "cuda") e.accelerator = Accelerator::kNvidia;
  else if (s == "ascend") e.accelerator = Accelerator::kAscend;
  else if (s == "auto") e.accelerator = Accelerator::kAuto;
  else DI_THROW(InvalidArgument, name, "='", s, "' is not one of: nvidia, cpu, ascend, auto");
}
void parse_log_level(EnvConfig& e, const char* name, const char* v) {
  const std::string s(v);
  if (s != "error" && s != "warn" && s != "info" && s != "debug")
    DI_THROW(InvalidArgument, name, "='", s, "' is not one of: error, warn, info, debug");
  e.log_level = s;
}

void parse_ep_exchange(EnvConfig& e, const char* name, const char* v) {
  const std::string s(v);
  if (s == "auto") e.ep_exchange = EpExchange::kAuto;
  else if (s == "host") e.ep_exchange = EpExchange::kHost;
  else if (s == "device") e.ep_exchange = EpExchange::kDevice;
  else DI_THROW(InvalidArgument, name, "='", s, "' is not one of: auto, host, device");
}

std::string none(const EnvConfig&, const KnobContext&) { return {}; }

// The table. A knob is refused only for the values that ask for a feature not built yet;
// when the feature lands, its refusal goes.
const EnvKnob kKnobs[] = {
    {"DEEPINFER_ACCELERATOR", "backend: nvidia (cuda) | cpu | auto (GPU when present); ascend is reserved",
     parse_accelerator,
     [](const EnvConfig& e, const KnobContext&) -> std::string {
       return e.accelerator == Accelerator::kAscend ? "this build has no Ascend backend (use nvidia, cpu or auto)" : "";
     }},
    {"DEEPINFER_HF_MODEL_DIR", "checkpoint folder used when LLMConfig.model is empty",
     [](EnvConfig& e, const char*, const char* v) { e.hf_model_dir = v; }, none},
    {"DEEPINFER_USE_NEXTN_DECODE", "maximum draft length of speculative decoding (0 = off; default 5 with a drafter)",
     [](EnvConfig& e, const char* n, const char* v) { e.use_nextn_decode = parse_int(n, v, 0, 16); },
     [](const EnvConfig& e, const KnobContext& c) -> std::string {
       if (e.use_nextn_decode.value_or(0) > 0 && c.model_has_drafter == false)
         return c.model + " has no drafter (a checkpoint without MTP blocks); set 0 or unset it";
       return "";
     }},
    {"DEEPINFER_ENABLE_MTP_VARLEN",
     "draft length per request and step from the drafter's calibrated confidence under a measured step-cost curve",
     [](EnvConfig& e, const char* n, const char* v) { e.enable_mtp_varlen = parse_bool(n, v); }, none},
    {"DEEPINFER_BATCH_INVARIANT", "logits independent of the batch (fixed reduction orders; docs/DETERMINISM.md)",
     [](EnvConfig& e, const char* n, const char* v) { e.batch_invariant = parse_bool(n, v); },
     [](const EnvConfig& e, const KnobContext&) -> std::string {
       // Variable draft lengths follow a step-level verify budget, so a request's drafts (and with
       // rejection sampling its tokens) would depend on its neighbours.
       return e.batch_invariant && e.enable_mtp_varlen
                  ? "cannot be deterministic with DEEPINFER_ENABLE_MTP_VARLEN=1 (draft lengths depend on the batch); "
                    "set one of them to 0"
                  : "";
     }},
    {"DEEPINFER_ASYNC_SCHEDULING", "plan step N+1 while the device runs step N (default 1; 0 = synchronous)",
     [](EnvConfig& e, const char* n, const char* v) { e.async_scheduling = parse_bool(n, v); }, none},
    {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE",
     "DeepSeek-V4.1 bounded replay: compact runs the layers after the candidate source over the last KEEP_TOKENS "
     "prompt positions only (full = every layer over every position, the default)",
     [](EnvConfig& e, const char* name, const char* v) {
       const std::string s(v);
       if (s != "compact" && s != "full") DI_THROW(InvalidArgument, name, "='", s, "' is not one of: compact, full");
       e.yoco_truncation_mode = s;
     },
     [](const EnvConfig& e, const KnobContext& c) -> std::string {
       if (e.yoco_truncation_mode != "compact" || c.model_replays != false) return "";
       return c.model + " has no bounded replay (DeepSeek-V4.1 with a candidate source only); unset it";
     }},
    {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS",
     "DeepSeek-V4.1 bounded replay: prompt positions the later layers run over (default 140; at least the "
     "sliding window + the maximum rollback)",
     [](EnvConfig& e, const char* n, const char* v) { e.yoco_keep_tokens = parse_int(n, v, 0, 1 << 20); },
     [](const EnvConfig& e, const KnobContext& c) -> std::string {
       if (!e.yoco_keep_tokens) return "";
       if (e.yoco_truncation_mode != "compact")
         return "has an effect only with DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact; set that or unset this";
       return c.model_replays == false ? c.model + " has no bounded replay; unset it" : "";
     }},
    {"DEEPINFER_CUDA_GRAPHS", "GPU decode through captured CUDA graphs (0 = eager); no effect on the CPU backend",
     [](EnvConfig& e, const char* n, const char* v) { e.cuda_graphs = parse_bool(n, v); }, none},
    {"DEEPINFER_DEVICE_SAMPLING", "sample on the GPU when the model keeps logits there (0 = host sampler)",
     [](EnvConfig& e, const char* n, const char* v) { e.device_sampling = parse_bool(n, v); }, none},
    {"DEEPINFER_DEVICE_DRAFT_SAMPLING",
     "sampled drafts and their rejection-sampling verify on the GPU with device sampling (0 = on the host)",
     [](EnvConfig& e, const char* n, const char* v) { e.device_draft_sampling = parse_bool(n, v); }, none},
    {"DEEPINFER_SPEC_ADAPTIVE",
     "speculative decoding: a request stops drafting (and re-probes later) while its measured acceptance "
     "cannot pay for the drafts (0 = always draft; unset = on for GPU models)",
     [](EnvConfig& e, const char* n, const char* v) { e.spec_adaptive = parse_bool(n, v); }, none},
    {"DEEPINFER_LOG_LEVEL", "log level: error | warn | info | debug", parse_log_level, none},
    // `device` on a group that cannot have the device exchange is refused when the backend joins
    // the group (the ranks' devices are known only then).
    {"DEEPINFER_EP_EXCHANGE",
     "expert parallelism on GPU ranks: device = NCCL all-to-all, host = staged through the host, auto (default) "
     "= device when every rank of the group has a GPU of its own and EPLB is off",
     parse_ep_exchange, none},
};
}  // namespace

std::span<const EnvKnob> env_knobs() { return kKnobs; }

const char* accelerator_name(Accelerator a) {
  switch (a) {
    case Accelerator::kAuto: return "auto";
    case Accelerator::kCPU: return "cpu";
    case Accelerator::kNvidia: return "nvidia";
    case Accelerator::kAscend: return "ascend";
  }
  return "?";
}

const char* ep_exchange_name(EpExchange x) {
  switch (x) {
    case EpExchange::kAuto: return "auto";
    case EpExchange::kHost: return "host";
    case EpExchange::kDevice: return "device";
  }
  return "?";
}

EnvConfig EnvConfig::parse(const std::function<const char*(const char* name)>& lookup) {
  EnvConfig c;
  for (const EnvKnob& k : kKnobs)
    if (const char* v = lookup(k.name); v && *v) k.parse(c, k.name, v);
  return c;
}

EnvConfig EnvConfig::from_environment() {
  return parse([](const char* name) { return std::getenv(name); });
}

void check_env_knobs(const EnvConfig& env, const KnobContext& ctx) {
  std::string msg;
  for (const EnvKnob& k : kKnobs)
    if (std::string why = k.refusal(env, ctx); !why.empty()) msg += detail::str_cat(msg.empty() ? "" : "; ", k.name, ": ", why);
  if (!msg.empty()) DI_THROW(InvalidArgument, "environment knobs this build cannot honour: ", msg);
}

}  // namespace deepinfer
