// Layer plans: what each layer of a DeepSeek-family model computes, owns and reads, as data.
// The forward, the cache layout, the step planner and the tensor tables are driven by these
// plans; nothing below a model family's plan builder knows which family or layer schedule it
// runs. DeepSeek-V4's schedule (sliding / CSA / HCA, hash and biased MoE, per-site mHC) is one
// instance (deepseek_v4/plan.cpp); DeepSeek-V4.1's CSA2 roles (Full / Reuse / Reindex at ratios 2
// and 1, a candidate source, single-pass mHC, Engram) are another, with no special cases here.
//
// Vocabulary (MODEL-DEEPSEEK-V4.md §3, MODEL-DEEPSEEK-V41.md §2-§3):
//  - every layer keeps its own sliding window of W kv rows per sequence;
//  - a *KV source* owns a compressor and a paged cache of compressed entries (one per `ratio`
//    source tokens); other layers may attend a source's entries (kv_source != self);
//  - an *index source* scores entries with its own indexer query and selects the top-k; a layer
//    that reuses a selection reads another layer's top-k (topk_source != self); index keys are
//    owned by one layer (key_source) and produced by its own key compressor (V4) or projected
//    from the KV source's latent (V4.1);
//  - a layer with ratio > 0 and no indexer attends every finished entry (V4's HCA).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::model {

// How a layer turns source tokens into compressed entries (only KV sources compress).
enum class CompressorKind : uint8_t {
  kNone,     // no compressor: sliding only, or reads another layer's entries
  kOverlap,  // V4 CSA: two-series pooling over overlapping windows of 2m tokens, width 2d, + ape
  kPool,     // disjoint gated pooling of m tokens, width d (V4 HCA with ape; V4.1 ratio 2 without)
  kProject,  // V4.1 ratio 1: RMSNorm(x Wkv), no gate
};

// How a layer picks the compressed entries it attends.
enum class SelectKind : uint8_t {
  kNone,   // no compressed attention
  kAll,    // every finished entry of its KV source (V4 HCA)
  kScore,  // its own indexer query scores the key source's keys and keeps the top-k
  kReuse,  // the top-k selected by topk_source in this step
};

// Who produces the index keys a scoring layer reads.
enum class IndexKeyKind : uint8_t {
  kNone,
  kOwnCompressor,  // V4: the layer's own overlapping key compressor (Hadamard + FP4 in production)
  kFromLatent,     // V4.1: RMSNorm(latent Wk) of the KV source's pre-rope latent
};

enum class MoeKind : uint8_t { kHash, kBiased };   // tid2eid table / top-k of scores + bias
enum class RopeKind : uint8_t { kMain, kCompress };  // theta (no YaRN) / compress_rope_theta + YaRN
enum class HcWiring : uint8_t {
  kPerSite,     // V4: each site collapses with weights computed from its own input; hc_head at the end
  kSinglePass,  // V4.1: a site collapses with the previous site's weights; final collapse by the last
};

// Storage and rounding of one cached row kind. The rounding is part of the model's numerics (V4.1's
// QAT formats apply in every mode; V4's production mode rounds KV through FP8): a backend stores
// the row in `storage` and applies the format's round trip before storing.
enum class RowFormat : uint8_t {
  kPlain,          // the backend's storage dtype, no rounding
  kFp8Nope64,      // V4 production: dims [0, d-rope) through FP8 e4m3, block 64, pow2 scales
  kFp4Hadamard32,  // V4 production indexer: Hadamard-128 then FP4 e2m1, block 32 (dim 128)
  kFp8Block32,     // V4.1 window: whole vector FP8 e4m3, ue8m0 scale per 32
  kFp4E4m3Block16, // V4.1 compressed entries: FP4 e2m1, e4m3 scale per 16
  kFp4Ue8m0Block32 // V4.1 index keys and queries: FP4 e2m1, ue8m0 scale per 32
};
const char* row_format_name(RowFormat f);

struct LayerPlan {
  int32_t index = 0;            // layer index; drafter blocks follow the main layers
  std::string role;             // human-readable role ("sliding", "csa", "hca", "full", "reuse", ...)
  int64_t window = 0;           // W: sliding window rows (keys p-W+1..p)
  RopeKind rope = RopeKind::kMain;
  bool q_head_norm = true;      // per-head unweighted RMS of q before rope (V4; not V4.1)

  // ---- compressed attention ----
  int64_t ratio = 0;            // m: source tokens per entry; 0 = sliding only
  CompressorKind compressor = CompressorKind::kNone;  // what this layer computes (KV sources only)
  bool compressor_ape = false;  // learned positional bias on the gate (V4)
  int32_t kv_source = -1;       // layer whose entries this layer attends (== index when it owns them)
  SelectKind select = SelectKind::kNone;
  int32_t topk_source = -1;     // layer whose selection is used (== index for kScore)
  IndexKeyKind index_keys = IndexKeyKind::kNone;  // produced by THIS layer (owners only)
  int32_t key_source = -1;      // layer owning the index keys scored (kScore)
  bool candidate_source = false;  // publishes the two-level candidate-block mask (V4.1)
  bool uses_candidates = false;   // masks its scores with the candidate source's blocks (V4.1)

  // ---- formats (numerics of the cached rows) ----
  RowFormat window_format = RowFormat::kPlain;
  RowFormat entry_format = RowFormat::kPlain;
  RowFormat key_format = RowFormat::kPlain;     // index keys and, with it, index queries

  // ---- FFN and residual ----
  MoeKind moe = MoeKind::kBiased;
  bool engram = false;          // Engram injection before the block (V4.1)
  // Bounded replay (V4.1 YOCO decoder, the layers after the candidate source): under compact
  // prefill this layer runs only over each sequence's kept tail (SeqInBatch::decoder_from on),
  // and its window starts no earlier than the tail: rows before it do not exist for it.
  bool replay_tail = false;
  int32_t tap = -1;             // DSpark tap slot: the stream mean of this layer's input (after Engram)

  bool owns_entries() const { return compressor != CompressorKind::kNone; }
  bool owns_keys() const { return index_keys != IndexKeyKind::kNone; }
  bool attends_compressed() const { return select != SelectKind::kNone; }
};

// The plans of a whole model: main layers, then drafter blocks (their `index` continues after the
// main layers). Cross-layer references always point at main layers at or below the consumer.
struct ModelPlan {
  std::vector<LayerPlan> layers;   // main decoder layers
  std::vector<LayerPlan> drafter;  // drafter blocks (V4 MTP: sliding only)
  HcWiring hc = HcWiring::kPerSite;
  int64_t max_rollback = 0;        // extra ring positions every per-slot ring keeps (causal_lm.h)
  // Bounded replay's keep length (CausalLM::replay_keep): 0 = full prefill. When > 0 the
  // replay_tail layers are a suffix of `layers` (validate checks it).
  int64_t replay_keep = 0;

  const LayerPlan& layer(int32_t i) const;
  int64_t num_layers() const { return int64_t(layers.size()); }
  // Checks the invariants the forward and the cache rely on (sources exist, are at or below the
  // consumer and own what is read; a consumer's ratio equals its source's; no KV source after the
  // candidate source). Throws ConfigError naming `origin` and the layer.
  void validate(const std::string& origin) const;
  // One letter per layer for `deepseek info` (S sliding, C V4 CSA, H V4 HCA, F full, R reuse, X reindex).
  std::string schedule_str() const;
};

}  // namespace deepinfer::model
