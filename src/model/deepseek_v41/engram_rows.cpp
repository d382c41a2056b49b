#include "model/deepseek_v41/engram_rows.h"

#include <cstring>

#include "core/check.h"
#include "core/numeric.h"
#include "core/parallel.h"
#include "deepinfer/error.h"

namespace deepinfer::model::v41 {
namespace {
// One stored row -> f32 (FP8 e4m3 codes with an E8M0 scale per 32, or bf16/f32 values).
void widen_row(const ds::EngramRef& g, int64_t id, float* out) {
  if (id < 0 || id >= g.rows)
    DI_THROW(InternalError, "engram: row id ", id, " outside the table's ", g.rows, " rows");
  const int64_t d = g.dim;
  switch (g.table_dtype) {
    case DType::kF8E4M3: {
      const auto* c = static_cast<const uint8_t*>(g.table) + id * d;
      const auto* s = static_cast<const uint8_t*>(g.table_scale) + id * (d / 32);
      for (int64_t j = 0; j < d; ++j) out[j] = fp8e4m3_to_f32(c[j]) * e8m0_to_f32(s[j / 32]);
      return;
    }
    case DType::kBF16: {
      const auto* b = static_cast<const uint16_t*>(g.table) + id * d;
      for (int64_t j = 0; j < d; ++j) out[j] = bf16_to_f32(b[j]);
      return;
    }
    case DType::kF32: std::memcpy(out, static_cast<const float*>(g.table) + id * d, size_t(d) * sizeof(float)); return;
    default: DI_THROW(InternalError, "engram: table dtype ", dtype_name(g.table_dtype));
  }
}
}  // namespace

std::vector<std::vector<float>> engram_step_rows(const EngramHasher& hasher, const std::vector<const ds::EngramRef*>& tables,
                                                 const std::vector<EngramStepSeq>& seqs) {
  const int64_t L = hasher.num_layers(), C = hasher.num_columns();
  DI_CHECK(int64_t(tables.size()) == L, "engram: ", tables.size(), " tables for ", L, " Engram layers");
  int64_t T = 0;
  for (const EngramStepSeq& s : seqs) T += s.n;
  std::vector<int64_t> ids(size_t(T * L * C));
  int64_t t0 = 0;
  for (const EngramStepSeq& s : seqs) {
    DI_CHECK(s.history && (s.n == 0 || s.tokens), "engram: sequence without history or tokens");
    hasher.row_ids(*s.history, s.tokens, s.n, s.dead, ids.data() + t0 * L * C);
    t0 += s.n;
  }
  std::vector<std::vector<float>> rows(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const ds::EngramRef& g = *tables[size_t(l)];
    DI_CHECK(g.defined(), "engram: layer ", hasher.layer_id(l), " has no table");
    if (g.table_dtype != DType::kF8E4M3 && g.table_dtype != DType::kBF16 && g.table_dtype != DType::kF32)
      DI_THROW(InternalError, "engram: table dtype ", dtype_name(g.table_dtype));
    for (int64_t i = 0; i < T * C; ++i) {  // checked here: nothing may throw inside the parallel loop
      const int64_t id = ids[size_t(((i / C) * L + l) * C + i % C)];
      if (id < 0 || id >= g.rows)
        DI_THROW(InternalError, "engram: row id ", id, " outside the table's ", g.rows, " rows");
    }
    rows[size_t(l)].resize(size_t(T * C * g.dim));
    // A prefill widens T x C rows (4,096 tokens x 24 columns x 256 = 25M values per layer): by
    // token over the host's threads; each row's values are the same whoever writes them.
    float* out = rows[size_t(l)].data();
    parallel_for(0, T, [&](int64_t t) {
      for (int64_t c = 0; c < C; ++c) widen_row(g, ids[size_t((t * L + l) * C + c)], out + (t * C + c) * g.dim);
    }, 16);
  }
  return rows;
}

}  // namespace deepinfer::model::v41
