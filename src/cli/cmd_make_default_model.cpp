// `deepinfer make-random-model --out DIR`: a tiny RANDOM DeepSeek-V4 checkpoint with the real
// 129,280-token DeepSeek vocabulary, for tests and benchmarks (the bundled default model is the
// trained one in assets/default-model; `make-default-model` is kept as an alias of this command).
// Official release layout by default (FP8 e4m3 dense linears with e8m0 128x128 block scales, FP4
// e2m1 routed experts, an mtp.0 block, two shards + index), so everything run against the default
// model exercises the same loading and dequantisation paths as the real release.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "cli/command.h"
#include "core/logging.h"
#include "io/gzip.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "model/deepseek_v4/weights.h"

namespace {
namespace fs = std::filesystem;
using namespace deepinfer;
using namespace deepinfer::model::v4;

// Bump when the generator's output changes so build.sh regenerates stale models.
constexpr int kGeneratorVersion = 1;

std::string stamp_text(uint64_t seed, const std::string& layout, int shards) {
  std::ostringstream os;
  os << "{\"generator\": " << kGeneratorVersion << ", \"seed\": " << seed << ", \"layout\": \"" << layout
     << "\", \"shards\": " << shards << "}\n";
  return os.str();
}

// The folder holding tokenizers/deepseek-v3/: next to the executable first (installed or inside
// the source tree), then the source tree this binary was built from, so the command works from
// any working directory and with the binary moved.
std::string find_assets_dir() {
  std::vector<fs::path> cands;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && !exe.empty()) {
    cands.push_back(exe.parent_path() / ".." / "share" / "deepinfer");
    cands.push_back(exe.parent_path() / ".." / "assets");
  }
  cands.push_back(io::bundled_assets_dir());
  for (const fs::path& c : cands)
    if (fs::exists(c / "tokenizers" / "deepseek-v3" / "tokenizer.json.gz")) return c.lexically_normal().string();
  return io::bundled_assets_dir();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_make_default_model(int argc, char** argv) {
  CLI::App app{"Write a tiny random DeepSeek-V4 checkpoint (vocab 129280, DeepSeek tokenizer) for tests"};
  std::string out, layout = "official", assets = find_assets_dir();
  uint64_t seed = 0;
  int shards = 2;
  bool quiet = false, force = false;
  app.add_option("--out", out, "output folder (created)")->required();
  app.add_option("--seed", seed, "random seed; the same seed always gives the same bytes")->capture_default_str();
  app.add_option("--layout", layout, "official (FP8/FP4 + MTP, release names) or transformers (bf16, HF names)")
      ->check(CLI::IsMember({"official", "transformers"}))
      ->capture_default_str();
  app.add_option("--shards", shards, "number of safetensors shards (>1 writes an index)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--assets", assets, "folder holding tokenizers/deepseek-v3/")->capture_default_str();
  app.add_flag("--force", force, "rewrite even if the folder already holds this exact model");
  app.add_flag("--quiet", quiet, "print nothing on success");
  app.footer(
      "Model: 6 layers (S S C H C H: sliding / CSA ratio 4 / HCA ratio 16), hidden 128, 4 heads x 64,\n"
      "8 experts top-2 + 1 shared, 3 hash-routed MoE layers, mHC 4 streams, window 16, vocab 129280.\n"
      "Weights are random (MODEL-DEEPSEEK-V4.md §9 scales): output is gibberish but exercises every path.");
  CLI11_PARSE(app, argc, argv);
  if (quiet) set_log_level(LogLevel::kWarn);

  const fs::path dir(out);
  const std::string stamp = stamp_text(seed, layout, shards);
  if (!force && fs::exists(dir / ".deepinfer-default-model") && read_file(dir / ".deepinfer-default-model") == stamp &&
      fs::exists(dir / "tokenizer.json")) {
    if (!quiet) std::printf("%s is up to date\n", out.c_str());
    return 0;
  }
  const CheckpointLayout lay = layout == "official" ? CheckpointLayout::kOfficial : CheckpointLayout::kTransformers;
  // Remove shards of an earlier run with a different shard count before writing.
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
        fs::remove(e.path());
  write_random_checkpoint(out, default_model_config(lay), {.seed = seed, .layout = lay, .num_shards = shards});

  const fs::path tok = fs::path(assets) / "tokenizers" / "deepseek-v3";
  if (!fs::exists(tok / "tokenizer.json.gz")) {
    std::fprintf(stderr, "make-random-model: %s has no tokenizer.json.gz (pass --assets)\n", tok.string().c_str());
    return 1;
  }
  io::gunzip_file((tok / "tokenizer.json.gz").string(), (dir / "tokenizer.json").string());
  fs::copy_file(tok / "tokenizer_config.json", dir / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  if (fs::exists(tok / "LICENSE.packaging"))
    fs::copy_file(tok / "LICENSE.packaging", dir / "LICENSE.tokenizer", fs::copy_options::overwrite_existing);

  // Read it back through the normal loader: a model we cannot load must not be left behind.
  auto cfg = DeepseekV4Config::from_file(out);
  auto w = DeepseekV4Weights::load(out, cfg, {.progress = !quiet});
  std::ofstream(dir / ".deepinfer-default-model") << stamp;
  if (!quiet) {
    auto p = w.param_counts(cfg);
    std::printf("wrote %s: %s layout, %ld layers (%s), %.2fM parameters (%.2fM active per token)\n", out.c_str(),
                layout.c_str(), long(cfg.num_layers), cfg.schedule_str().c_str(), p.total / 1e6, p.active / 1e6);
  }
  return 0;
}
int run_make_default_model_alias(int argc, char** argv) { return run_make_default_model(argc, argv); }
}  // namespace
DI_REGISTER_COMMAND("make-random-model", "write a tiny random DeepSeek-V4 model (real vocab; tests, benchmarks)",
                    run_make_default_model);
DI_REGISTER_COMMAND("make-default-model", "alias of make-random-model (the bundled default is now trained)",
                    run_make_default_model_alias);
