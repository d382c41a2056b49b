// What the engine needs from a model, whatever the architecture or backend. The model owns
// its weights and its cache storage; the engine's cache manager decides which blocks and
// slots each sequence holds and passes them in every ForwardBatch.
#pragma once
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/tensor.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"

namespace deepinfer::model {

// Logits a backend left in accelerator memory by forward_device(): f32 [rows, vocab], row r at
// data + r * row_stride, valid until the next forward()/forward_device() call. Work on them is
// ordered on `stream` (a cudaStream_t for the CUDA backend) of device `device`; nothing has
// synchronised the host with it yet.
struct DeviceLogits {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;
  void* stream = nullptr;
  int device = 0;
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_model_len() const = 0;
  virtual int64_t eos_token_id() const = 0;
  virtual int64_t bos_token_id() const = 0;
  virtual std::string describe() const = 0;  // one line: architecture, layers, backend

  // Size the cache for `budget_bytes`, holding at most `max_slots` running sequences.
  // Side-effect free: the engine decides, then calls allocate_cache.
  virtual kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const = 0;
  virtual void allocate_cache(const kv::CacheGeometry& geometry) = 0;
  // Clears the fixed state of a slot before a new sequence uses it.
  virtual void reset_slot(int32_t slot) = 0;

  // One batched forward over all sequences in `batch`. Writes their new cache entries and
  // returns f32 host logits [batch.logits_indices.size(), vocab].
  virtual Tensor forward(const ForwardBatch& batch) = 0;

  // Optional, for backends that run on an accelerator: forward() without the copy of the
  // logits to the host, so the engine can sample on the device and bring back only token ids
  // and logprobs. The engine calls forward_device() only when supports_device_logits().
  virtual bool supports_device_logits() const { return false; }
  virtual DeviceLogits forward_device(const ForwardBatch& batch) {
    DI_THROW(InternalError, describe(), ": forward_device() called on a backend without device logits");
  }
};

}  // namespace deepinfer::model
