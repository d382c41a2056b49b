// `deepinfer logits`: logits of every position of one token sequence through a DeepSeek-family forward
// (V4 or V4.1, by config.json `architectures`; CPU fp32 by default, --accelerator nvidia for the GPU),
// written as a float32 .npy [T, vocab]. --mode picks the path (full forward, chunked prefill,
// token-by-token decode) so the three can be compared against each other and a reference.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "deepinfer/error.h"
#include "core/env.h"
#include "model/deepseek/model.h"
#include "model/registry.h"
#include "model/sequence_runner.h"

namespace {
using namespace deepinfer;

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.empty()) continue;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size() || v < 0 || v > INT32_MAX) DI_THROW(InvalidArgument, "--ids: bad token id '", tok, "'");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) DI_THROW(InvalidArgument, "--ids: no token ids given");
  return ids;
}

// NPY v1.0: magic, version, little-endian header length, a Python dict literal padded with
// spaces to a multiple of 64 bytes (ending in '\n'), then the raw little-endian data.
void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t prefix = 10;
  size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) DI_THROW(InvalidArgument, "--out: cannot open ", path, " for writing");
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  const uint16_t hlen = uint16_t(header.size());
  const unsigned char len[2] = {uint8_t(hlen & 0xff), uint8_t(hlen >> 8)};
  f.write(reinterpret_cast<const char*>(len), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(rows * cols * sizeof(float)));
  if (!f) DI_THROW(InvalidArgument, "--out: write to ", path, " failed");
}

int run_logits(int argc, char** argv) {
  CLI::App app{"Logits of every position of a token sequence (DeepSeek V4 / V4.1 forward), as float32 .npy [T, vocab]"};
  std::string model_dir, ids_str, out, mode = "full", accelerator = "cpu";
  int64_t chunk = 16;
  app.add_option("--model", model_dir, "checkpoint folder (config.json + safetensors)")->required();
  app.add_option("--ids", ids_str, "comma-separated token ids, e.g. 5,17,42")->required();
  app.add_option("--out", out, "output .npy path")->required();
  app.add_option("--mode", mode, "full | chunked | decode")->check(CLI::IsMember({"full", "chunked", "decode"}));
  app.add_option("--chunk", chunk, "chunk size for --mode chunked")->check(CLI::PositiveNumber);
  app.add_option("--accelerator", accelerator,
                 "cpu | nvidia | auto (auto: the GPU when one is present and takes the model, else the CPU with "
                 "a one-line reason)")
      ->check(CLI::IsMember({"cpu", "nvidia", "auto"}));
  CLI11_PARSE(app, argc, argv);
  try {
    const std::vector<int32_t> ids = parse_ids(ids_str);
    model::ModelLoadOptions o;
    o.env.accelerator = accelerator == "nvidia" ? Accelerator::kNvidia
                        : accelerator == "auto" ? Accelerator::kAuto
                                                : Accelerator::kCPU;
    o.progress = false;
    std::unique_ptr<model::CausalLM> lm = model::load_model(model_dir, o);  // V4 or V4.1 by `architectures`
    auto* model = dynamic_cast<model::ds::DeepseekModel*>(lm.get());
    if (!model) DI_THROW(InvalidArgument, model_dir, ": not a DeepSeek-family model");
    const int64_t T = int64_t(ids.size());
    model->allocate_cache_for(1, T);
    std::vector<int64_t> chunks;
    const int64_t step = mode == "full" ? T : mode == "decode" ? 1 : chunk;
    for (int64_t done = 0; done < T; done += step) chunks.push_back(std::min(step, T - done));
    Tensor logits = model::run_sequence(*model, model->cache_geometry(), ids, chunks);
    write_npy_f32(out, logits.data<float>(), logits.size(0), logits.size(1));
    std::fprintf(stderr, "wrote %s: [%lld, %lld] (%s)\n", out.c_str(), (long long)logits.size(0),
                 (long long)logits.size(1), mode.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer logits: %s\n", e.what());
    return 1;
  }
  return 0;
}
}  // namespace
DI_REGISTER_COMMAND("logits", "write logits of every position of --ids as .npy (DeepSeek V4 / V4.1)", run_logits);
