// Context-parallel chunking and its work model; see cp_plan.h.
#include "parallel/cp_plan.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace deepinfer::parallel {
namespace {

using i128 = __int128;

void check_args(int64_t cached, int64_t new_tokens, int32_t cp, int64_t align) {
  if (cached < 0) DI_THROW(InvalidArgument, "cp_plan: cached must be >= 0, got ", cached);
  if (new_tokens < 0) DI_THROW(InvalidArgument, "cp_plan: new_tokens must be >= 0, got ", new_tokens);
  if (cp < 1) DI_THROW(InvalidArgument, "cp_plan: cp must be >= 1, got ", cp);
  if (align < 1) DI_THROW(InvalidArgument, "cp_plan: align must be >= 1, got ", align);
  if (cached > std::numeric_limits<int64_t>::max() - new_tokens)
    DI_THROW(InvalidArgument, "cp_plan: cached + new_tokens overflows (", cached, " + ", new_tokens, ")");
}

// [chunks + 1] boundaries of `chunks` near-equal chunks of [cached, cached + n): the inner ones
// rounded to the nearest multiple of `align` and kept within the range and non-decreasing.
std::vector<int64_t> boundaries(int64_t cached, int64_t n, int64_t chunks, int64_t align) {
  const int64_t end = cached + n;
  std::vector<int64_t> b(size_t(chunks) + 1);
  b[0] = cached;
  for (int64_t j = 1; j < chunks; ++j) {
    const i128 ideal = i128(cached) + i128(n) * j / chunks;  // 128-bit: n * j may overflow int64
    const i128 rounded = (ideal + align / 2) / align * align;
    b[size_t(j)] = int64_t(std::clamp<i128>(rounded, b[size_t(j) - 1], end));
  }
  b[size_t(chunks)] = end;
  return b;
}

// Appends [begin, end) to a rank's spans: skipped when empty, merged when it touches the last one.
void append_span(std::vector<CpSpan>& spans, int64_t begin, int64_t end) {
  if (begin >= end) return;
  if (!spans.empty() && spans.back().end == begin) {
    spans.back().end = end;
    return;
  }
  spans.push_back({begin, end});
}

// Sum over q = 1..n of min(q, window): the window keys of the queries at positions 0..n-1.
i128 window_prefix(i128 n, i128 window) {
  if (n <= window) return n * (n + 1) / 2;
  return window * (window + 1) / 2 + (n - window) * window;
}

// Sum over q = 1..n of floor(q / ratio): floor(q/m) = j for q in [j*m, j*m + m - 1], so with
// n = t*m + r the levels 1..t-1 each count m times and level t counts r + 1 times.
i128 blocks_prefix(i128 n, i128 ratio) {
  const i128 t = n / ratio, r = n % ratio;
  return ratio * t * (t - 1) / 2 + t * (r + 1);
}

// Sum over q = 1..n of min(floor(q / ratio), topk) (topk 0: uncapped).
i128 compressed_prefix(i128 n, i128 ratio, i128 topk) {
  if (topk == 0 || n < topk * ratio) return blocks_prefix(n, ratio);
  // From q = topk * ratio on every query reads exactly topk entries.
  return blocks_prefix(topk * ratio - 1, ratio) + topk * (n - topk * ratio + 1);
}

i128 work_prefix(int64_t n, int64_t window, int64_t ratio, int64_t topk) {
  i128 w = window > 0 ? window_prefix(n, window) : 0;
  if (ratio > 0) w += compressed_prefix(n, ratio, topk);
  return w;
}

}  // namespace

int64_t CpPlan::tokens_of(int32_t rank) const {
  if (rank < 0 || rank >= int32_t(spans.size()))
    DI_THROW(InvalidArgument, "cp_plan: rank ", rank, " out of range [0, ", spans.size(), ")");
  int64_t n = 0;
  for (const CpSpan& s : spans[size_t(rank)]) n += s.size();
  return n;
}

CpPlan balanced_cp_plan(int64_t cached, int64_t new_tokens, int32_t cp, int64_t align) {
  check_args(cached, new_tokens, cp, align);
  const std::vector<int64_t> b = boundaries(cached, new_tokens, 2 * int64_t(cp), align);
  CpPlan plan;
  plan.cp = cp;
  plan.spans.resize(size_t(cp));
  for (size_t i = 0; i < size_t(cp); ++i) {
    const size_t mirror = 2 * size_t(cp) - 1 - i;
    append_span(plan.spans[i], b[i], b[i + 1]);
    append_span(plan.spans[i], b[mirror], b[mirror + 1]);
  }
  return plan;
}

CpPlan contiguous_cp_plan(int64_t cached, int64_t new_tokens, int32_t cp, int64_t align) {
  check_args(cached, new_tokens, cp, align);
  const std::vector<int64_t> b = boundaries(cached, new_tokens, cp, align);
  CpPlan plan;
  plan.cp = cp;
  plan.spans.resize(size_t(cp));
  for (size_t i = 0; i < size_t(cp); ++i) append_span(plan.spans[i], b[i], b[i + 1]);
  return plan;
}

double cp_work(const CpSpan& span, int64_t window, int64_t ratio, int64_t topk) {
  if (span.begin < 0 || span.end < span.begin)
    DI_THROW(InvalidArgument, "cp_work: bad span [", span.begin, ", ", span.end, ")");
  if (window < 0) DI_THROW(InvalidArgument, "cp_work: window must be >= 0, got ", window);
  if (ratio < 0) DI_THROW(InvalidArgument, "cp_work: ratio must be >= 0, got ", ratio);
  if (topk < 0) DI_THROW(InvalidArgument, "cp_work: topk must be >= 0, got ", topk);
  // A query at position p is q = p + 1 keys deep, so [begin, end) covers q in (begin, end].
  return double(work_prefix(span.end, window, ratio, topk) - work_prefix(span.begin, window, ratio, topk));
}

double cp_imbalance(const CpPlan& plan, int64_t window, int64_t ratio, int64_t topk) {
  if (plan.spans.empty() || int64_t(plan.spans.size()) != plan.cp)
    DI_THROW(InvalidArgument, "cp_imbalance: plan has ", plan.spans.size(), " ranks' spans for cp = ", plan.cp);
  double total = 0, most = 0;
  for (const auto& rank_spans : plan.spans) {
    double w = 0;
    for (const CpSpan& s : rank_spans) w += cp_work(s, window, ratio, topk);
    total += w;
    most = std::max(most, w);
  }
  if (total <= 0) return 1.0;
  return most / (total / double(plan.spans.size()));
}

}  // namespace deepinfer::parallel
