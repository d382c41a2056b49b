// In-process loopback of parallel::DeviceAllToAllV for tests: W simulated ranks on one GPU, each
// run by its own host thread with its own stream and device buffers. A call is a rendezvous of
// all W ranks (std::barrier): each rank records an event after its queued work (its send buffer
// ready), then pulls every peer's block for it with cudaMemcpyAsync on its own stream, in rank
// order (the order NCCL delivers into `recv`), after waiting for that peer's event; a second
// rendezvous makes each sender's stream wait until every receiver's copies are done, so work
// queued after the call may reuse `send`, as with NCCL. Mismatched sizes (rank r's send_bytes[q]
// against rank q's recv_bytes[r]) throw InternalError on the receiving rank, naming both; the
// peers then see a broken rendezvous only through their own checks, so tests keep sizes right.
#pragma once
#include <memory>

#include "parallel/device_all_to_all.h"

namespace deepinfer::model::ds::cuda {

class LoopbackHub;  // shared by the W simulated ranks
std::shared_ptr<LoopbackHub> make_loopback_hub(int world, int device);
// Rank `rank`'s end (0 <= rank < world); the hub outlives every call.
std::unique_ptr<parallel::DeviceAllToAllV> make_loopback_all_to_all(std::shared_ptr<LoopbackHub> hub, int rank);

}  // namespace deepinfer::model::ds::cuda
