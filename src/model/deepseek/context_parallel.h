// Context parallelism for long prefills on CPU ranks (issue 14 item 5): every rank of a CP group
// runs the same prefill step in lockstep; the step's attention core (window + compressed sparse
// attention and the indexer's top-k scoring, the part whose work grows with the position) is split
// by parallel::balanced_cp_plan (rank i computes the queries of chunks i and 2cp-1-i) and the
// attention output rows are all-gathered before the output projection. Everything else (the
// projections, the KV path: window rows, compressors and their partials, index keys; mHC, the
// MoE, the head) runs replicated over every position, so every rank, the owner included, ends
// the step with the complete KV state and the same logits as one rank: bit for bit, because each
// query row's attention does not depend on which other rows the call computes, and the replicated
// work has the single-rank shapes.
//
// Lockstep: a step of at least `min_tokens` tokens is split, and every rank of the group must run
// it (the same batch); a shorter step (decode, short prompts) runs alone, with no collective, so
// decode after a split prefill continues on the owning rank only. Fixed-shape steps and MTP blocks
// are never split.
//
// With expert parallelism over the same group (the CP ranks are the EP ranks), a split step's MoE
// is split too: every rank runs its own experts on all of the step's tokens and the outputs are
// all-gathered (ExpertParallel::dispatch_replicated), combined in the single rank's order; steps
// that are not split take the ordinary expert-parallel dispatch, so every rank then joins every
// step's MoE exchanges (a rank without the step's tokens runs an empty forward).
//
// On the CPU and the CUDA backend (there the gathered rows are staged through the host:
// CudaBackend::gather_cp_rows). Not with expert parallelism on the GPU (refused).
#pragma once
#include <cstdint>
#include <vector>

#include "model/plan/step_plan.h"
#include "parallel/cp_plan.h"
#include "parallel/process_group.h"

namespace deepinfer::model::ds {

struct CpOptions {
  // Steps with fewer tokens are not split (>= 2, so a decode step never is).
  int64_t min_tokens = 512;
  // Chunk boundaries in absolute positions are multiples of it (balanced_cp_plan's align: the
  // model's largest compression ratio, so a compressor block stays on one rank's queries).
  int64_t align = 1;
};

class ContextParallel {
 public:
  // InvalidArgument for min_tokens < 2 or align < 1. The group must be a host group.
  ContextParallel(parallel::ProcessGroup& group, CpOptions options);
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  const CpOptions& options() const { return options_; }
  parallel::ProcessGroup& group() { return group_; }
  bool stopped() const { return stopped_; }  // serving (cp_serving.h): the leader stopped its helpers
  void mark_stopped() { stopped_ = true; }

  // Called by the backend for every step plan: decides whether the step is split (every rank
  // decides alike from the same plan) and this step's plan in step rows.
  void begin_step(const StepPlan& plan);
  bool active() const { return active_; }
  // This step's rows of `rank` ([begin, end) step rows, ascending), empty when inactive.
  const std::vector<parallel::CpSpan>& rows_of(int r) const { return rows_.at(size_t(r)); }
  const std::vector<parallel::CpSpan>& own_rows() const { return rows_of(rank()); }
  // The plan in absolute positions of the last split step (for cp_work / cp_imbalance).
  const parallel::CpPlan& last_plan() const { return plan_; }

  // buf [T, row_bytes] host rows: every rank's own rows to every rank (one all-gather).
  void gather_rows(void* buf, int64_t row_bytes);

  // Counters since construction: split steps, query rows this rank computed in them (per layer
  // call), bytes this rank received in gather_rows.
  int64_t split_steps() const { return split_steps_; }
  int64_t bytes_received() const { return bytes_received_; }
  int64_t gathers() const { return gathers_; }
  // Serving (cp_serving.h), leader: paged blocks shipped to the helpers before split steps, and
  // blocks not shipped because the helpers already held their bytes (totals).
  void note_blocks_shipped(int64_t shipped, int64_t skipped) { blocks_shipped_ = shipped, blocks_skipped_ = skipped; }
  int64_t blocks_shipped() const { return blocks_shipped_; }
  int64_t blocks_skipped() const { return blocks_skipped_; }
  // Serving with expert parallelism: steps the leader ran alone whose MoE exchanges every rank
  // joined (the helpers with an empty step).
  void note_joined_step() { ++joined_steps_; }
  int64_t joined_steps() const { return joined_steps_; }

 private:
  parallel::ProcessGroup& group_;
  CpOptions options_;
  bool active_ = false, stopped_ = false;
  int64_t T_ = 0;
  parallel::CpPlan plan_;
  std::vector<std::vector<parallel::CpSpan>> rows_;
  std::vector<uint8_t> send_, recv_;
  int64_t split_steps_ = 0, bytes_received_ = 0, gathers_ = 0;
  int64_t blocks_shipped_ = 0, blocks_skipped_ = 0, joined_steps_ = 0;
};

}  // namespace deepinfer::model::ds
