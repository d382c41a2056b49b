#include "ops/cpu/compressor.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

void compressor_pool(const CompressorPoolArgs& p) {
  const int64_t m = p.ratio, c = p.width, ld = p.row_stride ? p.row_stride : p.width;
  const int64_t d = p.overlap ? c / 2 : c;
  DI_CHECK(m > 0 && (!p.overlap || c % 2 == 0), "compressor_pool: ratio=", m, " width=", c);
  for (int64_t b = p.first_block; b < p.first_block + p.n_blocks; ++b) {  // validate before threads
    const int64_t lo = std::max<int64_t>(p.overlap ? m * (b - 1) : m * b, 0), hi = m * b + m;
    DI_CHECK(lo >= p.row0 && hi <= p.row0 + p.n_rows, "compressor_pool: block ", b, " needs tokens [", lo, ",", hi,
             ") but rows cover [", p.row0, ",", p.row0 + p.n_rows, ")");
  }
  parallel_for(0, p.n_blocks, [&](int64_t bi) {
    const int64_t b = p.first_block + bi;
    float* out = p.out + bi * d;
    // Slots: (token, column offset). Overlapping: m A-slots (prev block, offset 0) then m B-slots
    // (this block, offset d); absent tokens (< 0) are skipped, i.e. weight 0.
    for (int64_t e = 0; e < d; ++e) {
      float mx = -INFINITY;
      auto visit = [&](auto&& fn) {
        if (p.overlap) {
          for (int64_t s = 0; s < m; ++s) {
            const int64_t tok = m * (b - 1) + s;
            if (tok >= 0) fn(tok - p.row0, e);
          }
          for (int64_t s = 0; s < m; ++s) fn(m * b + s - p.row0, d + e);
        } else {
          for (int64_t s = 0; s < m; ++s) fn(m * b + s - p.row0, e);
        }
      };
      visit([&](int64_t r, int64_t col) { mx = std::max(mx, p.z[r * ld + col]); });
      float sum = 0.f, acc = 0.f;
      visit([&](int64_t r, int64_t col) {
        const float w = std::exp(p.z[r * ld + col] - mx);
        sum += w;
        acc += w * p.a[r * ld + col];
      });
      out[e] = acc / sum;
    }
  }, grain_for(8 * 2 * m * d));
}

}  // namespace deepinfer::ops::cpu
