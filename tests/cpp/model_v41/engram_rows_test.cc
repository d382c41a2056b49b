// engram_step_rows: a step's Engram rows from the sequences' histories, equal to the hashed ids'
// rows read from the weights (whole sequence, in chunks across steps, two sequences in one step),
// and equal between the release (FP8 rows) and transformers (float rows) layouts; the stored-form
// gather (the CUDA backend's upload) widens to the same rows.
#include "model/deepseek_v41/engram_rows.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ops/cpu/engram.h"

#include "model/deepseek_v41/plan.h"
#include "model/deepseek_v41/prepare.h"
#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using v41_test::golden;

struct Model {
  DeepseekV41Config cfg;
  V41Weights w;
  std::unique_ptr<ds::CpuWeightStore> store;
  std::vector<const ds::EngramRef*> tables;
};

Model load(const std::string& dir) {
  Model m;
  m.cfg = DeepseekV41Config::from_file((golden(dir) / "config.json").string());
  m.w = V41Weights::load(golden(dir).string(), m.cfg);
  m.store = v41_prepare_cpu(m.cfg, v41_plan(m.cfg, {}), m.w);
  for (int64_t l : m.cfg.engram.layer_ids) m.tables.push_back(&m.store->refs.layers[size_t(l)].engram);
  return m;
}

TEST(V41EngramRows, StepRowsEqualTheHashedRowsInEveryLayout) {
  const Model rel = load("v41_a_release"), hf = load("v41_a");
  const EngramHasher h = EngramHasher::load(rel.cfg, golden("v41_a_release").string());
  std::vector<int32_t> toks(23), other = {5, 9, 2, 300, 17};
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 37 + 11) % 320);
  const int64_t L = h.num_layers(), C = h.num_columns(), d = rel.cfg.engram.head_dim;
  // Direct: ids of the whole sequence, rows read through the weights.
  EngramHistory h0 = h.start();
  std::vector<int64_t> ids(toks.size() * size_t(L * C));
  h.row_ids(h0, toks.data(), int64_t(toks.size()), nullptr, ids.data());
  std::vector<std::vector<float>> want(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const std::string n = "layers." + std::to_string(h.layer_id(l)) + ".engram.embed.weight";
    const v4::Linear& table = rel.w.parts[size_t(rel.w.find(n))][0];
    want[size_t(l)].resize(toks.size() * size_t(C * d));
    for (size_t t = 0; t < toks.size(); ++t)
      for (int64_t c = 0; c < C; ++c)
        engram_rows_f32(table, &ids[(t * size_t(L) + size_t(l)) * size_t(C) + size_t(c)], 1,
                        want[size_t(l)].data() + (int64_t(t) * C + c) * d);
  }
  for (const Model* m : {&rel, &hf}) {
    EngramHistory whole = h.start();
    EXPECT_EQ(engram_step_rows(h, m->tables, {{&whole, toks.data(), nullptr, int64_t(toks.size())}}), want);
    // Two steps (7 then 16 tokens), with a second sequence in the first step.
    EngramHistory a = h.start(), b = h.start();
    const auto s1 = engram_step_rows(h, m->tables, {{&a, toks.data(), nullptr, 7}, {&b, other.data(), nullptr, 5}});
    const auto s2 = engram_step_rows(h, m->tables, {{&a, toks.data() + 7, nullptr, 16}});
    for (int64_t l = 0; l < L; ++l) {
      std::vector<float> joined(s1[size_t(l)].begin(), s1[size_t(l)].begin() + 7 * C * d);
      joined.insert(joined.end(), s2[size_t(l)].begin(), s2[size_t(l)].end());
      EXPECT_EQ(joined, want[size_t(l)]) << "layer " << l;
    }
    EXPECT_EQ(a.recent, whole.recent);
    EXPECT_EQ(h.history_after(toks.data() + 21, 2, nullptr).recent, whole.recent);  // rollback rebuild
  }
}

// engram_gather_stored copies exactly the table's stored bytes of each id (codes, and scales for
// FP8); widened per row they are engram_widen_rows' values. Ids repeat and come in any order.
TEST(V41EngramRows, StoredGatherWidensToTheHostRows) {
  for (const char* dir : {"v41_a_release", "v41_a"}) {
    const Model m = load(dir);
    const EngramHasher h = EngramHasher::load(m.cfg, golden(dir).string());
    std::vector<int32_t> toks(29);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 53 + 7) % 320);
    EngramHistory hist = h.start();
    const auto ids = engram_step_ids(h, m.tables, {{&hist, toks.data(), nullptr, int64_t(toks.size())}});
    ASSERT_EQ(ids.size(), m.tables.size());
    for (size_t l = 0; l < ids.size(); ++l) {
      const ds::EngramRef& g = *m.tables[l];
      std::vector<int64_t> id = ids[l];
      id.push_back(id.front());  // a repeat, out of order
      id.push_back(g.rows - 1);  // the last row
      const int64_t n = int64_t(id.size());
      std::vector<uint8_t> values(engram_stored_values_bytes(g, n)), scales(engram_stored_scales_bytes(g, n));
      EXPECT_EQ(scales.empty(), g.table_dtype != DType::kF8E4M3) << dir;
      engram_gather_stored(g, id.data(), n, values.data(), scales.data());
      const size_t rb = dtype_nbytes(g.table_dtype, g.dim), sb = g.table_dtype == DType::kF8E4M3 ? size_t(g.dim / 32) : 0;
      std::vector<float> widened(size_t(n * g.dim));
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(0, std::memcmp(values.data() + i * rb, static_cast<const uint8_t*>(g.table) + id[size_t(i)] * rb, rb));
        if (sb)
          EXPECT_EQ(0, std::memcmp(scales.data() + i * sb, static_cast<const uint8_t*>(g.table_scale) + id[size_t(i)] * sb, sb));
        ops::cpu::engram_widen_row(g.table_dtype, values.data() + i * rb, sb ? scales.data() + i * sb : nullptr, g.dim,
                                   widened.data() + i * g.dim);
      }
      EXPECT_EQ(widened, engram_widen_rows(g, id)) << dir << " layer " << l;
      EXPECT_EQ(std::vector<float>(widened.begin(), widened.end() - 2 * g.dim),
                engram_step_rows(h, m.tables, {{&(hist = h.start()), toks.data(), nullptr, int64_t(toks.size())}})[l]);
    }
  }
}

}  // namespace
}  // namespace deepinfer::model::v41
