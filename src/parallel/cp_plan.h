// Balanced context parallelism for one long prefill: which positions each CP rank computes.
//
// The `new_tokens` positions after `cached` already-cached ones, [cached, cached + new_tokens),
// are cut into 2*cp chunks of (nearly) equal token counts; rank i takes chunks i and 2*cp-1-i.
// Under causal attention a query's work grows with its position, so an early chunk paired with
// the mirrored late one gives every rank the same work for the linearly growing part (full or
// compressed-dense attention) and the same token count for the constant part (the window, a
// top-k) and for everything per token (MLP, MoE).
//
// Chunk boundaries inside the range are multiples of `align` in absolute position (the largest
// compression ratio, so a compressor block never straddles two ranks); only the range's own ends
// (cached and cached + new_tokens) may be unaligned. Prompts shorter than 2*cp aligned blocks
// leave some chunks, and so some ranks, empty: such a plan is still valid.
//
// Pure functions; bad arguments throw InvalidArgument naming the argument.
#pragma once
#include <cstdint>
#include <vector>

namespace deepinfer::parallel {

struct CpSpan {
  int64_t begin = 0, end = 0;  // positions [begin, end)
  int64_t size() const { return end - begin; }
  bool operator==(const CpSpan&) const = default;
};

struct CpPlan {
  int32_t cp = 1;
  // [cp] each rank's spans: ascending, non-empty, neither overlapping nor touching (a rank's two
  // chunks that meet, as the middle pair does, are one span); a rank with no tokens has none.
  std::vector<std::vector<CpSpan>> spans;
  int64_t tokens_of(int32_t rank) const;  // InvalidArgument for a bad rank
};

// The paired plan described above.
CpPlan balanced_cp_plan(int64_t cached, int64_t new_tokens, int32_t cp, int64_t align);
// The naive baseline (extension of the brief, for comparisons): cp contiguous chunks, rank i the
// i-th, boundaries aligned the same way.
CpPlan contiguous_cp_plan(int64_t cached, int64_t new_tokens, int32_t cp, int64_t align);

// Attention work of the queries in `span` (a query at position p sees keys 0..p), in key reads:
//   sum over p of  min(p + 1, window)                      the sliding window (window 0: none)
//                + min(floor((p + 1) / ratio), topk)       compressed entries (ratio 0: none;
//                                                          topk 0: all of them, dense)
// A model's layers differ (window-only, CSA top-k, HCA dense), so a caller sums the estimates of
// its layer kinds. Exact integer arithmetic in closed form, returned as double.
double cp_work(const CpSpan& span, int64_t window, int64_t ratio, int64_t topk);
// max over ranks of the summed cp_work / its mean (1 when there is no work).
double cp_imbalance(const CpPlan& plan, int64_t window, int64_t ratio, int64_t topk);

}  // namespace deepinfer::parallel
