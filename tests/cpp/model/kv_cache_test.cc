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
