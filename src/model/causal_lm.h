// What the engine needs from a model, whatever the family (DeepSeek-V4, V4.1) or backend (CPU,
// CUDA). The model owns its weights and its cache storage; the engine's cache manager decides
// which blocks and slots each sequence holds and passes them in every ForwardBatch.
//
// Contract for rollback (speculative decoding, prefix reuse): every per-slot ring of a model
// (sliding windows, compressor partials, drafter rings) holds max_rollback() positions beyond what
// the next step needs, and paged entries are only ever read up to the sequence's length, so a
// sequence whose last n <= max_rollback() positions are dropped resumes exactly from the shorter
// length: the next step simply starts at the smaller num_computed_tokens. rollback() checks that
// contract and clears nothing.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/env.h"
#include "core/tensor.h"
#include "deepinfer/outputs.h"
#include "kv/kv_cache.h"
#include "parallel/eplb.h"
#include "model/forward_batch.h"

namespace deepinfer::parallel {
class ProcessGroup;
class DeviceAllToAllV;  // parallel/device_all_to_all.h
}

namespace deepinfer::model {

// Expert parallelism (LLMConfig's fields, vLLM's names): physical expert slots beyond the
// logical experts (replicas of hot experts), and runtime EPLB (every `eplb_step_interval` steps,
// re-place experts by the loads of the last `eplb_window_size` steps).
struct ExpertParallelOptions {
  int32_t num_redundant_experts = 0;
  bool enable_eplb = false;
  int32_t eplb_window_size = 1000;
  int32_t eplb_step_interval = 3000;
  // The group's exchange in device memory (NCCL between GPUs, one per rank); null: the backend
  // exchanges through `group` (host-staged on the GPU). The caller keeps its group alive.
  std::shared_ptr<parallel::DeviceAllToAllV> device_exchange;
};

class Drafter;

// Logits a backend left in accelerator memory: f32 [rows, vocab], row r at data + r * row_stride,
// valid until the next forward of the same model. Work on them is ordered on `stream` (a
// cudaStream_t for the CUDA backend) of device `device`; nothing has synchronised the host with it.
struct DeviceLogits {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0;
  void* stream = nullptr;
  int device = 0;
};

// What the model's drafter reads of the rows a batch asked for (ForwardBatch::hidden_indices): the
// final residual streams [rows, hc_mult, hidden] f32 (V4's MTP), or DeepSeek-V4.1's DSpark taps
// [rows, taps * hidden] (the stream means at its target layers' inputs). Host backends fill
// `host`; device backends leave them in device memory (`device`, valid like DeviceLogits) and fill
// `host` only when asked to copy.
struct HiddenRows {
  Tensor host;                   // f32 [rows, n, D] (or [rows, taps*D]) or undefined
  const float* device = nullptr; // f32 rows of row_elems, contiguous, or null
  int64_t rows = 0;
  int64_t row_elems = 0;         // n * D (taps * D)
  void* stream = nullptr;
  int device_index = 0;
};

struct ForwardOptions {
  bool logits_on_device = false;  // leave logits in device memory (supports_device_logits() only)
  bool hidden_to_host = true;     // copy the asked-for hidden rows to the host (device backends)
};

// The typed result of one forward step.
struct ForwardOutput {
  Tensor logits;                  // f32 host [logits_indices.size(), vocab] unless logits_on_device
  DeviceLogits device_logits;     // when logits_on_device
  HiddenRows hidden;              // when batch.hidden_indices is non-empty
};

// What the engine will ask of a model; sizes memory plans and fixed-shape (graph) buffers.
struct ModelLimits {
  int64_t max_num_seqs = 64;              // sequences in one step
  int64_t max_num_batched_tokens = 8192;  // new tokens in one step
  int64_t max_model_len = 0;              // longest sequence; 0 = the model's own limit
  int64_t max_rollback = 0;               // positions a step may be rolled back (drafts + 1)
};

// Everything a model factory needs (model/registry.h). The environment was read once by the
// caller; nothing below reads it again.
struct ModelLoadOptions {
  EnvConfig env;
  ModelLimits limits;
  int device = 0;               // accelerator index for device backends (taken modulo the visible devices:
                                // data-parallel ranks pass their local rank and may share a GPU)
  bool progress = true;         // load progress on stderr
  // Expert parallelism without weight moves: prepare only this rank's routed experts of the main
  // layers (MTP blocks keep all theirs). Empty: every expert.
  std::optional<parallel::ExpertShard> expert_shard;
};

// A slot's fixed state (window rings, compressor partials, drafter rings) at a sequence length,
// in a backend-private byte format: what prefix reuse restores on a hit.
struct SlotSnapshot {
  int64_t num_tokens = 0;
  std::vector<uint8_t> bytes;
};

// One slot checkpoint to take (CausalLM::queue_save_slots).
struct SlotSave {
  int32_t slot = -1;
  int64_t num_tokens = 0;
};

// Checkpoints queued by CausalLM::queue_save_slots: wait() returns them in the order asked once
// their copies are done (call it once). Dropping the handle without wait() waits for the copies.
class PendingSlotSaves {
 public:
  virtual ~PendingSlotSaves() = default;
  virtual std::vector<SlotSnapshot> wait() = 0;
};

// Snapshots already taken (backends whose copies are synchronous).
class ReadySlotSaves final : public PendingSlotSaves {
 public:
  explicit ReadySlotSaves(std::vector<SlotSnapshot> snapshots) : snapshots_(std::move(snapshots)) {}
  std::vector<SlotSnapshot> wait() override { return std::move(snapshots_); }

 private:
  std::vector<SlotSnapshot> snapshots_;
};

// One paged block copied to or from host memory (prefix caching's host tier): every layer's rows
// of block `block` (compressed entries, index keys) as paged_block_bytes() backend-private bytes.
struct HostBlockCopy {
  int32_t block = -1;       // block id in the cache
  uint8_t* host = nullptr;  // [paged_block_bytes()] host memory, best from allocate_host_memory
};

// Device memory a backend allocated (disaggregation's block staging, CausalLM::
// allocate_device_memory): `data` on device `device`, freed when the last owner goes.
struct DeviceMemory {
  std::shared_ptr<void> owner;
  void* data = nullptr;
  size_t bytes = 0;
  int device = -1;
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

  // One batched forward over all sequences in `batch`: writes their new cache entries, returns
  // logits of batch.logits_indices and the hidden rows of batch.hidden_indices. Throws
  // InvalidArgument naming the field when the batch does not fit the cache.
  virtual ForwardOutput run(const ForwardBatch& batch, const ForwardOptions& options) = 0;

  // Host logits [batch.logits_indices.size(), vocab] (convenience over run()).
  Tensor forward(const ForwardBatch& batch) { return run(batch, {}).logits; }
  // Backends that run on an accelerator can leave the logits there, so the engine samples on the
  // device and brings back only ids and logprobs. Call only when supports_device_logits().
  virtual bool supports_device_logits() const { return false; }
  DeviceLogits forward_device(const ForwardBatch& batch) {
    if (!supports_device_logits())
      DI_THROW(InternalError, describe(), ": forward_device() called on a backend without device logits");
    return run(batch, {.logits_on_device = true, .hidden_to_host = false}).device_logits;
  }

  // Whether run() takes ForwardBatch::device_inputs (token ids another step left in device
  // memory, on the stream of its DeviceLogits). Models that cannot must refuse such a batch.
  virtual bool supports_device_inputs() const { return false; }

  // Device timeline for benchmarks (asynchronous scheduling's measure). With profiling on, a
  // device backend records when each step's device work begins (its first upload) and, at
  // mark_step_end() (the engine calls it once it queued everything of the step: forward and
  // sampling), when that work ends. take_profile() waits for the device and returns, per profiled
  // step, its device time and the device's idle time before it (0 for the first step); it then
  // forgets them. Host backends record nothing.
  struct StepProfile {
    std::vector<double> busy_ms;  // [steps] begin -> end of each step's device work
    std::vector<double> idle_ms;  // [steps] end of the previous step -> begin of this one
  };
  virtual void set_profiling(bool on) {}
  virtual void mark_step_end() {}
  virtual StepProfile take_profile() { return {}; }
  // Per-operation device times (benchmarks: `bench-flash --breakdown`): with op profiling on, a
  // device backend runs every step eagerly (no graph replay) and times each of its top-level ops
  // between two events; take_op_profile() waits for the device and returns the sums since op
  // profiling was turned on or last taken, largest first. Backends without it return nothing.
  // Prefill chunks shorter than this many tokens are bound by reading the weights (every routed
  // expert is touched by a few hundred tokens): the tokens whose arithmetic at the device's bf16
  // peak takes as long as one pass over the weights at its bandwidth. 0 when that pass is short
  // (< 1 ms: small models, where per-step costs dominate) or unknown. The prefix cache's automatic
  // checkpoint interval keeps prefill chunks at least this long (EngineConfig, prefix_checkpoint_blocks).
  virtual int64_t prefill_weight_pass_tokens() const { return 0; }
  virtual void set_op_profiling(bool on) {}
  virtual std::vector<OpTiming> take_op_profile() { return {}; }

  // True when run() takes part in collectives with other ranks (expert parallelism): the engine
  // then calls run() every step, with an empty batch when it has nothing to schedule, so that the
  // ranks' collectives pair up.
  virtual bool joins_collectives() const { return false; }
  // Shards the routed experts of the main layers across `group` (each rank computes the experts
  // of its slots for every rank's tokens; the group outlives the model). Called once, before
  // the engine is built. InvalidArgument where the model or its backend has no expert parallelism.
  virtual void enable_expert_parallel(parallel::ProcessGroup& group, const ExpertParallelOptions& options) {
    DI_THROW(InvalidArgument, describe(), ": expert parallelism is not implemented for this model");
  }
  // Waits until the work this model enqueued on its device is done (timing; the engine's cost
  // curve). Host backends are done when run() returns.
  virtual void synchronize() {}

  // Positions a slot can roll back (see the contract above); 0 = no rollback.
  virtual int64_t max_rollback() const { return 0; }
  // Bounded replay (DeepSeek-V4.1 compact prefill, DEEPINFER_YOCO_PREFILL_*): the kept tail of a
  // prompt whose later layers run, 0 = full prefill. When > 0 the runner sets
  // SeqInBatch::decoder_from = max(0, prompt length - replay_keep()) for requests without prompt
  // logprobs, and prefix-cache hits end at or before it (the later layers' window rows before a
  // tail depend on where that tail starts).
  virtual int64_t replay_keep() const { return 0; }
  // The sequence in `slot` goes back from `num_tokens` cached positions to `keep`. Throws
  // InvalidArgument when more than max_rollback() positions would be dropped.
  virtual void rollback(int32_t slot, int64_t num_tokens, int64_t keep) {
    if (keep < 0 || keep > num_tokens || num_tokens - keep > max_rollback())
      DI_THROW(InvalidArgument, describe(), ": rollback of slot ", slot, " from ", num_tokens, " to ", keep,
               " positions, the model rolls back at most ", max_rollback());
  }
  // Fixed state of `slot` holding a sequence of `num_tokens` positions, and its restore into a
  // (reset) slot. Models without snapshot support throw InternalError.
  virtual SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) {
    DI_THROW(InternalError, describe(), ": slot snapshots are not supported");
  }
  virtual void restore_slot(int32_t slot, const SlotSnapshot& snapshot) {
    DI_THROW(InternalError, describe(), ": slot snapshots are not supported");
  }
  // Prefix reuse (issue #16) checkpoints a slot at a block boundary N after a step that may have
  // gone past it: by the rollback contract, a slot whose rings were written up to position E
  // still represents the state at N when N <= its length and E - N <= max_rollback() (E counts
  // every position written since the slot was reset or restored, the drafter's included).
  // can_save_slot says whether save_slot(slot, N) would be such a state; false when the model
  // keeps no snapshots. A restored snapshot continues exactly at snapshot.num_tokens.
  virtual bool can_save_slot(int32_t slot, int64_t num_tokens) const { return false; }
  // save_slot of several slots, queued after the work queued so far: a device backend copies
  // them stream-ordered into pinned host memory without waiting (work queued after this call may
  // write the slots: the copies come first), and the handle's wait() gives the snapshots. At most
  // one handle may be outstanding (wait for it or drop it before the next call). Default: each
  // save_slot now.
  virtual std::unique_ptr<PendingSlotSaves> queue_save_slots(std::span<const SlotSave> saves) {
    std::vector<SlotSnapshot> out;
    for (const SlotSave& s : saves) out.push_back(save_slot(s.slot, s.num_tokens));
    return std::make_unique<ReadySlotSaves>(std::move(out));
  }

  // Block copies for the host tier: paged_block_bytes() per block (0 = not supported). The
  // copies are complete when the call returns (a device backend synchronises its stream), so the
  // host memory may be reused at once. copy_blocks_from_host overwrites the blocks' rows.
  virtual size_t paged_block_bytes() const { return 0; }
  virtual void copy_blocks_to_host(std::span<const HostBlockCopy> copies) {
    DI_THROW(InternalError, describe(), ": block copies are not supported");
  }
  virtual void copy_blocks_from_host(std::span<const HostBlockCopy> copies) {
    DI_THROW(InternalError, describe(), ": block copies are not supported");
  }
  // Device staging of paged blocks (prefill/decode disaggregation's device hop, issue #18):
  // paged_block_bytes() per listed block, packed in copy_blocks_to_host's very layout, into (or
  // from) device memory of device_ordinal() — a bundle's payload is the same bytes either way.
  // -1: the cache is not in device memory (the calls below throw InternalError).
  virtual int device_ordinal() const { return -1; }
  virtual DeviceMemory allocate_device_memory(size_t bytes) {
    DI_THROW(InternalError, describe(), ": no device memory (host cache)");
  }
  // Queued on the model's stream. `done` (a cudaEvent_t, or null) is recorded after the copies
  // and the call returns at once; with null it returns once they are complete. InvalidArgument
  // for an id out of range or listed twice.
  virtual void gather_blocks_to_device(std::span<const int32_t> blocks, void* dst, void* done) {
    DI_THROW(InternalError, describe(), ": device block copies are not supported");
  }
  // The model's stream first waits for `ready` (a cudaEvent_t, or null); complete on return
  // (`src` may be reused). Overwrites the blocks' rows.
  virtual void scatter_blocks_from_device(std::span<const int32_t> blocks, const void* src, void* ready) {
    DI_THROW(InternalError, describe(), ": device block copies are not supported");
  }
  // Host memory for block copies: page-locked where the backend copies from it faster (CUDA),
  // plain memory otherwise. Freed when the last reference goes.
  virtual std::shared_ptr<uint8_t> allocate_host_memory(size_t bytes) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) DI_THROW(OutOfMemory, describe(), ": host allocation of ", bytes, " bytes failed");
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  }

  // The model's own drafter for speculative decoding (V4: MTP, V4.1: DSpark), or null.
  virtual Drafter* drafter() { return nullptr; }
};

}  // namespace deepinfer::model
