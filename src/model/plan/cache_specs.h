// Cache specs from layer plans: what each layer of a model keeps per slot and per paged block
// (kv/kv_cache.h), for every backend. The ring sizes include the plan's rollback slack.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/plan/layer_plan.h"

namespace deepinfer::model {

struct CacheDims {
  int64_t head_dim = 0;        // d: kv rows and compressed entries
  int64_t index_head_dim = 0;  // index keys
};

// One spec per main layer, then one per drafter block, in plan order.
std::vector<kv::LayerCacheSpec> cache_specs(const ModelPlan& plan, const CacheDims& dims);

}  // namespace deepinfer::model
