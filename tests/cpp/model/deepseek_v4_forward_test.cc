// DeepSeek-V4 CPU forward vs the golden fixtures (transformers fp32 logits): full forward,
// chunked prefill with random chunk sizes, token-by-token decode, several sequences in one batch,
// the release-layout checkpoint (FP8/FP4 dequantised) and the MTP draft head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "deepinfer/error.h"
#include "golden.h"
#include "model/deepseek_v4/model.h"
#include "model/sequence_runner.h"

namespace deepinfer::model::v4 {
namespace {
using deepinfer::testing::compare_logits;
using deepinfer::testing::golden_dir;
using Diff = deepinfer::testing::LogitsDiff;
using deepinfer::testing::Npy;
using deepinfer::testing::read_inputs;
using deepinfer::testing::random_chunks;
using deepinfer::testing::read_npy;
using deepinfer::testing::scattered_block_table;

constexpr double kTol = 1e-4;

class GoldenForward : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = golden_dir(GetParam());
    if (!std::filesystem::exists(dir_ + "/config.json")) GTEST_SKIP() << "fixture " << dir_ << " absent";
    model_ = DeepseekV4Model::load(dir_);
    model_->allocate_cache_for(4, 512);
  }
  std::string dir_;
  std::unique_ptr<DeepseekV4Model> model_;
};

TEST_P(GoldenForward, FullChunkedDecodeMatchTransformers) {
  const int64_t V = model_->vocab_size();
  for (const auto& [name, ids] : read_inputs(dir_)) {
    const Npy ref = read_npy(dir_ + "/logits_" + name + ".npy");
    const int64_t T = int64_t(ids.size());
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
    const std::vector<std::pair<std::string, std::vector<int64_t>>> paths = {
        {"full", {T}}, {"chunked", random_chunks(T, 1234 + uint32_t(T))}, {"decode", std::vector<int64_t>(T, 1)}};
    for (const auto& [path, chunks] : paths) {
      Tensor logits = run_sequence(*model_, ids, chunks, /*slot=*/1);
      const Diff d = compare_logits(logits.data<float>(), ref.data.data(), T, V);
      std::printf("[parity] %s/%s %s: max|dlogit| = %.3g, argmax mismatches %lld/%lld\n", GetParam().c_str(),
                  name.c_str(), path.c_str(), d.max_abs, (long long)d.argmax_mismatch, (long long)T);
      EXPECT_LE(d.max_abs, kTol) << name << " " << path;
      EXPECT_EQ(d.argmax_mismatch, 0) << name << " " << path;
    }
  }
}

// Several sequences of different lengths advance together, each with its own random chunk
// schedule (some steps skip a sequence): every position must match the fixture, and the batch
// must agree with running each sequence alone.
TEST_P(GoldenForward, BatchOfSequencesMatchesEachAlone) {
  const int64_t V = model_->vocab_size();
  auto inputs = read_inputs(dir_);
  std::vector<std::string> names;
  for (auto& [k, v] : inputs) names.push_back(k);
  const kv::CacheGeometry& g = model_->cache().geometry();
  std::vector<InterleavedSequence> st(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    st[i].ids = inputs[names[i]];
    st[i].seq.cache_slot = int32_t(i);
    st[i].seq.block_table = scattered_block_table(g, int32_t(i));
  }
  run_interleaved(*model_, st, /*seed=*/77, /*max_chunk=*/24);
  for (size_t i = 0; i < st.size(); ++i) {
    const int64_t T = int64_t(st[i].ids.size());
    const Npy ref = read_npy(dir_ + "/logits_" + names[i] + ".npy");
    const Diff d = compare_logits(st[i].logits.data(), ref.data.data(), T, V);
    EXPECT_LE(d.max_abs, kTol) << names[i];
    EXPECT_EQ(d.argmax_mismatch, 0) << names[i];
    Tensor alone = run_sequence(*model_, st[i].ids, {T}, 3);
    const Diff da = compare_logits(st[i].logits.data(), alone.data<float>(), T, V);
    std::printf("[batch] %s/%s: vs fixture %.3g, vs alone %.3g\n", GetParam().c_str(), names[i].c_str(), d.max_abs,
                da.max_abs);
    EXPECT_LE(da.max_abs, 2e-5) << names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenForward, ::testing::Values("tiny", "tiny_clamp", "tiny_official"));

// MTP draft head (§7) of the release-layout fixture: full, chunked and token-by-token.
TEST(GoldenMtp, DraftLogitsMatchReference) {
  const std::string dir = golden_dir("tiny_official");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  auto model = DeepseekV4Model::load(dir);
  ASSERT_TRUE(model->has_mtp());
  model->allocate_cache_for(2, 512);
  const int64_t V = model->vocab_size(), n = model->config().hc_mult, D = model->config().hidden_size;
  for (const auto& [name, ids] : read_inputs(dir)) {
    const std::string path = dir + "/mtp_logits_" + name + ".npy";
    if (!std::filesystem::exists(path)) continue;
    const Npy ref = read_npy(path);
    const int64_t T = int64_t(ids.size()), N = T - 1;
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{N, V}));
    Tensor hidden;
    run_sequence(*model, ids, {T}, 0, /*need_hidden=*/true, &hidden);
    for (const auto& chunks : {std::vector<int64_t>{N}, random_chunks(N, 5), std::vector<int64_t>(N, 1)}) {
      model->reset_slot(0);
      std::vector<float> got(size_t(N * V));
      int64_t done = 0;
      for (int64_t c : chunks) {
        ForwardBatch b;
        b.token_ids.assign(ids.begin() + done + 1, ids.begin() + done + 1 + c);
        SeqInBatch s;
        s.cache_slot = 0;
        s.block_table = {0, 1};
        s.num_computed_tokens = done;
        s.num_new_tokens = int32_t(c);
        b.seqs = {s};
        for (int64_t i = 0; i < c; ++i) b.logits_indices.push_back(int32_t(i));
        Tensor h = hidden.slice(0, done, done + c).contiguous();
        Tensor l = model->forward_mtp(b, h);
        std::copy_n(l.data<float>(), c * V, got.data() + done * V);
        done += c;
      }
      const Diff d = compare_logits(got.data(), ref.data.data(), N, V);
      std::printf("[mtp] %s chunks=%zu: max|dlogit| = %.3g, argmax mismatches %lld\n", name.c_str(), chunks.size(),
                  d.max_abs, (long long)d.argmax_mismatch);
      EXPECT_LE(d.max_abs, kTol) << name;
      EXPECT_EQ(d.argmax_mismatch, 0) << name;
    }
    (void)n, (void)D;
  }
}

// Backend::linear_many's default (the CPU backend keeps it): every job's y bit for bit what its
// own `linear` call gives, on an odd M and strides, with outputs interleaved in one padded buffer;
// M = 0 and an empty job list write nothing.
TEST(DeepseekV4Forward, LinearManyEqualsSeparateLinears) {
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  auto model = DeepseekV4Model::load(dir);
  ds::ModelBackend& be = model->backend();
  const ds::LayerRef& L = be.weights().layers.at(1);
  std::vector<const ds::LinearRef*> ws = {&L.attn.wq_a, &L.attn.wkv, &L.ffn.gate};
  const int64_t D = ws[0]->in, M = 19, ldx = D + 5;
  int64_t width = 0;
  for (const ds::LinearRef* w : ws) {
    ASSERT_TRUE(w->defined());
    ASSERT_EQ(w->in, D);
    width += w->out + 3;  // each output 3 columns wider than its rows: padded row strides
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(size_t(M * ldx));
  for (float& v : x) v = u(rng);
  std::vector<float> many(size_t(M * width), -7.f), alone(many.size(), -7.f);
  std::vector<ds::LinearJob> jobs;
  int64_t col = 0;
  for (const ds::LinearRef* w : ws) {  // job i writes columns [col, col + out) of [M, width]
    jobs.push_back({.W = w, .y = many.data() + col, .y_dtype = DType::kF32, .ldy = width});
    be.linear(*w, x.data(), ldx, M, alone.data() + col, DType::kF32, width);
    col += w->out + 3;
  }
  be.linear_many(x.data(), ldx, M, jobs);
  EXPECT_EQ(std::memcmp(many.data(), alone.data(), many.size() * sizeof(float)), 0);
  int64_t nonzero = 0;
  for (float v : many) nonzero += v != 0.f && v != -7.f;
  EXPECT_GT(nonzero, M * (width - 9) / 2);  // the products ran (random weights and x: non-zero)
  std::vector<float> untouched(many.size(), -7.f);
  for (ds::LinearJob& j : jobs) j.y = static_cast<float*>(j.y) - many.data() + untouched.data();
  be.linear_many(x.data(), ldx, 0, jobs);
  be.linear_many(x.data(), ldx, M, {});
  for (float v : untouched) ASSERT_EQ(v, -7.f);
}

TEST(DeepseekV4Forward, BadBatchesAreTypedErrors) {
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  auto model = DeepseekV4Model::load(dir);
  ForwardBatch b;
  b.token_ids = {5, 6};
  b.seqs = {SeqInBatch{.cache_slot = 0, .block_table = {0}, .num_computed_tokens = 0, .num_new_tokens = 2}};
  EXPECT_THROW(model->forward(b), InvalidArgument);  // no cache yet
  model->allocate_cache_for(2, 300);
  auto expect_msg = [&](const ForwardBatch& bb, const std::string& needle) {
    try {
      model->forward(bb);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ForwardBatch bad = b;
  bad.token_ids[1] = 100000;
  expect_msg(bad, "token_ids[1]");
  bad = b;
  bad.seqs[0].cache_slot = 7;
  expect_msg(bad, "cache_slot 7");
  bad = b;
  bad.seqs[0].block_table.clear();
  expect_msg(bad, "block_table");
  bad = b;
  bad.seqs[0].num_new_tokens = 3;
  expect_msg(bad, "token_ids has 2");
  bad = b;
  bad.logits_indices = {2};
  expect_msg(bad, "logits_indices[0]");
  EXPECT_THROW(model->forward_mtp(b, Tensor::zeros({2, 4, 128}, DType::kF32)), InvalidArgument);  // no MTP block
}

}  // namespace
}  // namespace deepinfer::model::v4
