#include "parallel/topology.h"

#include <cstdlib>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::parallel {

void ParallelConfig::validate() const {
  auto positive = [](const char* name, int v) {
    if (v < 1) DI_THROW(InvalidArgument, name, "=", v, ": must be >= 1");
  };
  positive("data_parallel_size", data_parallel_size);
  positive("expert_parallel_size", expert_parallel_size);
  positive("context_parallel_size", context_parallel_size);
  if (data_parallel_size % expert_parallel_size != 0)
    DI_THROW(InvalidArgument, "expert_parallel_size=", expert_parallel_size, " must divide data_parallel_size=",
             data_parallel_size, " (experts are sharded across groups of consecutive data-parallel ranks)");
  if (data_parallel_size % context_parallel_size != 0)
    DI_THROW(InvalidArgument, "context_parallel_size=", context_parallel_size, " must divide data_parallel_size=",
             data_parallel_size, " (a prefill is split across consecutive data-parallel ranks)");
}

void ParallelConfig::validate_devices(bool gpu, int devices_visible) const {
  validate();
  if (gpu && world_size() > devices_visible)
    DI_THROW(InvalidArgument, "data_parallel_size=", data_parallel_size, " needs one GPU per rank but ",
             devices_visible, " GPU(s) are visible",
             std::getenv("CUDA_VISIBLE_DEVICES") ? detail::str_cat(" (CUDA_VISIBLE_DEVICES=", std::getenv("CUDA_VISIBLE_DEVICES"), ")") : "");
}

std::string ParallelConfig::describe() const {
  return detail::str_cat("dp ", data_parallel_size, " (ep ", expert_parallel_size, ", cp ", context_parallel_size, ")");
}

RankPlace place_rank(const ParallelConfig& c, int rank) {
  DI_CHECK(rank >= 0 && rank < c.world_size(), "rank ", rank, " outside ", c.describe());
  return {.rank = rank,
          .ep_group = rank / c.expert_parallel_size,
          .ep_rank = rank % c.expert_parallel_size,
          .cp_group = rank / c.context_parallel_size,
          .cp_rank = rank % c.context_parallel_size};
}

namespace {
int parse_int(const char* name, const char* v, int lo) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < lo || x > (1 << 20))
    DI_THROW(InvalidArgument, "environment variable ", name, "='", v, "': expected an integer >= ", lo);
  return int(x);
}
}  // namespace

std::optional<RankEnv> RankEnv::from_lookup(const std::function<const char*(const char*)>& lookup) {
  auto get = [&](const char* n) -> const char* {
    const char* v = lookup(n);
    return v && *v ? v : nullptr;
  };
  struct Names { const char *rank, *size, *local, *source; };
  const Names sources[] = {{"DEEPINFER_RANK", "DEEPINFER_WORLD_SIZE", "DEEPINFER_LOCAL_RANK", "deepinfer"},
                           {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpi"},
                           {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm"}};
  for (const Names& s : sources) {
    const char* r = get(s.rank);
    const char* n = get(s.size);
    if (!r && !n) continue;
    if (!r || !n) DI_THROW(InvalidArgument, "environment: ", r ? s.size : s.rank, " is unset but ", r ? s.rank : s.size, " is set");
    RankEnv e;
    e.source = s.source;
    e.world_size = parse_int(s.size, n, 1);
    e.rank = parse_int(s.rank, r, 0);
    if (e.rank >= e.world_size)
      DI_THROW(InvalidArgument, "environment: ", s.rank, "=", e.rank, " is not below ", s.size, "=", e.world_size);
    const char* l = get(s.local);
    e.local_rank = l ? parse_int(s.local, l, 0) : e.rank;
    if (const char* d = get("DEEPINFER_RENDEZVOUS_DIR")) e.rendezvous_dir = d;
    else if (e.world_size > 1)
      DI_THROW(InvalidArgument, "environment: ", s.source, " started rank ", e.rank, " of ", e.world_size,
               " but DEEPINFER_RENDEZVOUS_DIR is unset: set it to a directory every rank can reach (a TCP "
               "rendezvous at MASTER_ADDR is not implemented)");
    if (const char* h = get("DEEPINFER_RANK_HOST")) e.host = h;
    return e;
  }
  return std::nullopt;
}

std::optional<RankEnv> RankEnv::from_environment() {
  return from_lookup([](const char* n) { return std::getenv(n); });
}

}  // namespace deepinfer::parallel
