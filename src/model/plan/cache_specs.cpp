#include "model/plan/cache_specs.h"

#include "core/check.h"

namespace deepinfer::model {
namespace {
kv::LayerCacheSpec spec_of(const LayerPlan& p, const CacheDims& d, int64_t rollback) {
  kv::LayerCacheSpec s;
  s.window = p.window;
  s.ring_rows = p.window + rollback;
  s.head_dim = d.head_dim;
  if (p.owns_entries()) {
    const int64_t m = p.ratio;
    s.ratio = m;
    s.overlap = p.compressor == CompressorKind::kOverlap;
    s.comp_width = s.overlap ? 2 * d.head_dim : d.head_dim;
    // Pending rows a chunk may need: a CSA block reaches one block back (2m rows), a disjoint block
    // its own m rows; ratio-1 projection keeps none. Plus the rollback slack.
    const int64_t need = p.compressor == CompressorKind::kOverlap ? 2 * m
                         : p.compressor == CompressorKind::kPool  ? m
                                                                  : 0;
    s.state_rows = need > 0 ? need + rollback : 0;
    if (p.compressor == CompressorKind::kProject) s.comp_width = d.head_dim;
    if (p.owns_keys()) {
      s.index_dim = d.index_head_dim;
      if (p.index_keys == IndexKeyKind::kOwnCompressor) {
        s.index_width = 2 * d.index_head_dim;  // overlapping key compressor
        s.index_state_rows = 2 * m + rollback;
      }
    }
  }
  return s;
}
}  // namespace

std::vector<kv::LayerCacheSpec> cache_specs(const ModelPlan& plan, const CacheDims& dims) {
  DI_CHECK(plan.max_rollback >= 0, "negative rollback ", plan.max_rollback);
  std::vector<kv::LayerCacheSpec> specs;
  for (const LayerPlan& p : plan.layers) specs.push_back(spec_of(p, dims, plan.max_rollback));
  for (const LayerPlan& p : plan.drafter) specs.push_back(spec_of(p, dims, plan.max_rollback));
  return specs;
}

}  // namespace deepinfer::model
