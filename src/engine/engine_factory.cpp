// See engine_factory.h.
#include "engine/engine_factory.h"

#include <utility>

#include "core/check.h"
#include "engine/model_loader.h"

namespace deepinfer::engine {

void validate_llm_config(const LLMConfig& config) {
  if (config.max_num_seqs <= 0) DI_THROW(InvalidArgument, "LLMConfig.max_num_seqs must be positive");
  if (config.max_num_batched_tokens <= 0) DI_THROW(InvalidArgument, "LLMConfig.max_num_batched_tokens must be positive");
  if (config.max_n < 1) DI_THROW(InvalidArgument, "LLMConfig.max_n must be >= 1, got ", config.max_n);
  if (config.max_logprobs < 0) DI_THROW(InvalidArgument, "LLMConfig.max_logprobs must be >= 0, got ", config.max_logprobs);
  if (config.prefix_checkpoint_blocks < -1)
    DI_THROW(InvalidArgument, "LLMConfig.prefix_checkpoint_blocks must be >= 0 (or -1 = automatic), got ",
             config.prefix_checkpoint_blocks);
  if (config.data_parallel_size < 1)
    DI_THROW(InvalidArgument, "LLMConfig.data_parallel_size must be >= 1, got ", config.data_parallel_size);
  if (config.expert_parallel_size < 0)
    DI_THROW(InvalidArgument, "LLMConfig.expert_parallel_size must be >= 0 (0 = data_parallel_size), got ",
             config.expert_parallel_size);
  // The layout itself (ep divides dp) is checked here too, so a single-rank LLM does not
  // silently ignore an expert_parallel_size it cannot honour.
  if (config.expert_parallel_size > 1 && config.context_parallel_size <= 1 &&
      config.data_parallel_size % config.expert_parallel_size != 0)
    DI_THROW(InvalidArgument, "LLMConfig.expert_parallel_size=", config.expert_parallel_size,
             " must divide data_parallel_size=", config.data_parallel_size);
  // Context parallelism shards the experts over the CP ranks when expert_parallel_size names them.
  const bool cp_ep = config.context_parallel_size > 1 && config.expert_parallel_size == config.context_parallel_size;
  const bool sharded = config.context_parallel_size > 1
                           ? cp_ep
                           : config.data_parallel_size > 1 && config.expert_parallel_size != 1;
  for (auto [name, set] : {std::pair<const char*, bool>{"enable_eplb", config.enable_eplb},
                           {"num_redundant_experts", config.num_redundant_experts != 0}})
    if (set && !sharded)
      DI_THROW(InvalidArgument, "LLMConfig.", name, " needs expert parallelism (data_parallel_size > 1 and "
                                "expert_parallel_size != 1, or expert_parallel_size = context_parallel_size > 1)");
  if (config.context_parallel_size < 1)
    DI_THROW(InvalidArgument, "LLMConfig.context_parallel_size must be >= 1, got ", config.context_parallel_size);
  if (config.context_parallel_size > 1) {
    // data_parallel_size > 1: that many CP groups (cp x dp processes), each a data-parallel rank.
    // The experts are sharded over each CP group's ranks (every split step's MoE runs on every
    // token there) or not at all; an expert group inside or across CP groups is not built.
    if (config.expert_parallel_size > 1 && !cp_ep)
      DI_THROW(InvalidArgument, "LLMConfig.context_parallel_size=", config.context_parallel_size,
               " with expert_parallel_size=", config.expert_parallel_size,
               ": context parallelism shards the experts over its own ranks only (expert_parallel_size = "
               "context_parallel_size, or 0/1 for every rank holding every expert)");
    if (config.context_parallel_min_tokens < 2)
      DI_THROW(InvalidArgument, "LLMConfig.context_parallel_min_tokens must be >= 2 (shorter steps, decode among them, "
               "are not split), got ", config.context_parallel_min_tokens);
  }
  if (config.num_redundant_experts < 0)
    DI_THROW(InvalidArgument, "LLMConfig.num_redundant_experts must be >= 0, got ", config.num_redundant_experts);
  if (config.enable_eplb && (config.eplb_window_size < 1 || config.eplb_step_interval < 1))
    DI_THROW(InvalidArgument, "LLMConfig.eplb_window_size (", config.eplb_window_size, ") and eplb_step_interval (",
             config.eplb_step_interval, ") must be >= 1");
}

EnvConfig resolve_env(const LLMConfig& config) {
  EnvConfig env = EnvConfig::from_environment();
  apply_accelerator(config, env);
  return env;
}

void apply_accelerator(const LLMConfig& config, EnvConfig& env) {
  if (config.accelerator == "cpu") env.accelerator = Accelerator::kCPU;
  else if (config.accelerator == "nvidia" || config.accelerator == "cuda") env.accelerator = Accelerator::kNvidia;
  else if (config.accelerator == "auto") env.accelerator = Accelerator::kAuto;
  else if (!config.accelerator.empty())
    DI_THROW(InvalidArgument, "LLMConfig.accelerator='", config.accelerator, "' is not one of: cpu, nvidia, auto");
  // Knobs that need nothing from the model are refused before a (possibly long) load; the
  // engine checks them all again with the model known.
  check_env_knobs(env, {});
}

LoadedParts load_parts(const LLMConfig& config, const EnvConfig& env, int device,
                       std::optional<parallel::ExpertShard> shard) {
  LoadedParts p;
  p.path = resolve_model_path(config, env);
  p.model = load_model(p.path, model::ModelLoadOptions{.env = env, .limits = model_limits_for(config, env),
                                                       .device = device, .expert_shard = shard});
  p.codec = load_codec(config, p.path, p.model->vocab_size());
  p.grammar = make_grammar_compiler(p.codec.get(), p.model->vocab_size(), p.model->eos_token_id());
  return p;
}

std::unique_ptr<Engine> make_engine(const LLMConfig& config, const EnvConfig& env, LoadedParts parts) {
  validate_llm_config(config);
  EngineConfig ec;
  ec.scheduler.max_num_seqs = config.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = config.max_num_batched_tokens;
  ec.scheduler.max_model_len = config.max_model_len;
  ec.scheduler.enable_chunked_prefill = config.enable_chunked_prefill;
  ec.scheduler.prefix_cache.enabled = config.enable_prefix_caching;
  ec.scheduler.prefix_cache.checkpoint_interval_blocks = config.prefix_checkpoint_blocks;
  ec.prefix_host_bytes = config.prefix_host_cache_bytes;
  ec.kv_cache_memory_bytes = config.kv_cache_memory_bytes;  // 0 = auto_cache_budget
  ec.seed = config.seed;
  ec.env = env;
  ec.model_identity = parts.path;
  ec.device_sampling = env.device_sampling;
  ec.max_n = config.max_n;
  ec.max_logprobs = config.max_logprobs;
  return std::make_unique<Engine>(ec, std::move(parts.model), std::move(parts.codec), std::move(parts.grammar));
}

}  // namespace deepinfer::engine
