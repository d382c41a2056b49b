// `deepinfer make-flash-stack --out DIR --layers N`: a random V4-Flash-shaped checkpoint at full
// width (flash_stack_config: hidden 4096, 64 heads x 512, 256 experts top-6 of width 2048, vocab
// 129280, the first N layers of the Flash schedule) in the release layout (FP8 e4m3 + e8m0 128x128
// dense, FP4 e2m1 + e8m0/32 experts), for timing the engine at the real shapes (bench/gpu_flash_bench.sh).
// About 3.5 GB per layer + 2.1 GB embed/head; written by the fast generator (parallel, streamed).
// --small keeps the schedule, vocab, window, expert count and index top-k but shrinks the widths,
// so the same bench runs on the CPU model in seconds (script tests on machines without a GPU).
// --family v41 writes a V4.1-Flash-shaped stack instead (deepseek_v41/random_stack.h: hidden 5120,
// 384 experts of 2304, FP8 with 32x32 scales, Engram tables on the host), a subset of the release's
// layers chosen by role (--release-layers, or the default sample for --layers).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "cli/lists.h"
#include "core/logging.h"
#include "core/parallel.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "model/deepseek_v4/weights.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/random_stack.h"
#include "model/deepseek_v41/weights.h"

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

// A folder that already holds the stack `stamp` describes is left as it is (unless --force).
bool up_to_date(const fs::path& dir, const std::string& stamp) {
  const fs::path f = dir / ".deepinfer-flash-stack";
  return fs::exists(f) && read_file(f) == stamp;
}
// Before rewriting: stale shards of another shard count would confuse the loader.
void clear_stale(const fs::path& dir) {
  if (!fs::exists(dir)) return;
  fs::remove(dir / ".deepinfer-flash-stack");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      fs::remove(e.path());
}

// The V4.1 stack (same stamp / skip / verify behaviour as the V4 one below).
int write_v41(const std::string& out, const model::v41::V41StackOptions& o, bool force, bool verify) {
  std::ostringstream st;
  st << "{\"generator\": " << kGeneratorVersion << ", \"family\": \"v41\", \"layers\": [";
  for (size_t i = 0; i < o.release_layers.size(); ++i) st << (i ? ", " : "") << o.release_layers[i];
  st << "], \"engram_rows\": " << o.engram_rows << ", \"seed\": " << o.seed << ", \"small\": "
     << (o.small ? "true" : "false") << ", \"shards\": " << o.num_shards << "}\n";
  const fs::path dir(out), stamp = dir / ".deepinfer-flash-stack";
  const std::string text = model::v41::v41_stack_config_json(o);  // validates the layer choice
  const auto cfg = model::v41::DeepseekV41Config::from_json_string(text, out + "/config.json");
  if (!force && up_to_date(dir, st.str())) {
    std::printf("%s is up to date (%s)\n", out.c_str(), cfg.schedule_str().c_str());
    return 0;
  }
  clear_stale(dir);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes = model::v41::write_v41_stack(out, o);
  const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (verify) {  // maps the shards and checks every tensor's name, dtype and shape
    auto back = model::v41::DeepseekV41Config::from_file(out);
    auto w = model::v41::V41Weights::load(out, back);
    std::printf("verified: %zu tensor entries\n", w.table.entries.size());
  }
  std::ofstream(stamp) << st.str();
  std::string layers;
  for (size_t i = 0; i < o.release_layers.size(); ++i) layers += (i ? "," : "") + std::to_string(o.release_layers[i]);
  std::printf("wrote %s: V4.1 stack of release layers %s [%s]%s, %.2f GB in %.1f s (%.2f GB/s, %d threads)\n",
              out.c_str(), layers.c_str(), cfg.schedule_str().c_str(), o.small ? " (small widths)" : "", bytes / 1e9,
              write_s, bytes / 1e9 / std::max(write_s, 1e-9), num_threads());
  return 0;
}

int run_make_flash_stack(int argc, char** argv) {
  CLI::App app{"Write a random V4-Flash-shaped checkpoint (full width, first N layers of the Flash schedule)"};
  std::string out;
  int64_t layers = 6;
  uint64_t seed = 0;
  int shards = 0;
  bool small = false, force = false, quiet = false, verify = true;
  std::string family = "v4", release_layers_s;
  int64_t engram_rows = int64_t(1) << 20;
  app.add_option("--out", out, "output folder (created)")->required();
  app.add_option("--family", family, "v4 (V4-Flash) or v41 (V4.1-Flash)")
      ->check(CLI::IsMember({"v4", "v41"}))
      ->capture_default_str();
  app.add_option("--layers", layers,
                 "v4: layers 0..N-1 of the Flash schedule (S S C H C H ...); v41: N layers sampled by role "
                 "(release layers 0 1 2 3 20 24 21, then 4 5 ...)")
      ->check(CLI::Range(1, 43))
      ->capture_default_str();
  app.add_option("--release-layers", release_layers_s,
                 "v41: comma-separated release layer ids (ascending, in [0, 40)) instead of --layers; a layer "
                 "that reads another's compressed KV needs that source listed");
  app.add_option("--engram-rows", engram_rows, "v41: about this many rows per Engram table (the release has 384M)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 36))
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
  if (family == "v41") {
    // Options that would otherwise be read and not honoured are refused.
    if (app.count("--layers") && app.count("--release-layers")) {
      std::fprintf(stderr, "make-flash-stack: give --layers or --release-layers, not both\n");
      return 2;
    }
    if (layers > 40) {
      std::fprintf(stderr, "make-flash-stack: --layers %ld: V4.1-Flash has 40 layers\n", long(layers));
      return 2;
    }
    model::v41::V41StackOptions o;
    o.release_layers = release_layers_s.empty() ? model::v41::v41_default_stack_layers(layers)
                                                : cli::parse_int_list(release_layers_s, "--release-layers");
    o.engram_rows = engram_rows;
    o.seed = seed;
    o.num_shards = shards;
    o.small = small;
    o.progress = !quiet;
    return write_v41(out, o, force, verify);
  }
  for (const char* v41_only : {"--release-layers", "--engram-rows"})
    if (app.count(v41_only)) {
      std::fprintf(stderr, "make-flash-stack: %s is for --family v41\n", v41_only);
      return 2;
    }

  DeepseekV4Config cfg = flash_stack_config(layers);
  if (small) shrink(cfg);
  if (shards == 0) shards = int(layers) + 1;
  const fs::path dir(out);
  std::ostringstream st;
  st << "{\"generator\": " << kGeneratorVersion << ", \"layers\": " << layers << ", \"seed\": " << seed
     << ", \"small\": " << (small ? "true" : "false") << ", \"shards\": " << shards << "}\n";
  const fs::path stamp = dir / ".deepinfer-flash-stack";
  if (!force && up_to_date(dir, st.str())) {
    std::printf("%s is up to date (%s)\n", out.c_str(), cfg.schedule_str().c_str());
    return 0;
  }
  clear_stale(dir);
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
