#include "cli/flash_floors.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/file.h"
#include "core/json.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/plan.h"

namespace deepinfer::cli {
namespace {
using model::v4::AttnKind;
using model::v4::DeepseekV4Config;
using model::v41::DeepseekV41Config;

constexpr double kFp4Bytes = 0.5 + 1.0 / 32;  // e2m1 code + one e8m0 scale per 32

double touched(double E, double k, double tokens) { return E * (1 - std::pow(1 - k / E, tokens)); }

// ---- V4 (per layer l, from the config alone) ----
class V4Floors final : public FlashFloors {
 public:
  explicit V4Floors(DeepseekV4Config c) : c(std::move(c)) {}
  std::string family() const override { return "V4"; }
  std::string schedule() const override { return c.schedule_str(); }
  int64_t layers() const override { return c.num_layers; }
  int64_t vocab() const override { return c.vocab_size; }
  int64_t max_positions() const override { return c.max_position_embeddings; }
  double hf_layer_ms(const std::string& what, int64_t B, int64_t ctx) const override {
    if (ctx != 4096) return 0;
    if (what == "prefill") return 55.0;
    return B == 1 ? 9.3 : B == 8 ? 7.6 : B == 32 ? 8.4 : 0;
  }

  double attn_linear_params(int64_t l) const {  // q/kv/o projections + compressor/indexer linears
    const double D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank;
    const double GR = double(c.o_groups * c.o_lora_rank);
    double n = r * D + H * d * r + d * D + GR * (H * d / c.o_groups) + D * GR;
    if (c.layer_types[l] == AttnKind::kCSA) {
      const double Hi = c.index_n_heads, di = c.index_head_dim;
      n += 2 * (2 * d) * D + 2 * (2 * di) * D + Hi * di * r + Hi * D;
    } else if (c.layer_types[l] == AttnKind::kHCA) {
      n += 2 * d * D;
    }
    return n;
  }
  double expert_params() const { return 3.0 * c.moe_intermediate_size * c.hidden_size; }
  double hc_params() const { return 2.0 * c.hc_mix_dim() * c.hc_dim(); }  // two mHC sites
  // Dense bytes one step reads in layer l (bf16 linears + f32 mHC, as uploaded; no routed experts).
  double dense_bytes(int64_t l) const {
    return 2 * (attn_linear_params(l) + double(c.n_routed_experts) * c.hidden_size + expert_params()) + 4 * hc_params();
  }
  // Same in the release precision: FP8 (1 B) for the quantised dense linears, bf16 for the rest.
  double dense_bytes_release(int64_t l) const {
    const double D = c.hidden_size, d = c.head_dim;
    double bf16 = double(c.n_routed_experts) * D;  // router
    if (c.layer_types[l] == AttnKind::kCSA)
      bf16 += 2 * (2 * d) * D + 2 * (2.0 * c.index_head_dim) * D + double(c.index_n_heads) * D;
    else if (c.layer_types[l] == AttnKind::kHCA)
      bf16 += 2 * d * D;
    const double fp8 = attn_linear_params(l) - bf16 + double(c.n_routed_experts) * D + expert_params();
    return fp8 * (1 + 1.0 / 16384) + 2 * bf16 + 4 * hc_params();
  }
  double touched_experts(double tokens) const override {
    return touched(double(c.n_routed_experts), double(c.num_experts_per_tok), tokens);
  }
  double kv_bytes(int64_t l, double ctx) const {  // one sequence, bf16 as stored on the GPU
    const double d = c.head_dim, W = double(c.sliding_window);
    double n = std::min(ctx, W) * d;
    if (c.layer_types[l] == AttnKind::kCSA)
      n += std::min(std::floor(ctx / 4), double(c.index_topk)) * d + std::floor(ctx / 4) * c.index_head_dim;
    else if (c.layer_types[l] == AttnKind::kHCA)
      n += std::floor(ctx / double(c.compress_ratio[l])) * d;
    return 2 * n;
  }
  double head_bytes() const { return 2.0 * c.vocab_size * c.hidden_size; }
  double decode_bytes(int64_t B, double ctx, bool release) const override {
    double n = head_bytes();
    for (int64_t l = 0; l < c.num_layers; ++l)
      n += (release ? dense_bytes_release(l) : dense_bytes(l)) +
           touched_experts(double(B)) * expert_params() * kFp4Bytes + double(B) * kv_bytes(l, ctx);
    return n;
  }
  double active_params(int64_t l) const {
    return attn_linear_params(l) + double(c.n_routed_experts) * c.hidden_size +
           double(1 + c.num_experts_per_tok) * expert_params() + hc_params() / 2;  // hc: 1 MAC per fn entry per site
  }
  double attn_flops(int64_t l, double p) const {  // token at position p (0-based)
    const double H = c.num_heads, d = c.head_dim;
    double keys = std::min(p + 1, double(c.sliding_window));
    double extra = 0;
    if (c.layer_types[l] == AttnKind::kCSA) {
      keys += std::min(std::floor((p + 1) / 4), double(c.index_topk));
      extra = 2.0 * c.index_n_heads * c.index_head_dim * std::floor((p + 1) / 4);  // indexer scan
    } else if (c.layer_types[l] == AttnKind::kHCA) {
      keys += std::floor((p + 1) / double(c.compress_ratio[l]));
    }
    return 4 * H * d * keys + extra;
  }
  double prefill_flops(int64_t P) const override {
    double f = 2.0 * c.vocab_size * c.hidden_size;  // logits of the last token
    for (int64_t l = 0; l < c.num_layers; ++l) {
      f += 2 * double(P) * active_params(l);
      for (int64_t p = 0; p < P; ++p) f += attn_flops(l, double(p));
    }
    return f;
  }
  double prefill_bytes(int64_t P) const override {
    double n = head_bytes();
    for (int64_t l = 0; l < c.num_layers; ++l) n += dense_bytes(l) + touched_experts(double(P)) * expert_params() * kFp4Bytes;
    return n;
  }
  double decode_flops(int64_t B, double ctx) const override {
    double f = 2.0 * B * c.vocab_size * c.hidden_size;
    for (int64_t l = 0; l < c.num_layers; ++l) f += B * (2 * active_params(l) + attn_flops(l, ctx));
    return f;
  }

 private:
  DeepseekV4Config c;
};

// ---- V4.1 (per layer from its plan's role) ----
// Weights as the release stores them and the engine keeps them on the device: dense linears FP8
// (1 B + one e8m0 per 32x32 block), plain linears (router, compressor, indexer wk / weights_proj)
// bf16, mHC f32, routed experts FP4. The cache as the engine stores it is bf16 rows (the QAT
// formats are roundings applied before the store); `release` counts them in their formats: window
// FP8 + e8m0/32, entries FP4 + e4m3/16, index keys FP4 + e8m0/32. A reuse layer reads its source's
// entries at its source's selection; a scoring layer scans its key source's keys (inside the
// candidate blocks when it uses them). Engram's table rows are read on the host (not device bytes);
// its wkv projection is a dense linear.
class V41Floors final : public FlashFloors {
 public:
  explicit V41Floors(DeepseekV41Config cfg) : c(std::move(cfg)), plan(model::v41::v41_plan(c, {})) {}
  std::string family() const override { return "V4.1"; }
  std::string schedule() const override { return c.schedule_str(); }
  int64_t layers() const override { return c.num_layers; }
  int64_t vocab() const override { return c.vocab_size; }
  int64_t max_positions() const override { return c.max_position_embeddings; }

  using Plan = model::LayerPlan;
  double dense_params(const Plan& p) const {  // FP8 in the release
    const double D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank;
    double n = r * D + H * d * r + d * D + double(c.o_lora_rank) * H * d + D * double(c.o_groups * c.o_lora_rank);
    n += 3.0 * c.moe_intermediate_size * D;  // shared expert
    if (p.select == model::SelectKind::kScore) n += double(c.index_n_heads * c.index_head_dim) * r;
    if (p.engram) n += D * double(c.hc_mult + 1) * double(c.engram.num_columns() * c.engram.head_dim);
    return n;
  }
  double plain_params(const Plan& p) const {  // bf16
    const double D = c.hidden_size, d = c.head_dim;
    double n = double(c.n_routed_experts) * D;  // router
    if (p.owns_entries()) n += (p.compressor == model::CompressorKind::kPool ? 2 : 1) * d * D;
    if (p.owns_keys()) n += double(c.index_head_dim) * d;
    if (p.select == model::SelectKind::kScore) n += double(c.index_n_heads) * D;
    return n;
  }
  double expert_params() const { return 3.0 * c.moe_intermediate_size * c.hidden_size; }
  double hc_params() const { return 2.0 * c.hc_mix_dim() * c.hc_dim(); }
  double weight_bytes(const Plan& p) const {
    return dense_params(p) * (1 + 1.0 / 1024) + 2 * plain_params(p) + 4 * hc_params();
  }
  double touched_experts(double tokens) const override {
    return touched(double(c.n_routed_experts), double(c.num_experts_per_tok), tokens);
  }
  // Entries a layer's source holds at context ctx, and those a scoring layer scans.
  double entries(const Plan& p, double ctx) const { return p.ratio > 0 ? std::floor(ctx / double(p.ratio)) : 0; }
  double scanned(const Plan& p, double ctx) const {
    double n = entries(p, ctx);
    if (p.uses_candidates) n = std::min(n, double(c.candidate_topk_blocks * c.candidate_block_size));
    return n;
  }
  double kv_bytes(const Plan& p, double ctx, bool release) const {  // one sequence
    const double d = c.head_dim, W = double(c.sliding_window), di = c.index_head_dim;
    const double win = release ? 1 + 1.0 / 32 : 2, ent = release ? 0.5 + 1.0 / 16 : 2, key = release ? kFp4Bytes : 2;
    double n = std::min(ctx, W) * d * win;
    if (p.attends_compressed()) n += std::min(entries(p, ctx), double(c.index_topk)) * d * ent;
    if (p.select == model::SelectKind::kScore) n += scanned(p, ctx) * di * key;
    return n;
  }
  double head_bytes() const { return 2.0 * c.vocab_size * c.hidden_size; }
  double decode_bytes(int64_t B, double ctx, bool release) const override {
    double n = head_bytes();
    for (const Plan& p : plan.layers)
      n += weight_bytes(p) + touched_experts(double(B)) * expert_params() * kFp4Bytes + double(B) * kv_bytes(p, ctx, release);
    return n;
  }
  double active_params(const Plan& p) const {
    return dense_params(p) + plain_params(p) + double(c.num_experts_per_tok) * expert_params() + hc_params() / 2;
  }
  double attn_flops(const Plan& p, double pos) const {  // token at position pos (0-based)
    const double H = c.num_heads, d = c.head_dim;
    double keys = std::min(pos + 1, double(c.sliding_window)), extra = 0;
    if (p.attends_compressed()) keys += std::min(entries(p, pos + 1), double(c.index_topk));
    if (p.select == model::SelectKind::kScore)
      extra = 2.0 * c.index_n_heads * c.index_head_dim * scanned(p, pos + 1);
    return 4 * H * d * keys + extra;
  }
  double prefill_flops(int64_t P) const override {
    double f = 2.0 * c.vocab_size * c.hidden_size;  // logits of the last token
    for (const Plan& p : plan.layers) {
      f += 2 * double(P) * active_params(p);
      for (int64_t i = 0; i < P; ++i) f += attn_flops(p, double(i));
    }
    return f;
  }
  double prefill_bytes(int64_t P) const override {
    double n = head_bytes();
    for (const Plan& p : plan.layers) n += weight_bytes(p) + touched_experts(double(P)) * expert_params() * kFp4Bytes;
    return n;
  }
  double decode_flops(int64_t B, double ctx) const override {
    double f = 2.0 * B * c.vocab_size * c.hidden_size;
    for (const Plan& p : plan.layers) f += B * (2 * active_params(p) + attn_flops(p, ctx));
    return f;
  }

 private:
  DeepseekV41Config c;
  model::ModelPlan plan;
};
}  // namespace

std::unique_ptr<FlashFloors> make_flash_floors(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  const nlohmann::json j = parse_json_or_throw<ConfigError>(read_regular_file_or_throw<ConfigError>(path), path);
  const std::string mt = j.is_object() && j.contains("model_type") && j["model_type"].is_string()
                             ? j["model_type"].get<std::string>()
                             : "";
  if (mt.rfind("deepseek_v41", 0) == 0) return std::make_unique<V41Floors>(DeepseekV41Config::from_file(model_dir));
  return std::make_unique<V4Floors>(DeepseekV4Config::from_file(model_dir));
}

}  // namespace deepinfer::cli
