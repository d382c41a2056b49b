// Starting the ranks of one parallel engine on this node: the driver (the process that built the
// LLM, rank 0) starts ranks 1..world-1 as child processes running `command` (the CLI's hidden
// rank-worker subcommand, or `python -m deepinfer._rank_worker`), with DEEPINFER_RANK /
// DEEPINFER_WORLD_SIZE / DEEPINFER_LOCAL_RANK / DEEPINFER_RENDEZVOUS_DIR set and the rest of the
// environment inherited. Several nodes: an external launcher (torchrun, mpirun, srun) starts every
// rank instead and the workers read its variables (topology.h RankEnv); nothing else changes.
#pragma once
#include <chrono>
#include <optional>
#include <string>
#include <sys/types.h>
#include <utility>
#include <vector>

namespace deepinfer::parallel {

// A fresh private directory for the ranks' rendezvous store, removed with the object.
class RendezvousDir {
 public:
  RendezvousDir();  // under $TMPDIR (or /tmp)
  ~RendezvousDir();
  RendezvousDir(const RendezvousDir&) = delete;
  RendezvousDir& operator=(const RendezvousDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct WorkerLaunch {
  std::vector<std::string> command;  // argv of a worker (argv[0] a path, or a name looked up in PATH)
  int world_size = 1;
  std::string rendezvous_dir;
  std::vector<std::pair<std::string, std::string>> env;  // extra variables for every worker
};

class WorkerProcesses {
 public:
  // Starts ranks 1..world_size-1. Throws InvalidArgument when the command cannot be started.
  explicit WorkerProcesses(const WorkerLaunch& launch);
  // Gives the workers `grace` to exit (they do once the driver's group shuts down), then kills them.
  ~WorkerProcesses();
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  // A worker that has exited, as "rank 2 (pid 1234) exited with status 1" / "... killed by signal 9";
  // nullopt while all run. Does not block.
  std::optional<std::string> exited();
  // Waits up to `timeout` for every worker to exit; true when all did.
  bool wait(std::chrono::milliseconds timeout);
  int num_workers() const { return int(pids_.size()); }

 private:
  std::vector<pid_t> pids_;          // [world-1] rank r+1
  std::vector<int> status_;          // waitpid status once reaped
  std::vector<bool> reaped_;
};

}  // namespace deepinfer::parallel
