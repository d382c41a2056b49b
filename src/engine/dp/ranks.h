// Starting and joining the ranks of a parallel LLM (data_parallel_size > 1, or
// context_parallel_size > 1: then each data-parallel rank is a group of context_parallel_size
// processes whose first runs the engine and the others are its context-parallel helpers,
// model/deepseek/cp_serving.h).
//
// Self-launched (one node): rank 0 is the process that built the LLM. It writes the config into a
// fresh rendezvous directory, starts ranks 1..N-1 (LLMConfig.worker_command: the CLI's hidden
// `deepinfer rank-worker`, or `python -m deepinfer._rank_worker`), loads its own model meanwhile,
// and waits until every worker reports its model loaded (a ready file) or failed (an error file
// with the message, or the process exited): a worker that cannot load fails the LLM's
// constructor with that rank's message, never a hang. Then the ranks connect their groups and
// build their engines.
// Externally launched (torchrun / mpirun / srun, several nodes): every process builds the LLM
// with the same config; rank 0 drives, the others serve inside the constructor until rank 0
// shuts down (parallel::RankEnv says which is which).
#pragma once
#include <memory>
#include <span>
#include <optional>
#include <string>

#include "core/env.h"
#include "deepinfer/llm.h"
#include "engine/dp/dp_engine.h"
#include "model/deepseek/context_parallel.h"
#include "model/deepseek/model.h"
#include "parallel/launcher.h"
#include "parallel/process_group.h"
#include "parallel/topology.h"

namespace deepinfer::engine::dp {

// What one rank of a parallel LLM holds. Members are destroyed in reverse order: the driver
// (shutdown round) first, then the engine, then the groups it used, then the workers and the
// rendezvous directory.
struct RankRuntime {
  std::unique_ptr<parallel::RendezvousDir> dir;        // self-launched rank 0 only
  std::unique_ptr<parallel::WorkerProcesses> workers;  // self-launched rank 0 only
  std::unique_ptr<parallel::ProcessGroup> world;
  std::unique_ptr<parallel::ProcessGroup> ep_group;    // null when the expert group is the world
  // The expert group's NCCL communicator when every rank has a GPU of its own (ep_device_exchange).
  std::unique_ptr<parallel::ProcessGroup> ep_device_group;
  // Context parallelism with data_parallel_size > 1: this rank's CP group, and (CP leaders only)
  // the group of the leaders, which the data-parallel rounds run over.
  std::unique_ptr<parallel::ProcessGroup> cp_group, leaders;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Driver> driver;                      // rank 0 only; none under context parallelism alone
  // Context parallelism (context_parallel_size > 1): the group's CP state and this rank's model
  // (owned by its engine; a helper's engine is never stepped).
  std::shared_ptr<model::ds::ContextParallel> cp;
  model::ds::DeepseekModel* cp_model = nullptr;
  int rank = 0, world_size = 1;
  ~RankRuntime();
};

// The parallel layout the config asks for (expert_parallel_size 0 = data_parallel_size),
// validated (InvalidArgument naming the LLMConfig field) against the accelerator: the GPU
// backend has no expert parallelism yet and needs one device per rank.
parallel::ParallelConfig parallel_config(const LLMConfig& config, const EnvConfig& env);

// One rank of the expert group as ep_device_exchange sees it: its host (a hash of the name it was
// launched with), its GPU (-1: none) and whether it can take the device exchange at all.
struct EpSeat {
  uint64_t host = 0;
  int64_t device = -1;
  bool capable = false;
};
// Whether the expert group's MoE exchange runs on the device over NCCL: every rank capable (GPU
// backend, NCCL in the build, EPLB off — not built with it —, DEEPINFER_EP_EXCHANGE not "host")
// and no two ranks on the same GPU of the same host (NCCL refuses that; ranks sharing one GPU,
// how one H200 runs the tests, keep the host-staged exchange). Every rank decides from the same seats.
bool ep_device_exchange(std::span<const EpSeat> seats);

// Rank 0 of a parallel LLM (self-launched when `launched` is nullopt). Throws naming the rank
// that failed.
std::unique_ptr<RankRuntime> start_driver(const LLMConfig& config, const EnvConfig& env,
                                          const std::optional<parallel::RankEnv>& launched);
// A worker rank (launched->rank > 0): loads, connects, serves until rank 0 shuts down.
// `config` null: read the config rank 0 wrote into the rendezvous directory (self-launched).
void serve_worker(const parallel::RankEnv& launched, const LLMConfig* config);

// `deepinfer rank-worker` / `python -m deepinfer._rank_worker`: serve_worker from the
// environment's RankEnv; the exit code (errors are printed to stderr and written to the
// rendezvous directory for rank 0).
int rank_worker_main();

}  // namespace deepinfer::engine::dp
