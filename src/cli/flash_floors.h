// The floors `deepinfer bench-flash` sets its numbers against, from a checkpoint's config alone:
// bytes a step must read / 4.3 TB/s and FLOPs / 790 TFLOP/s (ANCHORS.md). One model per family:
// V4 (MODEL-DEEPSEEK-V4.md §10 scaled to the layers present) and V4.1 (per layer role from its
// plan: MODEL-DEEPSEEK-V41.md §2-§5, §10).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace deepinfer::cli {

class FlashFloors {
 public:
  virtual ~FlashFloors() = default;
  virtual std::string family() const = 0;    // "V4", "V4.1"
  virtual std::string schedule() const = 0;  // one letter per layer
  virtual int64_t layers() const = 0;
  virtual int64_t vocab() const = 0;
  virtual int64_t max_positions() const = 0;
  // Prefill of one P-token prompt: FLOPs, and weight bytes read once (dense as stored, the experts
  // P tokens touch).
  virtual double prefill_flops(int64_t P) const = 0;
  virtual double prefill_bytes(int64_t P) const = 0;
  // One decode step of B sequences at context ctx: bytes (weights, touched experts, every
  // sequence's cache; release = the cache in its release formats rather than as the engine stores
  // it) and FLOPs.
  virtual double decode_bytes(int64_t B, double ctx, bool release) const = 0;
  virtual double decode_flops(int64_t B, double ctx) const = 0;
  // Expected distinct routed experts per layer that `tokens` tokens touch (uniform routing).
  virtual double touched_experts(double tokens) const = 0;
  // transformers eager ms per layer at ctx 4K (ANCHORS.md), 0 where none was measured.
  virtual double hf_layer_ms(const std::string& what, int64_t B, int64_t ctx) const { return 0; }
};

// Reads `model_dir`/config.json and picks the family by its architecture.
std::unique_ptr<FlashFloors> make_flash_floors(const std::string& model_dir);

}  // namespace deepinfer::cli
