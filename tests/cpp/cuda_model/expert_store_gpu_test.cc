// The CUDA backend as an expert store (cuda_expert_store.cpp; EPLB on a sharded GPU model moves
// routed experts between ranks through it). On the tiny fixtures (bf16 experts, and FP4 + e8m0
// experts in tiny_official): two experts of a layer are packed, released (the layer's device
// pointer tables then hold null for them) and adopted back from their packed bytes into each
// other's freed regions; the prefill and graph-decode logits afterwards equal the ones before bit
// for bit. Wrong sizes, adopting a held expert and releasing one not held are typed errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "deepinfer/error.h"
#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4 {
namespace {
using gpu::Numerics;

// A prompt prefilled into `slot`, then 3 decode steps: every step's logits.
std::vector<float> run_prompt(DeepseekV4CudaModel& m, int32_t slot, uint32_t seed) {
  const int64_t V = m.vocab_size();
  const kv::CacheGeometry& g = m.cache_geometry();
  const int64_t per_slot = g.num_blocks / g.num_slots;
  std::mt19937 gen(seed);
  m.reset_slot(slot);
  SeqInBatch s;
  s.cache_slot = slot;
  for (int64_t b = 0; b < per_slot; ++b) s.block_table.push_back(int32_t(slot * per_slot + b));
  s.num_new_tokens = 37;
  ForwardBatch pre;
  for (int i = 0; i < s.num_new_tokens; ++i) pre.token_ids.push_back(int32_t(gen() % V));
  pre.seqs.push_back(s);
  pre.logits_indices.push_back(s.num_new_tokens - 1);
  Tensor l = m.forward(pre);
  std::vector<float> out(l.data<float>(), l.data<float>() + V);
  s.num_computed_tokens = s.num_new_tokens;
  for (int step = 0; step < 3; ++step) {
    ForwardBatch b;
    s.num_new_tokens = 1;
    b.seqs.push_back(s);
    b.token_ids.push_back(int32_t(gen() % V));
    b.logits_indices.push_back(0);
    Tensor d = m.forward(b);
    out.insert(out.end(), d.data<float>(), d.data<float>() + V);
    s.num_computed_tokens += 1;
  }
  return out;
}

class GpuExpertStore : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuExpertStore, ReleaseAndAdoptKeepLogitsBitForBit) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = deepinfer::testing::golden_dir(GetParam());
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  CudaModelOptions o;
  o.numerics = Numerics::kBf16;
  o.progress = false;
  o.max_batch_tokens = 512;
  o.max_seqs = 4;
  o.max_context = 256;
  o.decode = DecodePath::kGraph;
  auto m = DeepseekV4CudaModel::load(dir, o);
  m->allocate_cache_for(4, 128);
  const std::vector<float> before = run_prompt(*m, 0, 5);

  ds::ExpertWeightStore* store = m->backend().expert_weight_store();
  ASSERT_NE(store, nullptr);
  const int64_t layers = int64_t(m->backend().weights().layers.size());
  const int64_t E = int64_t(m->backend().weights().layers[0].ffn.experts.size());
  ASSERT_GE(E, 3);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const int64_t B = store->expert_bytes(layer);
    ASSERT_GT(B, 0);
    std::vector<std::byte> a(static_cast<size_t>(B)), b(static_cast<size_t>(B));
    store->pack_expert(layer, 1, a);
    store->pack_expert(layer, 2, b);
    EXPECT_NE(std::memcmp(a.data(), b.data(), a.size()), 0) << "experts 1 and 2 of layer " << layer << " are equal";
    EXPECT_THROW(store->adopt_expert(layer, 1, a), InvalidArgument);  // held already
    store->release_expert(layer, 1);
    store->release_expert(layer, 2);
    EXPECT_FALSE(store->holds_expert(layer, 1));
    EXPECT_FALSE(store->holds_expert(layer, 2));
    EXPECT_TRUE(store->holds_expert(layer, 0));
    EXPECT_THROW(store->release_expert(layer, 1), InternalError);
    EXPECT_THROW(store->pack_expert(layer, 2, b), InternalError);
    std::vector<std::byte> short_bytes(static_cast<size_t>(B - 1));
    EXPECT_THROW(store->adopt_expert(layer, 1, short_bytes), InvalidArgument);
    store->adopt_expert(layer, 1, a);  // into expert 2's freed regions (the layer's last freed)
    store->adopt_expert(layer, 2, b);
    std::vector<std::byte> back(static_cast<size_t>(B));
    store->pack_expert(layer, 1, back);
    EXPECT_EQ(std::memcmp(back.data(), a.data(), a.size()), 0) << "layer " << layer;
  }
  EXPECT_THROW(store->expert_bytes(layers), InvalidArgument);
  EXPECT_THROW(store->holds_expert(0, int32_t(E)), InvalidArgument);
  const std::vector<float> after = run_prompt(*m, 1, 5);
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(std::memcmp(after.data(), before.data(), before.size() * sizeof(float)), 0)
      << GetParam() << ": logits changed after the experts moved";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuExpertStore, ::testing::Values("tiny", "tiny_official"));

}  // namespace
}  // namespace deepinfer::model::v4
