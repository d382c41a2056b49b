// Process groups between GPUs over NCCL (one GPU per rank process). The communicator's unique id
// travels over a host `bootstrap` group (gloo, or the single-rank group at world size 1), so
// going from one node to several changes only how the bootstrap group is made.
// NVLink multicast (NVLS) stays off (NCCL_NVLS_ENABLE=0, forced before the communicator is made).
// Buffers are device memory on `device`; work is ordered on the stream set with set_stream
// (default: the legacy default stream). Float reductions are NCCL's own: deterministic for a
// fixed rank count and topology, not across counts (the engine reduces no floats across ranks on
// its hot path: MoE combine runs on the token's own rank in a fixed order).
#pragma once
#include <memory>
#include <string>

#include "parallel/process_group.h"

namespace deepinfer::parallel {

std::unique_ptr<ProcessGroup> make_nccl_group(ProcessGroup& bootstrap, int device, const std::string& name);
bool have_nccl();  // this build links NCCL

}  // namespace deepinfer::parallel
