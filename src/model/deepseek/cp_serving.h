// Context-parallel serving (context_parallel.h) under an engine: rank 0 of the CP group runs the
// engine and its model; ranks 1..cp-1 are helpers that hold the same model and join the split
// steps. Before every step the leader's model runs with at least min_tokens tokens, it broadcasts
// the batch and the cache state the batch reads (each sequence's slot state and its paged
// blocks), so a helper restores exactly the leader's state for those sequences, runs the same
// step (its share of the attention core, and of the MoE when the experts are sharded over the
// group) and discards the outputs. Steps below the threshold run on the leader alone; when the
// model is expert-parallel over the CP group, the leader tells the helpers about each of those
// too, and they run an empty step that joins its MoE exchanges (every rank of an expert group
// joins every step). The leader's stop() (its destructor) ends the helpers' loop.
//
// Cost: each split step ships its sequences' slot state (window rings, partials) and the blocks of
// their block tables whose bytes the helpers do not hold yet (the leader keeps a hash per block of
// what the helpers hold: blocks a split step wrote on every rank, or shipped before, are not sent
// again, so a long prompt's chunks ship each block about once instead of once per chunk) from
// rank 0 to the helpers; decode and short steps ship nothing (a one-byte message each under
// expert parallelism).
#pragma once
#include <memory>

#include "model/deepseek/context_parallel.h"
#include "model/deepseek/model.h"

namespace deepinfer::model::ds {

// Makes `model` (rank `group.rank()`) context-parallel over `group`: sets its backend's
// ContextParallel; on rank 0 also the hook that hands split steps to the helpers.
std::shared_ptr<ContextParallel> enable_context_parallel(DeepseekModel& model, parallel::ProcessGroup& group,
                                                         int64_t min_tokens);
// A helper rank (group rank > 0): serves the leader's split steps (and, expert-parallel, joins
// its other steps) until it stops. InternalError when the leader's group fails.
void serve_context_parallel_helper(DeepseekModel& model, ContextParallel& cp);
// Rank 0: ends the helpers' loops (idempotent).
void stop_context_parallel_helpers(ContextParallel& cp);

}  // namespace deepinfer::model::ds
