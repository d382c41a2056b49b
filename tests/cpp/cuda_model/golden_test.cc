// The golden fixtures through the GPU model, in two numerics modes. SKIPs without a GPU.
//  * exact (fp32 weights/activations/caches, fp32 GEMMs without TF32): max |Δlogit| ≤ 1e-3 and
//    top-1 ≥ 99.9% vs transformers' fp32 logits for full, chunked and token-by-token runs; a batch
//    of sequences vs each alone to the same bound; a 64-token greedy chain equal to the CPU model.
//  * bf16 (bf16 weights/activations/caches, fp32 accumulation, no FP8/FP4 round trips): paths and
//    batch vs alone as tight as before (observed bit-identical); vs the fp32 fixture only to a
//    tolerance derived from bf16 rounding itself (see kBf16Rel below).
// Lines "[gpu-..." are collected by tools/gpu_model_check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>

#include "golden.h"
#include "model/deepseek_v4/cuda/cuda_model.h"
#include "model/deepseek_v4/model.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4 {
namespace {
using deepinfer::testing::golden_dir;
using deepinfer::testing::Npy;
using deepinfer::testing::read_inputs;
using deepinfer::testing::read_npy;
using gpu::Numerics;

constexpr double kTop1 = 0.999;
// Exact mode: the only differences left are fp32 summation orders (GEMM algorithms, attention
// and reduction trees); ~1e-5 expected, 1e-3 absolute is the bound (vs fixture, paths, batch).
constexpr double kExactAbs = 1e-3;
// bf16 mode vs the fp32 fixture. The random tiny models amplify rounding: transformers itself
// with only each Linear's input and output rounded to bf16 (weights are bf16-exact) deviates from
// its fp32 logits by rel 0.29 / top-1 0.947 on tiny "long", 0.11 on "medium", 0.10 on tiny_clamp
// "long". The GPU rounds at more places (q, kv, attention output, expert activations, cache
// entries), measured rel 0.53 / top-1 0.93 on tiny and tiny_official "long" — so this checks that
// bf16 stays in the bf16 regime (a wiring bug gives rel ~1 and top-1 near chance), not parity.
constexpr double kBf16Rel = 0.6;        // max|Δ| / max|ref|
constexpr double kBf16Top1 = 0.9;       // aggregated over the fixture's sequences
constexpr double kBf16PathRel = 3e-2;   // between GPU paths / batch vs alone (GEMM shapes differ)

const char* mode_name(Numerics n) {
  return n == Numerics::kExact ? "exact" : n == Numerics::kBf16 ? "bf16" : "production";
}

struct Diff {
  double max_abs = 0, max_ref = 0;
  int64_t mismatch = 0, rows = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
Diff compare(const float* got, const float* ref, int64_t rows, int64_t V) {
  Diff d;
  d.rows = rows;
  for (int64_t t = 0; t < rows; ++t) {
    const float *a = got + t * V, *b = ref + t * V;
    for (int64_t v = 0; v < V; ++v) {
      d.max_abs = std::max(d.max_abs, double(std::abs(a[v] - b[v])));
      d.max_ref = std::max(d.max_ref, double(std::abs(b[v])));
    }
    if (std::max_element(a, a + V) - a != std::max_element(b, b + V) - b) d.mismatch++;
  }
  return d;
}

std::vector<int64_t> random_chunks(int64_t T, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(1, 40);
  std::vector<int64_t> c;
  for (int64_t done = 0; done < T;) {
    const int64_t n = std::min(dist(gen), T - done);
    c.push_back(n);
    done += n;
  }
  return c;
}

// One sequence in chunks through slot `slot` (blocks slot*per_slot ..), logits of every position.
Tensor run_gpu(DeepseekV4CudaModel& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
               int32_t slot) {
  const int64_t T = int64_t(ids.size()), V = m.vocab_size();
  const kv::CacheGeometry& g = m.cache_geometry();
  const int64_t per_slot = g.num_blocks / g.num_slots;
  m.reset_slot(slot);
  SeqInBatch seq;
  seq.cache_slot = slot;
  for (int64_t b = 0; b < per_slot; ++b) seq.block_table.push_back(int32_t(slot * per_slot + b));
  Tensor out = Tensor::empty({T, V}, DType::kF32);
  int64_t done = 0;
  for (int64_t c : chunks) {
    ForwardBatch b;
    b.token_ids.assign(ids.begin() + done, ids.begin() + done + c);
    seq.num_computed_tokens = done;
    seq.num_new_tokens = int32_t(c);
    b.seqs = {seq};
    for (int64_t i = 0; i < c; ++i) b.logits_indices.push_back(int32_t(i));
    Tensor l = m.forward(b);
    std::copy_n(l.data<float>(), c * V, out.data<float>() + done * V);
    done += c;
  }
  return out;
}

class GpuGolden : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {
 protected:
  void SetUp() override {
    if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
    fixture_ = std::get<0>(GetParam());
    numerics_ = std::get<1>(GetParam());
    tag_ = fixture_ + " " + mode_name(numerics_);
    dir_ = golden_dir(fixture_);
    if (!std::filesystem::exists(dir_ + "/config.json")) GTEST_SKIP() << "fixture " << dir_ << " absent";
    CudaModelOptions o;
    o.numerics = numerics_;
    o.progress = false;
    o.max_batch_tokens = 2048;
    o.max_seqs = 8;
    o.max_context = 4096;
    model_ = DeepseekV4CudaModel::load(dir_, o);
    model_->allocate_cache_for(4, 512);
  }
  bool exact() const { return numerics_ == Numerics::kExact; }
  // vs the fp32 fixture
  void expect_parity(const Diff& d, const std::string& what) const {
    if (exact())
      EXPECT_LE(d.max_abs, kExactAbs) << tag_ << " " << what;
    else
      EXPECT_LE(d.rel(), kBf16Rel) << tag_ << " " << what;
  }
  // between two GPU runs of the same mode
  void expect_same(const Diff& d, const std::string& what) const {
    if (exact())
      EXPECT_LE(d.max_abs, kExactAbs) << tag_ << " " << what;
    else
      EXPECT_LE(d.rel(), kBf16PathRel) << tag_ << " " << what;
    EXPECT_EQ(d.mismatch, 0) << tag_ << " " << what;
  }
  std::string fixture_, tag_, dir_;
  Numerics numerics_ = Numerics::kExact;
  std::unique_ptr<DeepseekV4CudaModel> model_;
};

TEST_P(GpuGolden, FullChunkedDecodeMatchTransformers) {
  const int64_t V = model_->vocab_size();
  int64_t mism = 0, rows = 0;
  for (const auto& [name, ids] : read_inputs(dir_)) {
    const Npy ref = read_npy(dir_ + "/logits_" + name + ".npy");
    const int64_t T = int64_t(ids.size());
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
    const std::vector<std::pair<std::string, std::vector<int64_t>>> paths = {
        {"full", {T}}, {"chunked", random_chunks(T, 1234 + uint32_t(T))}, {"decode", std::vector<int64_t>(T, 1)}};
    Tensor full;
    for (const auto& [path, chunks] : paths) {
      Tensor logits = run_gpu(*model_, ids, chunks, 1);
      const Diff d = compare(logits.data<float>(), ref.data.data(), T, V);
      std::printf("[gpu-parity] %s/%s %s: max|dlogit| = %.3g (rel %.3g), top-1 mismatches %lld/%lld\n",
                  tag_.c_str(), name.c_str(), path.c_str(), d.max_abs, d.rel(), (long long)d.mismatch, (long long)T);
      expect_parity(d, name + " " + path);
      mism += d.mismatch;
      rows += T;
      if (path == "full") {
        full = logits;
      } else {
        const Diff dp = compare(logits.data<float>(), full.data<float>(), T, V);
        std::printf("[gpu-paths] %s/%s %s vs full: max|d| = %.3g (rel %.3g), top-1 mismatches %lld%s\n",
                    tag_.c_str(), name.c_str(), path.c_str(), dp.max_abs, dp.rel(), (long long)dp.mismatch,
                    dp.max_abs == 0 ? " (bit identical)" : "");
        expect_same(dp, name + " " + path + " vs full");
      }
    }
  }
  const double agree = rows ? 1.0 - double(mism) / double(rows) : 1.0;
  std::printf("[gpu-parity] %s: top-1 agreement %.5f over %lld positions\n", tag_.c_str(), agree, (long long)rows);
  EXPECT_GE(agree, exact() ? kTop1 : kBf16Top1) << tag_;
}

// Several sequences advance together with random chunk sizes (some steps skip a sequence),
// scattered block tables: each must match itself run alone.
TEST_P(GpuGolden, BatchOfSequencesMatchesEachAlone) {
  const int64_t V = model_->vocab_size();
  auto inputs = read_inputs(dir_);
  std::vector<std::string> names;
  for (auto& [k, v] : inputs) names.push_back(k);
  ASSERT_LE(names.size(), 3u);
  const kv::CacheGeometry& g = model_->cache_geometry();
  const int64_t per_slot = g.num_blocks / g.num_slots;
  struct St {
    std::vector<int32_t> ids;
    SeqInBatch seq;
    std::vector<float> logits;
    int64_t done = 0;
  };
  std::vector<St> st(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    st[i].ids = inputs[names[i]];
    st[i].seq.cache_slot = int32_t(i);
    for (int64_t b = per_slot - 1; b >= 0; --b) st[i].seq.block_table.push_back(int32_t(b * g.num_slots + i));
    st[i].logits.assign(st[i].ids.size() * size_t(V), 0.f);
    model_->reset_slot(int32_t(i));
  }
  std::mt19937 gen(77);
  std::uniform_int_distribution<int64_t> dist(0, 24);
  for (bool busy = true; busy;) {
    ForwardBatch b;
    std::vector<std::pair<size_t, int64_t>> rows;
    busy = false;
    for (size_t i = 0; i < st.size(); ++i) {
      const int64_t n = std::min(int64_t(st[i].ids.size()) - st[i].done, dist(gen));
      if (n == 0) continue;
      SeqInBatch s = st[i].seq;
      s.num_computed_tokens = st[i].done;
      s.num_new_tokens = int32_t(n);
      for (int64_t j = 0; j < n; ++j) {
        b.logits_indices.push_back(int32_t(b.token_ids.size()));
        b.token_ids.push_back(st[i].ids[st[i].done + j]);
        rows.push_back({i, st[i].done + j});
      }
      b.seqs.push_back(s);
      st[i].done += n;
    }
    for (auto& s : st) busy |= s.done < int64_t(s.ids.size());
    if (b.token_ids.empty()) continue;
    Tensor l = model_->forward(b);
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(l.data<float>() + r * V, V, st[rows[r].first].logits.data() + rows[r].second * V);
  }
  for (size_t i = 0; i < st.size(); ++i) {
    const int64_t T = int64_t(st[i].ids.size());
    const Npy ref = read_npy(dir_ + "/logits_" + names[i] + ".npy");
    const Diff d = compare(st[i].logits.data(), ref.data.data(), T, V);
    Tensor alone = run_gpu(*model_, st[i].ids, {T}, 3);
    const Diff da = compare(st[i].logits.data(), alone.data<float>(), T, V);
    std::printf("[gpu-batch] %s/%s: vs fixture max|d| %.3g rel %.3g (top-1 mismatches %lld), vs alone max|d| %.3g%s\n",
                tag_.c_str(), names[i].c_str(), d.max_abs, d.rel(), (long long)d.mismatch, da.max_abs,
                da.max_abs == 0 ? " (bit identical)" : "");
    expect_parity(d, names[i] + " batch");
    expect_same(da, names[i] + " batch vs alone");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGolden,
                         ::testing::Combine(::testing::Values("tiny", "tiny_clamp", "tiny_official"),
                                            ::testing::Values(Numerics::kExact, Numerics::kBf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + mode_name(std::get<1>(info.param));
                         });

int32_t argmax(const float* p, int64_t V) { return int32_t(std::max_element(p, p + V) - p); }

// Greedy decoding of 64 tokens from the "short" prompt: in exact mode the GPU chain equals the
// CPU model's (fp32); in bf16 mode the common prefix is printed only (bf16 rounding flips
// near-ties of these random models, see kBf16Rel).
class GpuGoldenChain : public ::testing::TestWithParam<Numerics> {};
TEST_P(GpuGoldenChain, Greedy64MatchesCpuModel) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture absent";
  CudaModelOptions o;
  o.numerics = GetParam();
  o.progress = false;
  o.max_batch_tokens = 1024;
  o.max_seqs = 4;
  o.max_context = 4096;
  auto gm = DeepseekV4CudaModel::load(dir, o);
  gm->allocate_cache_for(1, 1024);
  auto cm = DeepseekV4Model::load(dir);
  cm->allocate_cache_for(1, 1024);
  const std::vector<int32_t> prompt = read_inputs(dir).at("short");
  const int64_t V = gm->vocab_size();
  auto chain = [&](auto& m, const kv::CacheGeometry& g) {
    m.reset_slot(0);
    SeqInBatch s;
    s.cache_slot = 0;
    for (int64_t b = 0; b < g.num_blocks; ++b) s.block_table.push_back(int32_t(b));
    std::vector<int32_t> toks = prompt, out;
    int64_t done = 0;
    for (int step = 0; step < 64; ++step) {
      ForwardBatch b;
      b.token_ids.assign(toks.begin() + done, toks.end());
      s.num_computed_tokens = done;
      s.num_new_tokens = int32_t(b.token_ids.size());
      b.seqs = {s};
      b.logits_indices = {int32_t(b.token_ids.size() - 1)};
      Tensor l = m.forward(b);
      done = int64_t(toks.size());
      const int32_t next = argmax(l.data<float>(), V);
      out.push_back(next);
      toks.push_back(next);
    }
    return out;
  };
  const std::vector<int32_t> g_chain = chain(*gm, gm->cache_geometry());
  const std::vector<int32_t> c_chain = chain(*cm, cm->cache().geometry());
  size_t same = 0;
  while (same < g_chain.size() && g_chain[same] == c_chain[same]) ++same;
  std::printf("[gpu-chain] tiny %s greedy 64: %zu leading tokens equal to the CPU chain\n", mode_name(GetParam()),
              same);
  if (GetParam() == Numerics::kExact) EXPECT_EQ(g_chain, c_chain);
}
INSTANTIATE_TEST_SUITE_P(Modes, GpuGoldenChain, ::testing::Values(Numerics::kExact, Numerics::kBf16),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

}  // namespace
}  // namespace deepinfer::model::v4
