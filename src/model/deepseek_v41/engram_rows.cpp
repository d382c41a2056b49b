#include "model/deepseek_v41/engram_rows.h"

#include <cstring>

#include "core/check.h"
#include "core/parallel.h"
#include "deepinfer/error.h"
#include "ops/cpu/engram.h"

namespace deepinfer::model::v41 {
namespace {
void check_dtype(const ds::EngramRef& g) {
  if (g.table_dtype != DType::kF8E4M3 && g.table_dtype != DType::kBF16 && g.table_dtype != DType::kF32)
    DI_THROW(InternalError, "engram: table dtype ", dtype_name(g.table_dtype));
  if (g.table_dtype == DType::kF8E4M3 && (g.dim % 32 != 0 || !g.table_scale))
    DI_THROW(InternalError, "engram: FP8 table of width ", g.dim, " without an E8M0 scale per 32");
}
}  // namespace

std::vector<std::vector<int64_t>> engram_step_ids(const EngramHasher& hasher, const std::vector<const ds::EngramRef*>& tables,
                                                  const std::vector<EngramStepSeq>& seqs) {
  const int64_t L = hasher.num_layers(), C = hasher.num_columns();
  DI_CHECK(int64_t(tables.size()) == L, "engram: ", tables.size(), " tables for ", L, " Engram layers");
  int64_t T = 0;
  for (const EngramStepSeq& s : seqs) T += s.n;
  std::vector<int64_t> ids(size_t(T * L * C));  // [T, L, C] as the hasher writes them
  int64_t t0 = 0;
  for (const EngramStepSeq& s : seqs) {
    DI_CHECK(s.history && (s.n == 0 || s.tokens), "engram: sequence without history or tokens");
    hasher.row_ids(*s.history, s.tokens, s.n, s.dead, ids.data() + t0 * L * C);
    t0 += s.n;
  }
  std::vector<std::vector<int64_t>> by_layer(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const ds::EngramRef& g = *tables[size_t(l)];
    DI_CHECK(g.defined(), "engram: layer ", hasher.layer_id(l), " has no table");
    check_dtype(g);
    std::vector<int64_t>& out = by_layer[size_t(l)];
    out.resize(size_t(T * C));
    for (int64_t i = 0; i < T * C; ++i) {  // checked here: nothing may throw inside the parallel loops
      const int64_t id = ids[size_t(((i / C) * L + l) * C + i % C)];
      if (id < 0 || id >= g.rows)
        DI_THROW(InternalError, "engram: row id ", id, " outside the table's ", g.rows, " rows");
      out[size_t(i)] = id;
    }
  }
  return by_layer;
}

std::vector<float> engram_widen_rows(const ds::EngramRef& g, const std::vector<int64_t>& ids) {
  check_dtype(g);
  const int64_t n = int64_t(ids.size()), d = g.dim, sd = g.table_dtype == DType::kF8E4M3 ? d / 32 : 0;
  const size_t row_bytes = dtype_nbytes(g.table_dtype, d);
  std::vector<float> rows(size_t(n * d));
  // A prefill widens T x C rows (4,096 tokens x 24 columns x 256 = 25M values per layer): over the
  // host's threads; each row's values are the same whoever writes them.
  const auto* tab = static_cast<const uint8_t*>(g.table);
  const auto* sc = static_cast<const uint8_t*>(g.table_scale);
  parallel_for(0, n, [&](int64_t i) {
    const int64_t id = ids[size_t(i)];
    ops::cpu::engram_widen_row(g.table_dtype, tab + size_t(id) * row_bytes, sc ? sc + id * sd : nullptr, d,
                               rows.data() + i * d);
  }, 256);
  return rows;
}

size_t engram_stored_values_bytes(const ds::EngramRef& g, int64_t n) { return dtype_nbytes(g.table_dtype, n * g.dim); }
size_t engram_stored_scales_bytes(const ds::EngramRef& g, int64_t n) {
  return g.table_dtype == DType::kF8E4M3 ? size_t(n * (g.dim / 32)) : 0;
}

void engram_gather_stored(const ds::EngramRef& g, const int64_t* ids, int64_t n, void* values, uint8_t* scales) {
  check_dtype(g);
  const size_t row_bytes = dtype_nbytes(g.table_dtype, g.dim);
  const size_t srow = g.table_dtype == DType::kF8E4M3 ? size_t(g.dim / 32) : 0;
  DI_CHECK(n == 0 || (values && (srow == 0 || scales)), "engram: gather without a destination");
  const auto* tab = static_cast<const uint8_t*>(g.table);
  const auto* sc = static_cast<const uint8_t*>(g.table_scale);
  auto* out = static_cast<uint8_t*>(values);
  // Random rows of a host table (a prefill: ~98K rows of 256 B per layer), memory-latency bound:
  // over the host's threads.
  parallel_for(0, n, [&](int64_t i) {
    const int64_t id = ids[i];
    std::memcpy(out + size_t(i) * row_bytes, tab + size_t(id) * row_bytes, row_bytes);
    if (srow) std::memcpy(scales + size_t(i) * srow, sc + size_t(id) * srow, srow);
  }, 1024);
}

std::vector<std::vector<float>> engram_step_rows(const EngramHasher& hasher, const std::vector<const ds::EngramRef*>& tables,
                                                 const std::vector<EngramStepSeq>& seqs) {
  std::vector<std::vector<int64_t>> ids = engram_step_ids(hasher, tables, seqs);
  std::vector<std::vector<float>> rows(ids.size());
  for (size_t l = 0; l < ids.size(); ++l) rows[l] = engram_widen_rows(*tables[l], ids[l]);
  return rows;
}

}  // namespace deepinfer::model::v41
