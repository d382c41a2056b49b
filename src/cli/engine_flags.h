// Engine and sampling flags shared by `deepinfer generate` and `deepinfer chat`.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/llm.h"

namespace deepinfer::cli {

struct EngineFlags {
  LLMConfig cfg;
  double kv_cache_gib = 0.0;
  double prefix_host_cache_gib = 0.0;
  SamplingParams sp;
  int max_tokens = 128;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;

  void add_to(CLI::App& app) {
    app.add_option("-m,--model", cfg.model, "checkpoint folder (default: $DEEPINFER_HF_MODEL_DIR, then the bundled default model)");
    app.add_option("--tokenizer", cfg.tokenizer, "tokenizer.json or folder (default: the model folder)");
    app.add_option("--max-model-len", cfg.max_model_len, "max prompt + output tokens");
    app.add_option("--max-num-seqs", cfg.max_num_seqs, "sequences per step");
    app.add_option("--max-num-batched-tokens", cfg.max_num_batched_tokens, "tokens per step");
    app.add_option("--kv-cache-gib", kv_cache_gib, "cache memory budget (GiB); 0 = enough for max-num-seqs x max-model-len (at most 1 GiB on the CPU, up to the GPU memory plan)");
    app.add_option("--accelerator", cfg.accelerator, "cpu | nvidia | auto (default: $DEEPINFER_ACCELERATOR)");
    app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", cfg.enable_prefix_caching,
                 "reuse cached prompt prefixes (default on)");
    app.add_option("--prefix-checkpoint-blocks", cfg.prefix_checkpoint_blocks,
                   "prefill checkpoints every k cache blocks (0 = only at the prompt's last block; -1 = automatic: "
                   "every block unless prefill chunks that short are weight-bound on this model)")
        ->capture_default_str();
    app.add_option("--prefix-host-cache-gib", prefix_host_cache_gib,
                   "host memory evicted cache blocks spill to (pinned on a GPU); 0 = none");
    app.add_option("--data-parallel-size,--dp", cfg.data_parallel_size,
                   "ranks (processes) with attention data parallelism; requests go to the least loaded rank");
    app.add_option("--expert-parallel-size,--ep", cfg.expert_parallel_size,
                   "ranks per expert-parallel group, sharing the routed experts (0 = all ranks; 1 = off)");
    app.add_option("--num-redundant-experts", cfg.num_redundant_experts, "extra expert slots for replicas of hot experts");
    app.add_flag("--enable-eplb", cfg.enable_eplb, "re-place experts by their measured load while running");
    app.add_option("--eplb-window-size", cfg.eplb_window_size, "steps of expert load EPLB looks at");
    app.add_option("--eplb-step-interval", cfg.eplb_step_interval, "steps between EPLB re-placements");
    app.add_option("--context-parallel-size,--cp", cfg.context_parallel_size,
                   "ranks (processes) splitting the attention of long prefill steps, per data-parallel rank (CPU; --ep "
                   "with the same N also shards the experts over them)");
    app.add_option("--context-parallel-min-tokens", cfg.context_parallel_min_tokens,
                   "steps with fewer tokens are not split across the context-parallel ranks (>= 2)");
    app.add_option("--temperature", sp.temperature, "0 = greedy");
    app.add_option("--top-p", sp.top_p);
    app.add_option("--top-k", sp.top_k);
    app.add_option("--min-p", sp.min_p);
    app.add_option("--presence-penalty", sp.presence_penalty);
    app.add_option("--frequency-penalty", sp.frequency_penalty);
    app.add_option("--repetition-penalty", sp.repetition_penalty);
    app.add_option("--max-tokens", max_tokens, "max new tokens per prompt");
    app.add_option("--min-tokens", sp.min_tokens);
    app.add_option("-n,--n", sp.n, "samples per prompt");
    app.add_option("--seed", seed, "per-request sampling seed");
    app.add_option("--stop", stop, "stop string (repeatable)");
    app.add_flag("--ignore-eos", sp.ignore_eos);
  }
  LLMConfig llm_config() const {
    LLMConfig c = cfg;
    c.kv_cache_memory_bytes = size_t(kv_cache_gib * double(size_t(1) << 30));
    c.prefix_host_cache_bytes = size_t(prefix_host_cache_gib * double(size_t(1) << 30));
    return c;
  }
  SamplingParams sampling() const {
    SamplingParams p = sp;
    p.max_tokens = max_tokens;
    p.seed = seed;
    p.stop = stop;
    return p;
  }
};

}  // namespace deepinfer::cli
