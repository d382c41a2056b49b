// `deepinfer info --model DIR`: what a checkpoint holds and what it costs to serve.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <regex>

#include "cli/command.h"
#include "core/logging.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/weights.h"
#include "parallel/cp_plan.h"
#include "parallel/eplb.h"
#include "parallel/topology.h"

namespace {
using namespace deepinfer;
using namespace deepinfer::model::v4;

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}
std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

// KV/compressor state with bf16 storage (MODEL-DEEPSEEK-V4.md §4).
struct CacheCost {
  double per_token = 0;  // bytes of compressed entries + indexer keys per context token
  double windows = 0, hca_partial = 0, csa_partial = 0;  // fixed per sequence
};
CacheCost cache_cost(const DeepseekV4Config& c, int64_t num_mtp_blocks) {
  CacheCost k;
  const double d = double(c.head_dim), id = double(c.index_head_dim), bf = 2;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const double m = double(c.compress_ratio[l]);
    if (c.layer_types[l] == AttnKind::kHCA) {
      k.per_token += d * bf / m;
      k.hca_partial += 2 * m * d * bf;  // a_t and z_t of up to m pending tokens
    } else if (c.layer_types[l] == AttnKind::kCSA) {
      k.per_token += (d + id) * bf / m;
      // current + previous block (2m slots) of 2d-wide a,z; same for the indexer's 2*idx_d.
      k.csa_partial += 2 * (2 * m) * (2 * d) * bf + 2 * (2 * m) * (2 * id) * bf;
    }
  }
  k.windows = double(c.num_layers + num_mtp_blocks) * double(c.sliding_window) * d * bf;
  return k;
}

// Stored bytes of the main layers' routed experts (both layouts: official
// `layers.L.ffn.experts.E.*`, transformers' stacked `model.layers.L.mlp.experts.*`); MTP blocks'
// experts are not sharded and count with the rest.
uint64_t main_routed_bytes(const io::Checkpoint& ck, int64_t num_layers) {
  static const std::regex routed(R"(^(?:model\.)?layers\.(\d+)\.(?:ffn|mlp)\.experts\.)");
  uint64_t bytes = 0;
  std::smatch m;
  for (const auto& f : ck.files())
    for (const auto& t : f->tensors())
      if (std::regex_search(t.name, m, routed) && std::stoll(m[1].str()) < num_layers) bytes += t.end - t.begin;
  return bytes;
}

// What each rank of a data/expert-parallel layout holds (docs/PARALLEL.md): every weight but the
// main routed experts on every rank, and the experts of its slots (ceil((E + redundant) / ep) per
// layer). With EPLB on the GPU every rank holds every expert (its re-placements only re-route).
void print_layout(const io::Checkpoint& ck, const DeepseekV4Config& cfg, int dp, int ep_flag, int redundant, bool eplb_gpu) {
  const parallel::ParallelConfig pc{.data_parallel_size = dp, .expert_parallel_size = ep_flag > 0 ? ep_flag : dp};
  pc.validate();
  if (redundant < 0) DI_THROW(InvalidArgument, "--num-redundant-experts=", redundant, ": must be >= 0");
  const int32_t E = int32_t(cfg.n_routed_experts);
  const double routed = double(main_routed_bytes(ck, cfg.num_layers)), total = double(ck.total_bytes());
  const int32_t slots = pc.expert_parallel_size > 1 && !eplb_gpu
                            ? parallel::ExpertShard{.size = pc.expert_parallel_size, .num_redundant = redundant}.slots_per_rank(E)
                            : E;
  const double mine = routed * double(slots) / double(E);
  std::printf("layout %s: per rank %s = replicated %s + routed experts %s (%d of %d per layer%s)%s\n",
              pc.describe().c_str(), human_bytes(total - routed + mine).c_str(), human_bytes(total - routed).c_str(),
              human_bytes(mine).c_str(), slots, E, redundant > 0 ? ", with the redundant slots" : "",
              eplb_gpu ? "; GPU EPLB: every expert on every rank" : "");
  std::printf("  as stored in the checkpoint (production numerics keep these formats; bf16/exact widen), plus each "
              "rank's KV cache budget\n");
}

// A context-parallel prefill of `context` tokens over `cp` ranks (docs/PARALLEL.md): every rank holds
// the whole sequence's cache and every weight, or with `ep` = cp every weight but the main routed
// experts plus its slots' experts; the balanced plan's tokens per rank, the attention work
// imbalance (cp_work summed over the layers; contiguous chunks for comparison), the
// attention-output rows each rank receives per layer and, experts sharded, the expert outputs
// (each (token, k) row computed on one rank, all-gathered: about (cp-1)/cp of them per rank).
void print_cp(const DeepseekV4Config& cfg, const io::Checkpoint& ck, int cp, int ep, int redundant, int64_t context) {
  if (cp < 1) DI_THROW(InvalidArgument, "--context-parallel-size=", cp, ": must be >= 1");
  if (ep > 1 && ep != cp)
    DI_THROW(InvalidArgument, "--expert-parallel-size=", ep, " with --context-parallel-size=", cp,
             ": context parallelism shards the experts over its own ranks only (the same N) or not at all");
  if (redundant < 0) DI_THROW(InvalidArgument, "--num-redundant-experts=", redundant, ": must be >= 0");
  int64_t align = 1;
  for (int64_t r : cfg.compress_ratio) align = std::max(align, r);
  const int32_t E = int32_t(cfg.n_routed_experts);
  const bool sharded = ep == cp;
  const int32_t slots = sharded ? parallel::ExpertShard{.size = cp, .num_redundant = redundant}.slots_per_rank(E) : E;
  const double routed = double(main_routed_bytes(ck, cfg.num_layers)), total = double(ck.total_bytes());
  std::printf("layout cp %d%s: per rank %s of weights (%s) plus the whole sequence's cache\n", cp,
              sharded ? " = ep" : "", human_bytes(total - routed + routed * double(slots) / double(E)).c_str(),
              sharded ? detail::str_cat("routed experts ", slots, " of ", E, " per layer").c_str() : "all replicated");
  if (context <= 0) {
    std::printf("  (--context N also prints the split of an N-token prefill)\n");
    return;
  }
  auto imbalance = [&](const parallel::CpPlan& plan) {
    std::vector<double> w(size_t(cp), 0.0);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      const int64_t m = cfg.compress_ratio[size_t(l)];
      const int64_t topk = m > 0 && cfg.layer_types[size_t(l)] == AttnKind::kCSA ? cfg.index_topk : 0;
      for (int r = 0; r < cp; ++r)
        for (const parallel::CpSpan& s : plan.spans[size_t(r)]) w[size_t(r)] += parallel::cp_work(s, cfg.sliding_window, m, topk);
    }
    double mx = 0, sum = 0;
    for (double x : w) mx = std::max(mx, x), sum += x;
    return sum > 0 ? mx / (sum / cp) : 1.0;
  };
  const parallel::CpPlan plan = parallel::balanced_cp_plan(0, context, cp, align);
  std::printf("  prefill of %ld tokens:", long(context));
  for (int r = 0; r < cp; ++r) std::printf(" rank %d %ld tokens;", r, long(plan.tokens_of(r)));
  const double row = double(cfg.num_heads * cfg.head_dim) * 4.0;  // f32 attention output row
  std::printf("\n  attention work imbalance %.3f (contiguous chunks %.3f); each rank receives about %s per layer\n",
              imbalance(plan), imbalance(parallel::contiguous_cp_plan(0, context, cp, align)),
              human_bytes(row * double(context) * double(cp - 1) / double(cp)).c_str());
  if (sharded) {
    const double out_row = double(cfg.hidden_size) * 4.0;  // f32 expert output row
    std::printf("  MoE: each rank runs its experts on all %ld tokens and receives about %s of expert outputs per "
                "layer (%ld rows of %ld, balanced routing)\n",
                long(context), human_bytes(out_row * double(context * cfg.num_experts_per_tok) * double(cp - 1) / cp).c_str(),
                long(context * cfg.num_experts_per_tok), long(cfg.hidden_size));
  }
}

int run_info(int argc, char** argv) {
  CLI::App app{"Describe a DeepSeek-V4 checkpoint: config, layer schedule, parameters, bytes, cache cost"};
  std::string dir;
  int64_t context = 0;
  app.add_option("--model", dir, "checkpoint folder (config.json + *.safetensors)")->required();
  app.add_option("--context", context, "also print the cache bytes of one sequence of this many tokens");
  int dp = 1, ep = 0, redundant = 0;
  bool eplb_gpu = false;
  app.add_option("--data-parallel-size", dp, "also print the weight bytes per rank of this many ranks");
  app.add_option("--expert-parallel-size", ep, "ranks the routed experts are sharded over (0 = all)");
  app.add_option("--num-redundant-experts", redundant, "spare expert slots (EPLB replicas) over the group");
  app.add_flag("--eplb-gpu", eplb_gpu, "EPLB on GPU ranks (each holds every expert)");
  int cp = 1;
  app.add_option("--context-parallel-size", cp, "also print a context-parallel prefill over this many ranks (with --context)");
  app.footer(
      "Schedule letters: S sliding-window only, C compressed sparse attention (CSA, indexer top-k),\n"
      "H heavily compressed attention (HCA); MoE marks: h hash-routed, m bias-routed.\n"
      "Active parameters per token exclude the embedding and count routed experts as top-k/E.");
  CLI11_PARSE(app, argc, argv);

  auto cfg = DeepseekV4Config::from_file(dir);
  set_log_level(std::min(log_level(), LogLevel::kWarn));  // no per-shard lines here
  auto w = DeepseekV4Weights::load(dir, cfg, {.progress = false});
  auto ck = std::static_pointer_cast<io::Checkpoint>(w.keepalive);

  std::printf("%s", cfg.summary().c_str());
  std::printf("checkpoint: %s layout, %zu shard(s), %zu tensors, %s\n",
              w.layout == CheckpointLayout::kOfficial ? "official" : "transformers", ck->files().size(),
              ck->num_tensors(), human_bytes(double(ck->total_bytes())).c_str());
  std::printf("attention schedule: %s\n", cfg.schedule_str().c_str());
  std::string mlp;
  for (size_t i = 0; i < cfg.mlp_types.size(); ++i) mlp += std::string(i ? " " : "") + (cfg.mlp_types[i] == MlpKind::kHashMoE ? "h" : "m");
  std::printf("moe schedule:       %s\n", mlp.c_str());
  if (!w.mtp.empty()) std::printf("mtp blocks: %zu\n", w.mtp.size());

  const ParamCounts p = w.param_counts(cfg);
  std::printf("parameters: %s total (main %s, MTP %s; embedding %s, routed experts %s); active per token %s\n",
              human_count(double(p.total)).c_str(), human_count(double(p.total - p.mtp)).c_str(),
              human_count(double(p.mtp)).c_str(), human_count(double(p.embed)).c_str(),
              human_count(double(p.routed)).c_str(), human_count(double(p.active)).c_str());

  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;  // dtype -> (tensors, bytes)
  for (const auto& f : ck->files())
    for (const auto& t : f->tensors()) {
      auto& e = by_dtype[t.st_dtype];
      e.first++;
      e.second += t.end - t.begin;
    }
  std::printf("bytes by dtype:");
  for (const auto& [dt, e] : by_dtype) std::printf("  %s %s (%lu)", dt.c_str(), human_bytes(double(e.second)).c_str(), (unsigned long)e.first);
  std::printf("\n");

  const CacheCost k = cache_cost(cfg, int64_t(w.mtp.size()));  // MTP blocks only when present
  const double fixed = k.windows + k.hca_partial + k.csa_partial;
  std::printf("cache (bf16): %.0f B per token; fixed per sequence %s (windows %s, HCA partial blocks %s, CSA partial "
              "blocks %s)\n",
              k.per_token, human_bytes(fixed).c_str(), human_bytes(k.windows).c_str(), human_bytes(k.hca_partial).c_str(),
              human_bytes(k.csa_partial).c_str());
  if (context > 0)
    std::printf("cache for %ld tokens: %s\n", long(context), human_bytes(fixed + k.per_token * double(context)).c_str());
  // Under context parallelism (one data-parallel rank) --expert-parallel-size names the CP ranks.
  const bool cp_layout = cp > 1 && dp == 1;
  if (dp > 1 || (ep > 1 && !cp_layout)) print_layout(*ck, cfg, dp, ep, redundant, eplb_gpu);
  if (cp > 1) print_cp(cfg, *ck, cp, cp_layout ? ep : 0, redundant, context);
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("info", "describe a checkpoint (config, schedule, parameters, cache cost)", run_info);
