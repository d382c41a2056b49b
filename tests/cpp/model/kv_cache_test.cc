#include <gtest/gtest.h>

#include "deepinfer/error.h"
#include "kv/kv_cache.h"

namespace deepinfer::kv {
namespace {

std::vector<LayerCacheSpec> specs() {
  return {{.window = 16, .ring_rows = 16, .head_dim = 8},
          {.window = 16, .ring_rows = 16, .head_dim = 8, .ratio = 4, .overlap = true, .comp_width = 16, .state_rows = 8,
           .index_dim = 4, .index_width = 8, .index_state_rows = 8},
          {.window = 16, .ring_rows = 16, .head_dim = 8, .ratio = 24, .comp_width = 8, .state_rows = 24}};
}

// A layer without a window or without compressor partial rows has zero-row per-slot tensors with
// no storage: reset, save, restore and the block copies skip them (they used to pass their null
// pointer to memset / memcpy: undefined behaviour that UBSan stopped engine_test on).
TEST(KvCache, EmptyPerSlotTensorsAreSkipped) {
  const std::vector<LayerCacheSpec> s = {{.window = 0, .ring_rows = 0, .head_dim = 8, .ratio = 4, .comp_width = 8},
                                         {.window = 4, .ring_rows = 4, .head_dim = 8}};
  CacheGeometry g{.block_tokens = 8, .num_blocks = 2, .num_slots = 2};
  KvCache c(s, g);
  EXPECT_EQ(c.layer(0).window.numel(), 0);
  EXPECT_EQ(c.layer(0).comp_state.numel(), 0);
  c.layer(1).window.data<float>()[4 * 8] = 5.f;  // slot 1
  const std::vector<uint8_t> saved = c.save_slot(1);
  EXPECT_EQ(saved.size(), size_t(4 * 8 * 4));
  c.reset_slot(1);
  EXPECT_EQ(c.layer(1).window.data<float>()[4 * 8], 0.f);
  c.restore_slot(1, saved);
  EXPECT_EQ(c.layer(1).window.data<float>()[4 * 8], 5.f);
  std::vector<uint8_t> block(c.geometry().bytes_per_block, 0);
  c.layer(0).comp.data<float>()[0] = 7.f;
  c.copy_block_out(0, block.data());
  c.copy_block_in(1, block.data());
  EXPECT_EQ(c.layer(0).comp.data<float>()[2 * 8], 7.f);  // block 1 starts after 8 / 4 = 2 entries of 8
}

TEST(KvCache, GeometryAndSizes) {
  auto s = specs();
  EXPECT_EQ(KvCache::default_block_tokens(s), 264);  // lcm(4, 24) = 24 -> first multiple >= 256
  const int64_t bt = 264;
  const size_t per_block = 4 * ((bt / 4) * (8 + 4) + (bt / 24) * 8);
  EXPECT_EQ(KvCache::block_bytes(s, bt), per_block);
  const size_t per_slot = 4 * (3 * 16 * 8 + 8 * 32 + 8 * 2 * 8 + 24 * 16);
  EXPECT_EQ(KvCache::slot_bytes(s), per_slot);
  CacheGeometry g = KvCache::plan(s, per_slot * 3 + per_block * 5 + 7, 3);
  EXPECT_EQ(g.num_slots, 3);
  EXPECT_EQ(g.num_blocks, 5);
  EXPECT_THROW(KvCache::plan(s, per_slot, 2), OutOfMemory);

  KvCache c(s, g);
  EXPECT_EQ(c.layer(1).entries_per_block, 66);
  EXPECT_EQ(c.layer(1).index_keys.shape(), (Shape{5, 66, 4}));
  EXPECT_EQ(c.layer(2).comp_state.shape(), (Shape{3, 24, 16}));
  EXPECT_FALSE(c.layer(0).comp.defined());
  c.layer(1).window.data<float>()[16 * 8] = 3.f;  // slot 1
  c.layer(1).window.data<float>()[0] = 2.f;       // slot 0
  c.reset_slot(1);
  EXPECT_EQ(c.layer(1).window.data<float>()[16 * 8], 0.f);
  EXPECT_EQ(c.layer(1).window.data<float>()[0], 2.f);
  g.block_tokens = 100;
  EXPECT_THROW(KvCache(s, g), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::kv
