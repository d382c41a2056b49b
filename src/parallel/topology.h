// The parallel layout and where one process sits in it.
//
// World = data_parallel_size ranks, one process each (one GPU each on the GPU backend). Every
// rank runs attention for its own requests (attention data parallelism). Experts are sharded
// across groups of expert_parallel_size consecutive ranks (1 = every rank holds every expert);
// a long prefill is split across context_parallel_size consecutive ranks (1 = off). Both divide
// the world size.
#pragma once
#include <functional>
#include <optional>
#include <string>

namespace deepinfer::parallel {

struct ParallelConfig {
  int data_parallel_size = 1;
  int expert_parallel_size = 1;
  int context_parallel_size = 1;
  int world_size() const { return data_parallel_size; }
  bool is_parallel() const { return world_size() > 1; }
  // Throws InvalidArgument naming the field (LLMConfig / CLI flag names).
  void validate() const;
  // Also checks the accelerators: the GPU backend needs one visible device per rank.
  void validate_devices(bool gpu, int devices_visible) const;
  std::string describe() const;  // "dp 4 (ep 4, cp 2)"
};

// Where rank `rank` sits: its expert-parallel group (consecutive ranks) and context-parallel group.
struct RankPlace {
  int rank = 0;
  int ep_group = 0, ep_rank = 0;
  int cp_group = 0, cp_rank = 0;
};
RankPlace place_rank(const ParallelConfig& config, int rank);

// How this process was started, from the environment:
//  * deepinfer's own launcher: DEEPINFER_RANK, DEEPINFER_WORLD_SIZE, DEEPINFER_LOCAL_RANK,
//    DEEPINFER_RENDEZVOUS_DIR (and DEEPINFER_RANK_HOST, the address this rank listens on);
//  * an external launcher: torchrun's RANK / WORLD_SIZE / LOCAL_RANK, Open MPI's
//    OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK or Slurm's SLURM_PROCID / SLURM_NTASKS /
//    SLURM_LOCALID, with DEEPINFER_RENDEZVOUS_DIR naming a directory every rank can reach.
struct RankEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string rendezvous_dir;
  std::string host = "127.0.0.1";
  std::string source;  // which variables it came from ("deepinfer", "torchrun", "mpi", "slurm")
  // nullopt when no launcher set anything (a plain single process). Throws InvalidArgument naming
  // the variable on a bad or incomplete setting.
  static std::optional<RankEnv> from_lookup(const std::function<const char*(const char*)>& lookup);
  static std::optional<RankEnv> from_environment();
};

}  // namespace deepinfer::parallel
