// `deepinfer bench-prefix`: shared-prefix workloads with prefix caching off and on (issue #16):
//  - system:  one request with a long system prompt, then the rest with the same system prompt
//             and their own user message;
//  - fewshot: the same shape with a few-shot block (examples) before a short question;
//  - chat:    conversations of several turns, each turn's prompt = the previous prompt, its
//             answer and a new user message (the turns of all conversations batched).
// Token-id prompts (random ids, fixed seed), greedy, so the two runs are comparable; prints the
// hit rate, TTFT, throughput and whether the outputs agree.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "core/check.h"
#include "core/env.h"
#include "engine/engine.h"
#include "engine/model_loader.h"

namespace {
using deepinfer::GenerateSummary;
using deepinfer::LLM;
using deepinfer::PromptInput;
using deepinfer::RequestOutput;
using deepinfer::SamplingParams;
using Ids = std::vector<int32_t>;

struct Totals {
  int64_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  double elapsed_s = 0, ttft_sum = 0;
  int64_t n_ttft = 0, checkpoints = 0, checkpoint_bytes = 0;
  std::vector<Ids> outputs;
  void add(const std::vector<RequestOutput>& outs, const GenerateSummary& s) {
    elapsed_s += s.elapsed_s;
    checkpoints = s.num_checkpoints, checkpoint_bytes = s.checkpoint_bytes;
    for (const RequestOutput& o : outs) {
      prompt_tokens += int64_t(o.prompt_token_ids.size());
      cached_tokens += o.num_cached_tokens;
      output_tokens += o.metrics.num_generation_tokens;
      if (o.metrics.first_token_time > 0) ttft_sum += o.metrics.first_token_time - o.metrics.arrival_time, n_ttft++;
      outputs.push_back(o.outputs.empty() ? Ids{} : o.outputs[0].token_ids);
    }
  }
};

struct Shape {
  int requests = 16, shared = 1024, unique = 64, turns = 4;
};

Ids random_ids(std::mt19937& g, int n, int64_t vocab) {
  Ids t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(2 + g() % uint32_t(vocab - 2));
  return t;
}

std::vector<RequestOutput> gen(LLM& llm, const std::vector<Ids>& prompts, const SamplingParams& sp, Totals& t) {
  std::vector<PromptInput> in;
  for (const Ids& p : prompts) in.push_back(PromptInput::from_token_ids(p));
  std::vector<RequestOutput> outs = llm.generate(in, {sp});
  for (const RequestOutput& o : outs)
    if (!o.error.empty()) DI_THROW(deepinfer::InvalidArgument, "bench-prefix: a request failed: ", o.error);
  t.add(outs, llm.last_summary());
  return outs;
}

// Shared prefix then unique suffixes: the first request alone, then the others together.
Totals shared_prefix(LLM& llm, const Shape& s, const SamplingParams& sp, uint32_t seed) {
  std::mt19937 g(seed);
  const Ids shared = random_ids(g, s.shared, llm.vocab_size());
  std::vector<Ids> prompts;
  for (int i = 0; i < s.requests; ++i) {
    Ids p = shared, u = random_ids(g, s.unique, llm.vocab_size());
    p.insert(p.end(), u.begin(), u.end());
    prompts.push_back(std::move(p));
  }
  Totals t;
  gen(llm, {prompts[0]}, sp, t);
  gen(llm, std::vector<Ids>(prompts.begin() + 1, prompts.end()), sp, t);
  return t;
}

Totals multi_turn(LLM& llm, const Shape& s, const SamplingParams& sp) {
  std::mt19937 g(7);
  std::vector<Ids> convs;
  for (int c = 0; c < s.requests; ++c) convs.push_back(random_ids(g, s.shared / 4, llm.vocab_size()));
  Totals t;
  for (int turn = 0; turn < s.turns; ++turn) {
    std::vector<RequestOutput> outs = gen(llm, convs, sp, t);
    for (size_t c = 0; c < convs.size(); ++c) {
      const Ids& answer = outs[c].outputs[0].token_ids;
      convs[c].insert(convs[c].end(), answer.begin(), answer.end());
      const Ids u = random_ids(g, s.unique, llm.vocab_size());
      convs[c].insert(convs[c].end(), u.begin(), u.end());
    }
  }
  return t;
}

void report(const char* name, const char* mode, const Totals& t, const Totals* base) {
  const double ttft = t.n_ttft ? t.ttft_sum / double(t.n_ttft) : 0;
  const double tps = t.elapsed_s > 0 ? double(t.prompt_tokens + t.output_tokens) / t.elapsed_s : 0;
  int differ = 0;
  if (base)
    for (size_t i = 0; i < t.outputs.size() && i < base->outputs.size(); ++i) differ += t.outputs[i] != base->outputs[i];
  std::printf("%-8s %-4s prompt %7lld  cached %7lld (%5.1f%%)  time %7.2f s  TTFT %8.1f ms  %8.1f tok/s%s",
              name, mode, (long long)t.prompt_tokens, (long long)t.cached_tokens,
              t.prompt_tokens ? 100.0 * double(t.cached_tokens) / double(t.prompt_tokens) : 0.0, t.elapsed_s,
              ttft * 1e3, tps, base ? "" : "\n");
  if (base)
    std::printf("  speedup %.2fx  TTFT %.2fx  outputs differing %d/%zu  checkpoints %lld (%.1f KiB each)\n",
                base->elapsed_s / t.elapsed_s,
                ttft > 0 ? (base->n_ttft ? base->ttft_sum / double(base->n_ttft) : 0) / ttft : 0.0, differ,
                t.outputs.size(), (long long)t.checkpoints,
                t.checkpoints ? double(t.checkpoint_bytes) / double(t.checkpoints) / 1024.0 : 0.0);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What a host-tier hit costs against recomputing: `blocks` blocks of a prompt prefilled in one
// chunk (the recompute), then copied out to host memory and back (a spill and a load), and a
// slot checkpoint saved and restored; best of 5.
void measure_copy(const deepinfer::LLMConfig& cfg, int64_t blocks) {
  using namespace deepinfer;
  const EnvConfig env = EnvConfig::from_environment();
  const std::string path = engine::resolve_model_path(cfg, env);
  const int64_t bt_guess = 256;
  model::ModelLoadOptions opt{.env = env, .limits = engine::model_limits_for(cfg, env)};
  std::unique_ptr<model::CausalLM> m = engine::load_model(path, opt);
  const kv::CacheGeometry unit = m->plan_cache(size_t(1) << 30, 1);
  const int64_t bt = unit.block_tokens > 0 ? unit.block_tokens : bt_guess;
  kv::CacheGeometry g = unit;
  g.num_slots = 1;
  g.num_blocks = blocks * 2;
  m->allocate_cache(g);
  std::mt19937 rng(5);
  model::ForwardBatch b;
  b.token_ids = random_ids(rng, int(blocks * bt), m->vocab_size());
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[size_t(i)] = int32_t(i);
  b.seqs = {{.cache_slot = 0, .block_table = table, .num_computed_tokens = 0, .num_new_tokens = int32_t(blocks * bt)}};
  b.logits_indices = {int32_t(blocks * bt - 1)};
  const size_t bb = m->paged_block_bytes();
  std::shared_ptr<uint8_t> host = m->allocate_host_memory(bb * size_t(blocks));
  std::vector<model::HostBlockCopy> out, in;
  for (int64_t i = 0; i < blocks; ++i) {
    out.push_back({int32_t(i), host.get() + size_t(i) * bb});
    in.push_back({int32_t(blocks + i), host.get() + size_t(i) * bb});
  }
  double fwd = 1e30, to_host = 1e30, from_host = 1e30, save = 1e30, restore = 1e30;
  size_t snap_bytes = 0;
  for (int rep = 0; rep < 5; ++rep) {
    m->reset_slot(0);
    auto t0 = std::chrono::steady_clock::now();
    m->run(b, {});
    fwd = std::min(fwd, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    m->copy_blocks_to_host(out);
    to_host = std::min(to_host, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    m->copy_blocks_from_host(in);
    from_host = std::min(from_host, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    const model::SlotSnapshot snap = m->save_slot(0, blocks * bt);
    save = std::min(save, seconds_since(t0));
    snap_bytes = snap.bytes.size();
    t0 = std::chrono::steady_clock::now();
    m->restore_slot(0, snap);
    restore = std::min(restore, seconds_since(t0));
  }
  std::printf("%s\n%lld blocks x %lld tokens (%zu B per block, checkpoint %zu B):\n"
              "  recompute (prefill) %.3f ms = %.3f ms per block\n"
              "  copy to host %.3f ms, from host %.3f ms = %.4f ms per block (%.2f GB/s)\n"
              "  checkpoint save %.4f ms, restore %.4f ms\n",
              m->describe().c_str(), (long long)blocks, (long long)bt, bb, snap_bytes, fwd * 1e3,
              fwd * 1e3 / double(blocks), to_host * 1e3, from_host * 1e3, from_host * 1e3 / double(blocks),
              double(bb) * double(blocks) / std::max(from_host, 1e-12) / 1e9, save * 1e3, restore * 1e3);
}

int run_bench_prefix(int argc, char** argv) {
  CLI::App app{"Shared-prefix workloads with prefix caching off and on", argv[0]};
  deepinfer::cli::EngineFlags flags;
  flags.max_tokens = 16;
  flags.add_to(app);
  Shape s;
  std::string workload = "all";
  app.add_option("--workload", workload, "system | fewshot | chat | all")
      ->check(CLI::IsMember({"system", "fewshot", "chat", "all"}));
  app.add_option("--requests", s.requests, "requests (chat: conversations)")->check(CLI::PositiveNumber);
  app.add_option("--shared", s.shared, "shared prefix tokens (chat: first prompt = shared / 4)")->check(CLI::PositiveNumber);
  app.add_option("--unique", s.unique, "unique tokens per request / per user turn")->check(CLI::PositiveNumber);
  app.add_option("--turns", s.turns, "chat turns")->check(CLI::PositiveNumber);
  int64_t copy_blocks = 0;
  app.add_option("--copy-blocks", copy_blocks, "instead: time a host-tier round trip of this many blocks vs recomputing them");
  CLI11_PARSE(app, argc, argv);
  if (copy_blocks > 0) {
    measure_copy(flags.llm_config(), copy_blocks);
    return 0;
  }
  SamplingParams sp = flags.sampling();
  sp.temperature = 0;
  sp.ignore_eos = true;
  std::vector<std::string> names;
  if (workload == "all") names = {"system", "fewshot", "chat"};
  else names = {workload};
  for (const std::string& name : names) {
    Totals runs[2];
    for (int on = 0; on < 2; ++on) {
      deepinfer::LLMConfig cfg = flags.llm_config();
      cfg.enable_prefix_caching = on == 1;
      LLM llm(cfg);
      if (name == "chat") {
        runs[on] = multi_turn(llm, s, sp);
      } else if (name == "fewshot") {
        Shape f = s;
        f.unique = std::max(8, s.unique / 4);  // a short question after the examples
        runs[on] = shared_prefix(llm, f, sp, 11);
      } else {
        runs[on] = shared_prefix(llm, s, sp, 3);
      }
      report(name.c_str(), on ? "on" : "off", runs[on], on ? &runs[0] : nullptr);
    }
  }
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("bench-prefix", "shared-prefix workloads with prefix caching off and on", run_bench_prefix);
