// `deepinfer rank-worker`: one worker rank of a parallel LLM. Rank 0 (the process that built the
// LLM with data_parallel_size or context_parallel_size > 1) starts these with DEEPINFER_RANK / DEEPINFER_WORLD_SIZE /
// DEEPINFER_RENDEZVOUS_DIR set; it is not meant to be run by hand.
#include <cstring>
#include <cstdio>

#include "cli/command.h"
#include "engine/dp/ranks.h"

namespace {
int run_rank_worker(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("usage: deepinfer rank-worker\n\n"
                "A worker rank of a parallel LLM (data_parallel_size or context_parallel_size > 1), started by rank 0 with\n"
                "DEEPINFER_RANK, DEEPINFER_WORLD_SIZE and DEEPINFER_RENDEZVOUS_DIR set; it reads the\n"
                "LLM config rank 0 wrote there, loads its model and expert shard, and serves rank 0's\n"
                "steps until rank 0 shuts down.\n");
    return 0;
  }
  return deepinfer::engine::dp::rank_worker_main();
}
}  // namespace
DI_REGISTER_COMMAND("rank-worker", "(internal) a worker rank of a parallel LLM, started by rank 0", run_rank_worker);
