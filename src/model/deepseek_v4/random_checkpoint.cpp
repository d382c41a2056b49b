#include "model/deepseek_v4/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "core/parallel.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/fast_fill.h"

namespace deepinfer::model::v4 {
namespace fs = std::filesystem;

namespace {
enum class Init { kNorm, kHcScale, kHcBase, kHcFn, kSink, kApe, kExpert, kEmbed, kLinear, kBias, kTid2eid };
// How the official layout stores it: dense linear (cfg.dense_format), routed expert
// (cfg.expert_format), bf16 (norms, router, compressor, embed/head), f32, i64.
enum class Store { kDense, kExpert, kBF16, kF32, kI64 };

struct Spec {
  std::string off, hf;  // release name; transformers state_dict name ("" = not in that layout)
  Shape shape;
  Init init;
  Store store;
};

uint64_t name_seed(uint64_t seed, const std::string& name) { return fast::name_key(seed, name); }

// (mean, sd) of a tensor's values by its Init kind (header comment).
std::pair<double, double> init_moments(const Spec& s) {
  const double fan_in = s.shape.size() == 2 ? double(s.shape[1]) : 1.0;
  switch (s.init) {
    case Init::kNorm: return {1, 0.1};
    case Init::kHcScale: return {1, 0.3};
    case Init::kHcBase: return {0, 0.5};
    case Init::kHcFn: return {0, 0.05};
    case Init::kSink: return {0, 1};
    case Init::kApe: return {0, 0.5};
    case Init::kExpert: return {0, 0.06};
    case Init::kEmbed: return {0, 1};
    case Init::kLinear: return {0, 1 / std::sqrt(fan_in)};
    case Init::kBias: return {0, 0.05};
    case Init::kTid2eid: break;
  }
  return {0, 1};
}

std::vector<float> make_values(const Spec& s, uint64_t seed, int64_t num_experts) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  std::mt19937_64 rng(name_seed(seed, s.off));
  // Box-Muller on raw 64-bit draws: identical on every platform (std::normal_distribution is not).
  auto normal = [&]() {
    double u1 = (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = double(rng() >> 11) * (1.0 / 9007199254740992.0);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  std::vector<float> v(static_cast<size_t>(n));
  if (s.init == Init::kTid2eid) {  // k distinct experts per row
    const int64_t k = s.shape[1];
    for (int64_t r = 0; r < s.shape[0]; ++r)
      for (int64_t j = 0; j < k; ++j) {
        int64_t e;
        bool dup;
        do {
          e = int64_t(rng() % uint64_t(num_experts));
          dup = false;
          for (int64_t q = 0; q < j; ++q) dup |= int64_t(v[r * k + q]) == e;
        } while (dup);
        v[r * k + j] = float(e);
      }
    return v;
  }
  const auto [mean, sd] = init_moments(s);
  for (auto& x : v) x = float(mean + sd * normal());
  return v;
}

// --- enumeration of every tensor of a config, in release order ---
struct Enumerator {
  const DeepseekV4Config& c;
  std::vector<Spec> specs;
  void add(const std::string& off, const std::string& hf, Shape shape, Init init, Store store) {
    specs.push_back({off, hf, std::move(shape), init, store});
  }
  void compressor(const std::string& o, const std::string& h, int64_t ratio, int64_t d, bool overlap) {
    const int64_t w = overlap ? 2 * d : d, D = c.hidden_size;
    add(o + "wkv.weight", h + "kv_proj.weight", {w, D}, Init::kLinear, Store::kBF16);
    add(o + "wgate.weight", h + "gate_proj.weight", {w, D}, Init::kLinear, Store::kBF16);
    add(o + "ape", h + "position_bias", {ratio, w}, Init::kApe, Store::kF32);
    add(o + "norm.weight", h + "kv_norm.weight", {d}, Init::kNorm, Store::kBF16);
  }
  void block(const std::string& o, const std::string& h, AttnKind kind, int64_t ratio, MlpKind mlp) {
    const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank, E = c.n_routed_experts,
                  I = c.moe_intermediate_size;
    add(o + "attn_norm.weight", h + "input_layernorm.weight", {D}, Init::kNorm, Store::kBF16);
    add(o + "ffn_norm.weight", h + "post_attention_layernorm.weight", {D}, Init::kNorm, Store::kBF16);
    for (const char* site : {"attn", "ffn"}) {
      const std::string so = o + "hc_" + site + "_", sh = h + site + "_hc.";
      add(so + "fn", sh + "fn", {c.hc_mix_dim(), c.hc_dim()}, Init::kHcFn, Store::kF32);
      add(so + "base", sh + "base", {c.hc_mix_dim()}, Init::kHcBase, Store::kF32);
      add(so + "scale", sh + "scale", {3}, Init::kHcScale, Store::kF32);
    }
    const std::string a = o + "attn.", ah = h + "self_attn.";
    add(a + "wq_a.weight", ah + "q_a_proj.weight", {r, D}, Init::kLinear, Store::kDense);
    add(a + "q_norm.weight", ah + "q_a_norm.weight", {r}, Init::kNorm, Store::kBF16);
    add(a + "wq_b.weight", ah + "q_b_proj.weight", {H * d, r}, Init::kLinear, Store::kDense);
    add(a + "wkv.weight", ah + "kv_proj.weight", {d, D}, Init::kLinear, Store::kDense);
    add(a + "kv_norm.weight", ah + "kv_norm.weight", {d}, Init::kNorm, Store::kBF16);
    add(a + "wo_a.weight", ah + "o_a_proj.weight", {c.o_groups * c.o_lora_rank, H * d / c.o_groups}, Init::kLinear,
        Store::kDense);
    add(a + "wo_b.weight", ah + "o_b_proj.weight", {D, c.o_groups * c.o_lora_rank}, Init::kLinear, Store::kDense);
    add(a + "attn_sink", ah + "sinks", {H}, Init::kSink, Store::kF32);
    if (kind != AttnKind::kSliding) compressor(a + "compressor.", ah + "compressor.", ratio, d, kind == AttnKind::kCSA);
    if (kind == AttnKind::kCSA) {
      const std::string x = a + "indexer.", xh = ah + "compressor.indexer.";
      add(x + "wq_b.weight", xh + "q_b_proj.weight", {c.index_n_heads * c.index_head_dim, r}, Init::kLinear,
          Store::kDense);
      add(x + "weights_proj.weight", xh + "scorer.weights_proj.weight", {c.index_n_heads, D}, Init::kLinear,
          Store::kBF16);
      compressor(x + "compressor.", xh, ratio, c.index_head_dim, true);
    }
    const std::string f = o + "ffn.", fh = h + "mlp.";
    add(f + "gate.weight", fh + "gate.weight", {E, D}, Init::kLinear, Store::kBF16);
    if (mlp == MlpKind::kHashMoE)
      add(f + "gate.tid2eid", fh + "gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, Init::kTid2eid, Store::kI64);
    else
      add(f + "gate.bias", fh + "gate.e_score_correction_bias", {E}, Init::kBias, Store::kF32);
    for (int64_t e = 0; e < E; ++e) {  // HF fuses these; handled by the writer (hf name left empty)
      const std::string eo = f + "experts." + std::to_string(e) + ".";
      add(eo + "w1.weight", "", {I, D}, Init::kExpert, Store::kExpert);
      add(eo + "w2.weight", "", {D, I}, Init::kExpert, Store::kExpert);
      add(eo + "w3.weight", "", {I, D}, Init::kExpert, Store::kExpert);
    }
    if (c.n_shared_experts > 0) {
      const std::string s = f + "shared_experts.", sh = fh + "shared_experts.";
      add(s + "w1.weight", sh + "gate_proj.weight", {I, D}, Init::kLinear, Store::kDense);
      add(s + "w2.weight", sh + "down_proj.weight", {D, I}, Init::kLinear, Store::kDense);
      add(s + "w3.weight", sh + "up_proj.weight", {I, D}, Init::kLinear, Store::kDense);
    }
  }
  void all(bool with_mtp) {
    const int64_t V = c.vocab_size, D = c.hidden_size;
    add("embed.weight", "model.embed_tokens.weight", {V, D}, Init::kEmbed, Store::kBF16);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string L = "layers." + std::to_string(l) + ".";
      block(L, "model." + L, c.layer_types[l], c.compress_ratio[l], c.mlp_types[l]);
    }
    add("norm.weight", "model.norm.weight", {D}, Init::kNorm, Store::kBF16);
    add("hc_head_fn", "model.hc_head.hc_fn", {c.hc_mult, c.hc_dim()}, Init::kHcFn, Store::kF32);
    add("hc_head_base", "model.hc_head.hc_base", {c.hc_mult}, Init::kHcBase, Store::kF32);
    add("hc_head_scale", "model.hc_head.hc_scale", {1}, Init::kHcScale, Store::kF32);
    add("head.weight", "lm_head.weight", {V, D}, Init::kLinear, Store::kBF16);
    if (!with_mtp) return;
    for (int64_t k = 0; k < c.num_mtp_layers; ++k) {
      const std::string m = "mtp." + std::to_string(k) + ".";
      add(m + "e_proj.weight", "", {D, D}, Init::kLinear, Store::kDense);
      add(m + "h_proj.weight", "", {D, D}, Init::kLinear, Store::kDense);
      add(m + "enorm.weight", "", {D}, Init::kNorm, Store::kBF16);
      add(m + "hnorm.weight", "", {D}, Init::kNorm, Store::kBF16);
      add(m + "norm.weight", "", {D}, Init::kNorm, Store::kBF16);
      add(m + "hc_head_fn", "", {c.hc_mult, c.hc_dim()}, Init::kHcFn, Store::kF32);
      add(m + "hc_head_base", "", {c.hc_mult}, Init::kHcBase, Store::kF32);
      add(m + "hc_head_scale", "", {1}, Init::kHcScale, Store::kF32);
      const int64_t ratio = k < int64_t(c.mtp_compress_ratio.size()) ? c.mtp_compress_ratio[k] : 0;
      block(m, m, ratio == 0 ? AttnKind::kSliding : ratio == 4 ? AttnKind::kCSA : AttnKind::kHCA, ratio, MlpKind::kMoE);
    }
  }
};

// Power-of-two scale (ue8m0) so that amax/scale <= qmax: 2^ceil(log2(amax/qmax)).
uint8_t e8m0_for(float amax, float qmax) { return fast::e8m0_for(amax, qmax); }

struct Out {  // one tensor ready for the writer
  std::string name, st_dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

void push_scale(std::vector<Out>& out, const std::string& wname, Shape shape, std::vector<uint8_t> s) {
  std::string base = wname.substr(0, wname.size() - std::string(".weight").size());
  out.push_back({base + ".scale", "F8_E8M0", std::move(shape), std::move(s)});
}

void quantize_fp8(std::vector<Out>& out, const std::string& name, const std::vector<float>& v, int64_t rows,
                  int64_t cols, int64_t b) {
  const int64_t sr = (rows + b - 1) / b, sc = (cols + b - 1) / b;
  std::vector<uint8_t> q(size_t(rows * cols)), s(size_t(sr * sc));
  for (int64_t bi = 0; bi < sr; ++bi)
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 0;
      for (int64_t i = bi * b; i < std::min(rows, (bi + 1) * b); ++i)
        for (int64_t j = bj * b; j < std::min(cols, (bj + 1) * b); ++j) amax = std::max(amax, std::fabs(v[i * cols + j]));
      const uint8_t e = e8m0_for(amax, 448.f);
      s[bi * sc + bj] = e;
      const float inv = 1.f / e8m0_to_f32(e);
      for (int64_t i = bi * b; i < std::min(rows, (bi + 1) * b); ++i)
        for (int64_t j = bj * b; j < std::min(cols, (bj + 1) * b); ++j)
          q[i * cols + j] = f32_to_fp8e4m3(v[i * cols + j] * inv);
    }
  out.push_back({name, "F8_E4M3", {rows, cols}, std::move(q)});
  push_scale(out, name, {sr, sc}, std::move(s));
}

void quantize_fp4(std::vector<Out>& out, const std::string& name, const std::vector<float>& v, int64_t rows,
                  int64_t cols, int64_t b) {
  DI_CHECK(cols % b == 0 && b % 2 == 0, "fp4 quantisation needs cols % ", b, " == 0, got ", cols);
  std::vector<uint8_t> q(size_t(rows * cols / 2), 0), s(size_t(rows * cols / b));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < cols / b; ++g) {
      float amax = 0;
      for (int64_t j = g * b; j < (g + 1) * b; ++j) amax = std::max(amax, std::fabs(v[i * cols + j]));
      const uint8_t e = e8m0_for(amax, 6.f);
      s[i * (cols / b) + g] = e;
      const float inv = 1.f / e8m0_to_f32(e);
      for (int64_t j = g * b; j < (g + 1) * b; ++j) {
        const uint8_t nib = f32_to_fp4e2m1(v[i * cols + j] * inv);
        q[(i * cols + j) / 2] |= uint8_t((j & 1) ? nib << 4 : nib);  // element 2k low nibble
      }
    }
  out.push_back({name, "I8", {rows, cols / 2}, std::move(q)});
  push_scale(out, name, {rows, cols / b}, std::move(s));
}

std::vector<uint8_t> encode_float(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> b(dtype_nbytes(dt, int64_t(v.size())));
  if (dt == DType::kF32) {
    std::memcpy(b.data(), v.data(), b.size());
  } else {
    DI_CHECK(dt == DType::kBF16, "encode_float: ", dtype_name(dt));
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

std::vector<uint8_t> encode_i64(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 8);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = int64_t(v[i]);
    std::memcpy(b.data() + 8 * i, &x, 8);
  }
  return b;
}

void encode_official(std::vector<Out>& out, const Spec& s, const std::vector<float>& v, const DeepseekV4Config& c) {
  WeightFormat f = s.store == Store::kDense ? c.dense_format : c.expert_format;
  switch (s.store) {
    case Store::kI64: out.push_back({s.off, "I64", s.shape, encode_i64(v)}); return;
    case Store::kF32: out.push_back({s.off, "F32", s.shape, encode_float(v, DType::kF32)}); return;
    case Store::kBF16: out.push_back({s.off, "BF16", s.shape, encode_float(v, DType::kBF16)}); return;
    case Store::kDense: case Store::kExpert:
      if (f == WeightFormat::kFP8Block) quantize_fp8(out, s.off, v, s.shape[0], s.shape[1], c.fp8_block);
      else if (f == WeightFormat::kFP4) quantize_fp4(out, s.off, v, s.shape[0], s.shape[1], c.fp4_block);
      else out.push_back({s.off, f == WeightFormat::kF32 ? "F32" : "BF16", s.shape,
                          encode_float(v, f == WeightFormat::kF32 ? DType::kF32 : DType::kBF16)});
      return;
  }
}

// Transformers layout: per-expert specs of one layer are gathered into gate_up_proj / down_proj.
void encode_transformers(std::vector<Out>& out, const std::vector<Spec>& specs, uint64_t seed,
                         const DeepseekV4Config& c, DType dt) {
  const std::string st = std::string(dtype_to_safetensors(dt));
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, D = c.hidden_size;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    if (s.off.rfind("mtp.", 0) == 0) continue;
    if (s.store != Store::kExpert) {
      std::vector<float> v = make_values(s, seed, E);
      out.push_back({s.hf, s.store == Store::kI64 ? "I64" : st, s.shape,
                     s.store == Store::kI64 ? encode_i64(v) : encode_float(v, dt)});
      continue;
    }
    // specs[i .. i+3E) are experts.0.w1, .w2, .w3, experts.1.w1, ... of one layer.
    const std::string layer = s.off.substr(0, s.off.find("ffn.experts."));
    std::vector<float> gu, dn;
    gu.reserve(size_t(E * 2 * I * D));
    dn.reserve(size_t(E * D * I));
    for (int64_t e = 0; e < E; ++e) {
      auto w1 = make_values(specs[i + 3 * e], seed, E), w2 = make_values(specs[i + 3 * e + 1], seed, E),
           w3 = make_values(specs[i + 3 * e + 2], seed, E);
      gu.insert(gu.end(), w1.begin(), w1.end());
      gu.insert(gu.end(), w3.begin(), w3.end());
      dn.insert(dn.end(), w2.begin(), w2.end());
    }
    out.push_back({"model." + layer + "mlp.experts.gate_up_proj", st, {E, 2 * I, D}, encode_float(gu, dt)});
    out.push_back({"model." + layer + "mlp.experts.down_proj", st, {E, D, I}, encode_float(dn, dt)});
    i += size_t(3 * E - 1);
  }
}

// ---------------- fast mode (RandomCheckpointOptions::fast; fast_fill.h) ----------------
// One Spec as a streamed item: its stored tensors (weight, then scale) are adjacent in the file.
fast::Item plan_item(const Spec& s, const DeepseekV4Config& c, uint64_t seed) {
  fast::Item it;
  const WeightFormat fmt = s.store == Store::kExpert ? c.expert_format : c.dense_format;
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  const std::string scale = s.off.substr(0, s.off.size() - std::string(".weight").size()) + ".scale";
  bool quantised = false;
  switch (s.store) {
    case Store::kI64: it.add(s.off, "I64", s.shape, uint64_t(n) * 8); break;
    case Store::kF32: it.add(s.off, "F32", s.shape, uint64_t(n) * 4); break;
    case Store::kBF16: it.add(s.off, "BF16", s.shape, uint64_t(n) * 2); break;
    case Store::kDense: case Store::kExpert: {
      const int64_t R = s.shape[0], C = s.shape[1];
      if (fmt == WeightFormat::kFP8Block) {
        const int64_t b = c.fp8_block, sr = (R + b - 1) / b, sc = (C + b - 1) / b;
        it.add(s.off, "F8_E4M3", s.shape, uint64_t(n));
        it.add(scale, "F8_E8M0", {sr, sc}, uint64_t(sr * sc));
        quantised = true;
      } else if (fmt == WeightFormat::kFP4) {
        if (C % c.fp4_block != 0 || c.fp4_block % 2 != 0)
          DI_THROW(InvalidArgument, s.off, ": fp4 needs in-width % ", c.fp4_block, " == 0, got ", C);
        it.add(s.off, "I8", {R, C / 2}, uint64_t(n / 2));
        it.add(scale, "F8_E8M0", {R, C / c.fp4_block}, uint64_t(n / c.fp4_block));
        quantised = true;
      } else if (fmt == WeightFormat::kF32) {
        it.add(s.off, "F32", s.shape, uint64_t(n) * 4);
      } else {
        it.add(s.off, "BF16", s.shape, uint64_t(n) * 2);
      }
      break;
    }
  }
  const uint64_t key = name_seed(seed, s.off);
  const auto [mean_d, sd_d] = init_moments(s);
  const float mean = float(mean_d), sd = float(sd_d);
  const uint64_t weight_bytes = it.pieces[0].nbytes;
  const bool f32 = it.pieces[0].st_dtype == "F32";
  const int64_t E = c.n_routed_experts, fp8_block = c.fp8_block, fp4_block = c.fp4_block;
  const Spec* sp = &s;
  it.fill = [=](uint8_t* dst) {
    if (sp->init == Init::kTid2eid) {  // k distinct experts per row
      const int64_t k = sp->shape[1];
      // dst sits wherever the tensor falls in the file (safetensors packs tensors back to back), so
      // an int64_t store there can be misaligned (undefined; UBSan's finding): each row is drawn
      // into an aligned buffer and copied.
      parallel_for(0, sp->shape[0], [&](int64_t r) {
        std::vector<int64_t> row(static_cast<size_t>(k));
        uint64_t draw = uint64_t(r) << 20;
        for (int64_t j = 0; j < k; ++j) {
          bool dup = true;
          while (dup) {
            row[size_t(j)] = int64_t(fast::mix64(key + ++draw * 0x9e3779b97f4a7c15ull) % uint64_t(E));
            dup = false;
            for (int64_t q = 0; q < j; ++q) dup |= row[size_t(q)] == row[size_t(j)];
          }
        }
        std::memcpy(dst + size_t(r * k) * sizeof(int64_t), row.data(), size_t(k) * sizeof(int64_t));
      }, 1024);
      return;
    }
    if (quantised) {
      uint8_t* sc = dst + weight_bytes;
      if (fmt == WeightFormat::kFP8Block)
        fast::fill_fp8(dst, sc, sp->shape[0], sp->shape[1], fp8_block, fp8_block, key, mean, sd);
      else
        fast::fill_fp4(dst, sc, sp->shape[0], sp->shape[1], fp4_block, key, mean, sd);
      return;
    }
    fast::fill_float(dst, n, f32, key, mean, sd);
  };
  return it;
}

void write_fast(const std::string& dir, const DeepseekV4Config& c, const std::vector<Spec>& specs,
                const RandomCheckpointOptions& opts) {
  std::vector<fast::Item> items;
  items.reserve(specs.size());
  for (const Spec& s : specs) items.push_back(plan_item(s, c, opts.seed));
  fast::write_streamed(dir, items, opts.num_shards, opts.progress);
}
}  // namespace

void write_random_checkpoint(const std::string& dir, DeepseekV4Config cfg, const RandomCheckpointOptions& opts) {
  cfg.layout = opts.layout;
  if (cfg.architecture.empty()) cfg.architecture = "DeepseekV4ForCausalLM";
  if (opts.layout == CheckpointLayout::kTransformers) cfg.dense_format = cfg.expert_format = WeightFormat::kBF16;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) DI_THROW(CheckpointError, dir, ": cannot create folder: ", ec.message());
  {
    std::ofstream cf(fs::path(dir) / "config.json");
    cf << cfg.to_json_string();
    if (!cf) DI_THROW(CheckpointError, dir, "/config.json: write failed");
  }
  Enumerator en{cfg, {}};
  en.all(opts.layout == CheckpointLayout::kOfficial);
  if (opts.fast) {
    if (opts.layout != CheckpointLayout::kOfficial)
      DI_THROW(InvalidArgument, "write_random_checkpoint: fast mode writes the official layout only");
    write_fast(dir, cfg, en.specs, opts);
    return;
  }
  std::vector<Out> out;
  if (opts.layout == CheckpointLayout::kOfficial) {
    for (const Spec& s : en.specs) encode_official(out, s, make_values(s, opts.seed, cfg.n_routed_experts), cfg);
  } else {
    encode_transformers(out, en.specs, opts.seed, cfg, opts.dtype);
  }
  // Split into shards of roughly equal bytes, keeping release order.
  uint64_t total = 0;
  for (const auto& o : out) total += o.bytes.size();
  const int n = std::max(1, opts.num_shards);
  std::vector<io::SafetensorsWriter> shards(static_cast<size_t>(n));
  std::map<std::string, std::string> weight_map;
  auto shard_name = [&](int i) {
    if (n == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
    return std::string(buf);
  };
  uint64_t acc = 0;
  for (const auto& o : out) {
    int si = std::min(n - 1, int(acc * uint64_t(n) / std::max<uint64_t>(total, 1)));
    shards[size_t(si)].add_raw(o.name, o.st_dtype, o.shape, o.bytes.data(), o.bytes.size());
    weight_map[o.name] = shard_name(si);
    acc += o.bytes.size();
  }
  for (int i = 0; i < n; ++i) {
    shards[size_t(i)].set_metadata("format", "pt");
    shards[size_t(i)].write((fs::path(dir) / shard_name(i)).string());
  }
  if (n > 1) io::write_index(dir, weight_map, total);
}

DeepseekV4Config default_model_config(CheckpointLayout layout) {
  DeepseekV4Config c;
  c.architecture = "DeepseekV4ForCausalLM";
  c.layout = layout;
  c.vocab_size = 129280;
  c.hidden_size = 128;
  c.num_layers = 6;
  c.num_heads = 4;
  c.head_dim = 64;
  c.rope_head_dim = 16;
  c.q_lora_rank = 64;
  c.o_groups = 2;
  c.o_lora_rank = 32;
  c.sliding_window = 16;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 64;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  // 16 indexer heads: with fewer, relu makes many scores exactly 0 and top-k ties (spec §9).
  c.index_n_heads = 16;
  c.index_head_dim = 32;
  c.index_topk = 8;
  c.layer_types = {AttnKind::kSliding, AttnKind::kSliding, AttnKind::kCSA, AttnKind::kHCA, AttnKind::kCSA, AttnKind::kHCA};
  c.compress_ratio = {0, 0, 4, 16, 4, 16};
  c.mlp_types = {MlpKind::kHashMoE, MlpKind::kHashMoE, MlpKind::kHashMoE, MlpKind::kMoE, MlpKind::kMoE, MlpKind::kMoE};
  c.rope.theta = 10000.0;
  c.compress_rope = {160000.0, true, 16.0, 65536, 32.0, 1.0, 1.0};
  c.num_mtp_layers = layout == CheckpointLayout::kOfficial ? 1 : 0;
  c.mtp_compress_ratio.assign(size_t(c.num_mtp_layers), 0);
  c.max_position_embeddings = 1048576;
  if (layout == CheckpointLayout::kOfficial) {
    c.dense_format = WeightFormat::kFP8Block;
    c.expert_format = WeightFormat::kFP4;
    c.scale_fmt = "ue8m0";
  }
  return c;
}

DeepseekV4Config flash_stack_config(int64_t num_layers) {
  if (num_layers < 1 || num_layers > 43)
    DI_THROW(InvalidArgument, "flash_stack_config: num_layers must be in [1, 43] (V4-Flash has 43), got ", num_layers);
  DeepseekV4Config c;
  c.architecture = "DeepseekV4ForCausalLM";
  c.layout = CheckpointLayout::kOfficial;
  c.vocab_size = 129280;
  c.hidden_size = 4096;
  c.num_layers = num_layers;
  c.num_heads = 64;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.q_lora_rank = 1024;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 6;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 2048;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.index_n_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  // compress_ratios = [0, 0] + [4, 128] * 20 + [4] for the 43 main layers; hash MoE on layers 0-2.
  for (int64_t l = 0; l < num_layers; ++l) {
    const int64_t ratio = l < 2 ? 0 : (l % 2 == 0 ? 4 : 128);
    c.compress_ratio.push_back(ratio);
    c.layer_types.push_back(ratio == 0 ? AttnKind::kSliding : ratio == 4 ? AttnKind::kCSA : AttnKind::kHCA);
    c.mlp_types.push_back(l < 3 ? MlpKind::kHashMoE : MlpKind::kMoE);
  }
  c.rope.theta = 10000.0;
  c.compress_rope = {160000.0, true, 16.0, 65536, 32.0, 1.0, 1.0};
  c.num_mtp_layers = 0;
  c.max_position_embeddings = 1048576;
  c.dense_format = WeightFormat::kFP8Block;
  c.expert_format = WeightFormat::kFP4;
  c.scale_fmt = "ue8m0";
  return c;
}

}  // namespace deepinfer::model::v4
