// Environment knobs, read once at startup into a plain struct that the engine owns and
// passes down (ModelLoadOptions.env for models). Nothing below the engine reads the environment.
//
// Every DEEPINFER_* knob is one row of the table in env.cpp: its name, what it does, how it is
// parsed, and whether the value it holds can be honoured by this build. A knob whose feature
// has not landed is refused when it asks for that feature (check_env_knobs, called when an
// engine is built), never silently ignored; a feature that lands flips its row.
#pragma once
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace deepinfer {

enum class Accelerator { kAuto, kCPU, kNvidia, kAscend };
// How an expert-parallel group on GPU ranks moves token rows (DEEPINFER_EP_EXCHANGE): auto = over
// NCCL when every rank of the group has a GPU of its own, else staged through the host.
enum class EpExchange { kAuto, kHost, kDevice };

// Default maximum draft length when DEEPINFER_USE_NEXTN_DECODE is unset (DeepInfer's default).
constexpr int kDefaultNextnDecode = 5;

struct EnvConfig {
  Accelerator accelerator = Accelerator::kAuto;  // DEEPINFER_ACCELERATOR: nvidia | cpu | ascend (reserved)
  std::string hf_model_dir;                      // DEEPINFER_HF_MODEL_DIR
  std::optional<int> use_nextn_decode;           // DEEPINFER_USE_NEXTN_DECODE: max draft length (0 = off)
  bool enable_mtp_varlen = false;                // DEEPINFER_ENABLE_MTP_VARLEN
  bool batch_invariant = false;                  // DEEPINFER_BATCH_INVARIANT
  std::optional<bool> async_scheduling;          // DEEPINFER_ASYNC_SCHEDULING; unset = the engine's default
  std::optional<std::string> yoco_truncation_mode;  // DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE (V4.1)
  std::optional<int> yoco_keep_tokens;           // DEEPINFER_YOCO_PREFILL_KEEP_TOKENS (V4.1)
  bool cuda_graphs = true;                       // DEEPINFER_CUDA_GRAPHS: GPU decode through CUDA graphs
  bool device_sampling = true;                   // DEEPINFER_DEVICE_SAMPLING: sample on the GPU
  bool device_draft_sampling = true;             // DEEPINFER_DEVICE_DRAFT_SAMPLING: sampled drafts + verify on the GPU
  // DEEPINFER_SPEC_ADAPTIVE: a request stops drafting while it cannot pay; unset = on for a model
  // that keeps its logits on a device (the GPU), off on the CPU backend.
  std::optional<bool> spec_adaptive;
  EpExchange ep_exchange = EpExchange::kAuto;    // DEEPINFER_EP_EXCHANGE: auto | host | device
  // DEEPINFER_LOG_LEVEL: error | warn | info | debug. Validated here; core/logging applies it to
  // the process-wide logger when it first logs (logging is process-wide by nature).
  std::optional<std::string> log_level;

  // Reads the process environment; throws InvalidArgument naming the variable on a bad value.
  static EnvConfig from_environment();
  // Same, from `lookup(name)` (null or "" = unset): tests parse without touching the process.
  static EnvConfig parse(const std::function<const char*(const char* name)>& lookup);
  // The largest rollback a model must support for these knobs: drafts + 1 (issue #10 item 4).
  int max_rollback() const { return use_nextn_decode.value_or(kDefaultNextnDecode) + 1; }
};

// What decides whether a knob's value can be honoured, known once the model is loaded.
struct KnobContext {
  std::optional<bool> model_has_drafter;  // CausalLM::drafter() != null; unset = not loaded yet
  std::optional<bool> model_replays;      // CausalLM::replay_keep() > 0 (V4.1 compact prefill); unset = not loaded
  std::string model;                      // CausalLM::describe(), for messages
};

struct EnvKnob {
  const char* name;
  const char* meaning;  // one line: what it does
  void (*parse)(EnvConfig& env, const char* name, const char* value);
  // "" when the value `env` holds does what the knob says; else why it cannot yet.
  std::string (*refusal)(const EnvConfig& env, const KnobContext& ctx);
};

// Every DEEPINFER_* knob the engine knows, in one table.
std::span<const EnvKnob> env_knobs();

// Throws InvalidArgument naming every knob whose value cannot be honoured (and why).
void check_env_knobs(const EnvConfig& env, const KnobContext& ctx);

const char* accelerator_name(Accelerator a);
const char* ep_exchange_name(EpExchange x);

}  // namespace deepinfer
