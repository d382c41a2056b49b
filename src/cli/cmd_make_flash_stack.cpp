// `deepinfer make-flash-stack --out DIR --layers N`: a random V4-Flash-shaped checkpoint at full
// width (flash_stack_config: hidden 4096, 64 heads x 512, 256 experts top-6 of width 2048, vocab
// 129280, the first N layers of the Flash schedule) in the release layout (FP8 e4m3 + e8m0 128x128
// dense, FP4 e2m1 + e8m0/32 experts), for timing the engine at the real shapes (bench/gpu_flash_bench.sh).
// About 3.5 GB per layer + 2.1 GB embed/head; written by the fast generator (parallel, streamed).
// --small keeps the schedule, vocab, window, expert count and index top-k but shrinks the widths,
// so the same bench runs on the CPU model in seconds (script tests on machines without a GPU).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "core/logging.h"
#include "core/parallel.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "model/deepseek_v4/weights.h"

namespace {
namespace fs = std::filesystem;
using namespace deepinfer;
using namespace deepinfer::model::v4;

constexpr int kGeneratorVersion = 1;  // bump when the bytes written change

void shrink(DeepseekV4Config& c) {
  c.hidden_size = 256;
  c.num_heads = 8;
  c.head_dim = 128;  // rope on the last 64 dims, 64 FP8-rounded dims (production numerics)
  c.q_lora_rank = 128;
  c.o_groups = 2;
  c.o_lora_rank = 128;
  c.moe_intermediate_size = 128;
  c.index_n_heads = 8;
  c.index_head_dim = 64;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_make_flash_stack(int argc, char** argv) {
  CLI::App app{"Write a random V4-Flash-shaped checkpoint (full width, first N layers of the Flash schedule)"};
  std::string out;
  int64_t layers = 6;
  uint64_t seed = 0;
  int shards = 0;
  bool small = false, force = false, quiet = false, verify = true;
  app.add_option("--out", out, "output folder (created)")->required();
  app.add_option("--layers", layers, "layers 0..N-1 of the Flash schedule (S S C H C H ...)")
      ->check(CLI::Range(1, 43))
      ->capture_default_str();
  app.add_option("--seed", seed, "random seed; the same seed always gives the same bytes")->capture_default_str();
  app.add_option("--shards", shards, "safetensors shards (0 = one per layer, + index)")->check(CLI::Range(0, 64));
  app.add_flag("--small", small, "reduced widths (hidden 256, 8 heads x 128, experts 256 x 128): CPU script tests");
  app.add_flag("--force", force, "rewrite even if the folder already holds this exact stack");
  app.add_flag("--no-verify", [&](int64_t) { verify = false; }, "skip reading the result back through the loader");
  app.add_flag("-q,--quiet", quiet, "no progress line");
  app.footer(
      "Full width: ~3.5 GB per layer on disk (12.9 GB per layer once the engine dequantises the experts to bf16)\n"
      "+ 2.1 GB embed/head. Values: counter-based hash per element with the scales of MODEL-DEEPSEEK-V4.md §9.");
  CLI11_PARSE(app, argc, argv);
  if (quiet) set_log_level(LogLevel::kWarn);

  DeepseekV4Config cfg = flash_stack_config(layers);
  if (small) shrink(cfg);
  if (shards == 0) shards = int(layers) + 1;
  const fs::path dir(out);
  std::ostringstream st;
  st << "{\"generator\": " << kGeneratorVersion << ", \"layers\": " << layers << ", \"seed\": " << seed
     << ", \"small\": " << (small ? "true" : "false") << ", \"shards\": " << shards << "}\n";
  const fs::path stamp = dir / ".deepinfer-flash-stack";
  if (!force && fs::exists(stamp) && read_file(stamp) == st.str()) {
    std::printf("%s is up to date (%s)\n", out.c_str(), cfg.schedule_str().c_str());
    return 0;
  }
  if (fs::exists(dir)) {  // stale shards of another shard count would confuse the loader
    fs::remove(stamp);
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
        fs::remove(e.path());
  }
  const auto t0 = std::chrono::steady_clock::now();
  write_random_checkpoint(out, cfg,
                          {.seed = seed, .layout = CheckpointLayout::kOfficial, .num_shards = shards, .fast = true,
                           .progress = !quiet});
  const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") bytes += e.file_size();
  if (verify) {  // maps the shards and checks every tensor's name, dtype and shape
    auto back = DeepseekV4Config::from_file(out);
    auto w = DeepseekV4Weights::load(out, back, {.progress = false});
    auto p = w.param_counts(back);
    std::printf("verified: %.3fB parameters (%.3fB active per token)\n", p.total / 1e9, p.active / 1e9);
  }
  std::ofstream(stamp) << st.str();
  std::printf("wrote %s: %ld layers [%s]%s, %.2f GB in %.1f s (%.2f GB/s, %d threads)\n", out.c_str(), long(layers),
              cfg.schedule_str().c_str(), small ? " (small widths)" : "", bytes / 1e9, write_s,
              bytes / 1e9 / std::max(write_s, 1e-9), num_threads());
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("make-flash-stack", "write a random V4-Flash-shaped checkpoint (full width, N layers)",
                    run_make_flash_stack);
