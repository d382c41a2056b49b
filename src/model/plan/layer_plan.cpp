#include "model/plan/layer_plan.h"

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::model {

const char* row_format_name(RowFormat f) {
  switch (f) {
    case RowFormat::kPlain: return "plain";
    case RowFormat::kFp8Nope64: return "fp8-e4m3/64 (non-rope dims)";
    case RowFormat::kFp4Hadamard32: return "hadamard+fp4-e2m1/32";
    case RowFormat::kFp8Block32: return "fp8-e4m3/32 ue8m0";
    case RowFormat::kFp4E4m3Block16: return "fp4-e2m1/16 e4m3";
    case RowFormat::kFp4Ue8m0Block32: return "fp4-e2m1/32 ue8m0";
  }
  return "?";
}

const LayerPlan& ModelPlan::layer(int32_t i) const {
  DI_CHECK(i >= 0 && i < int32_t(layers.size()), "layer ", i, " of ", layers.size());
  return layers[size_t(i)];
}

void ModelPlan::validate(const std::string& origin) const {
  int32_t candidate = -1;
  for (const LayerPlan& p : layers)
    if (p.candidate_source) {
      if (candidate >= 0)
        DI_THROW(ConfigError, origin, ": layers ", candidate, " and ", p.index, " are both candidate sources");
      candidate = p.index;
    }
  auto source = [&](const LayerPlan& p, int32_t src, const char* what) -> const LayerPlan& {
    if (src < 0 || src > p.index || src >= int32_t(layers.size()))
      DI_THROW(ConfigError, origin, ": layer ", p.index, " reads the ", what, " of layer ", src,
               ", which is not a main layer at or below it");
    return layers[size_t(src)];
  };
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerPlan& p = layers[i];
    if (p.index != int32_t(i)) DI_THROW(InternalError, origin, ": layer plan ", i, " has index ", p.index);
    if (p.window <= 0) DI_THROW(ConfigError, origin, ": layer ", i, " has sliding window ", p.window);
    if (!p.attends_compressed()) {
      if (p.owns_entries() || p.owns_keys())
        DI_THROW(ConfigError, origin, ": layer ", i, " compresses but attends no compressed entries");
      continue;
    }
    if (p.ratio <= 0) DI_THROW(ConfigError, origin, ": layer ", i, " attends compressed entries with ratio ", p.ratio);
    const LayerPlan& kv = source(p, p.kv_source, "compressed entries");
    if (!kv.owns_entries())
      DI_THROW(ConfigError, origin, ": layer ", i, " reads the entries of layer ", kv.index, ", which has no compressor");
    if (kv.ratio != p.ratio)
      DI_THROW(ConfigError, origin, ": layer ", i, " has compress ratio ", p.ratio, " but its KV source (layer ",
               kv.index, ") compresses at ratio ", kv.ratio, "; entry visibility uses the consumer's ratio");
    if (candidate >= 0 && p.owns_entries() && p.index > candidate)
      DI_THROW(ConfigError, origin, ": layer ", i, " is a KV source after the candidate source (layer ", candidate,
               "); the candidate mask covers one source's entries");
    if (p.select == SelectKind::kScore) {
      const LayerPlan& ks = source(p, p.key_source, "index keys");
      if (!ks.owns_keys())
        DI_THROW(ConfigError, origin, ": layer ", i, " scores the keys of layer ", ks.index, ", which owns none");
      if (p.topk_source != p.index)
        DI_THROW(InternalError, origin, ": scoring layer ", i, " must publish its own top-k");
      if (p.uses_candidates && candidate < 0)
        DI_THROW(ConfigError, origin, ": layer ", i, " uses candidate blocks but no layer is the candidate source");
    } else if (p.select == SelectKind::kReuse) {
      const LayerPlan& ts = source(p, p.topk_source, "top-k selection");
      if (ts.select != SelectKind::kScore)
        DI_THROW(ConfigError, origin, ": layer ", i, " reuses the top-k of layer ", ts.index, ", which selects none");
      if (ts.kv_source != p.kv_source)
        DI_THROW(ConfigError, origin, ": layer ", i, " reuses the top-k of layer ", ts.index,
                 ", which selects from another KV source's entries");
    }
  }
  // Bounded replay: the tail layers are a suffix and own no paged state (what they would write
  // there is not computed for the positions before a sequence's tail).
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerPlan& p = layers[i];
    if (!p.replay_tail) continue;
    if (i + 1 < layers.size() && !layers[i + 1].replay_tail)
      DI_THROW(ConfigError, origin, ": bounded replay: layer ", i, " runs over the kept tail only but layer ", i + 1,
               " after it over every position");
    if (p.owns_entries() || p.owns_keys())
      DI_THROW(ConfigError, origin, ": bounded replay: layer ", i, " runs over the kept tail only but owns ",
               "compressed entries or index keys, which every later position reads");
  }
  if (replay_keep < 0) DI_THROW(ConfigError, origin, ": bounded replay keep ", replay_keep, " < 0");
  for (const LayerPlan& p : drafter)
    if (p.attends_compressed() || p.owns_entries())
      DI_THROW(ConfigError, origin, ": drafter block ", p.index, " with compressed attention is not supported");
}

std::string ModelPlan::schedule_str() const {
  std::string s;
  for (const LayerPlan& p : layers) {
    if (!s.empty()) s += ' ';
    if (!p.attends_compressed()) s += 'S';
    else if (p.compressor == CompressorKind::kOverlap) s += 'C';
    else if (p.select == SelectKind::kAll) s += 'H';
    else if (p.select == SelectKind::kReuse) s += 'R';
    else if (p.owns_entries()) s += 'F';
    else s += 'X';
  }
  return s;
}

}  // namespace deepinfer::model
