// See ranks.h.
#include "engine/dp/ranks.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "core/logging.h"
#include "engine/dp/codec.h"
#include "engine/engine_factory.h"
#include "model/deepseek/cp_serving.h"
#include "model/registry.h"
#include "parallel/device_all_to_all.h"
#include "parallel/gloo_group.h"
#include "parallel/nccl_group.h"

namespace deepinfer::engine::dp {
namespace fs = std::filesystem;
namespace {

// Collectives wait for the slowest rank, and workers wait for rank 0's next round however long
// the user leaves the LLM idle: a peer that dies closes its sockets (an error at once), so the
// timeout only bounds a peer that hangs. Rendezvous waits are bounded by the ready files first.
constexpr std::chrono::milliseconds kGroupTimeout = std::chrono::hours(24 * 30);
constexpr const char* kConfigFile = "llm_config.bin";

std::string ready_file(const std::string& dir, int rank) { return dir + "/rank" + std::to_string(rank) + ".ready"; }
std::string error_file(const std::string& dir, int rank) { return dir + "/rank" + std::to_string(rank) + ".error"; }

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(text.data(), std::streamsize(text.size()));
    if (!f) DI_THROW(InternalError, "cannot write ", tmp);
  }
  fs::rename(tmp, path);  // readers never see a half-written file
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) DI_THROW(InternalError, "cannot read ", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> worker_command(const LLMConfig& config) {
  if (!config.worker_command.empty()) return config.worker_command;
  if (const char* v = std::getenv("DEEPINFER_WORKER_COMMAND"); v && *v) {
    std::vector<std::string> argv;
    std::istringstream in(v);
    for (std::string a; in >> a;) argv.push_back(a);
    return argv;
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && self.filename() == "deepinfer") return {self.string(), "rank-worker"};
  DI_THROW(InvalidArgument, "LLMConfig.worker_command is empty and DEEPINFER_WORKER_COMMAND is unset: data_parallel_size=",
           config.data_parallel_size, " needs a command that starts a worker rank (`deepinfer rank-worker` or `",
           "python -m deepinfer._rank_worker`)");
}

// Rank 0 (self-launched): until every worker has loaded. Throws naming the first that failed.
void wait_workers_ready(const std::string& dir, parallel::WorkerProcesses& workers, int world) {
  for (;;) {
    int ready = 0;
    for (int r = 1; r < world; ++r) {
      if (fs::exists(error_file(dir, r)))
        DI_THROW(InternalError, "data-parallel rank ", r, " failed to start: ", read_file(error_file(dir, r)));
      ready += fs::exists(ready_file(dir, r));
    }
    if (ready == world - 1) return;
    if (auto gone = workers.exited())
      DI_THROW(InternalError, "data-parallel ", *gone, " before it was ready (its stderr says why)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Context parallelism with expert_parallel_size = context_parallel_size: each CP group is an
// expert group (CPU only, where EPLB moves weights).
bool cp_shards_experts(const LLMConfig& c) {
  return c.context_parallel_size > 1 && c.expert_parallel_size == c.context_parallel_size;
}

// What rank `rank` prepares: its expert shard whenever experts are sharded; with EPLB a
// re-placement moves the gained experts between ranks (both backends are expert stores).
std::optional<parallel::ExpertShard> expert_shard_for(const LLMConfig& config, const EnvConfig& env, int rank) {
  if (cp_shards_experts(config))
    return parallel::ExpertShard{.rank = rank % config.context_parallel_size, .size = config.context_parallel_size,
                                 .num_redundant = config.num_redundant_experts};
  const parallel::ParallelConfig pc = parallel_config(config, env);
  if (pc.expert_parallel_size <= 1) return std::nullopt;
  const parallel::RankPlace place = parallel::place_rank(pc, rank);
  return parallel::ExpertShard{.rank = place.ep_rank, .size = pc.expert_parallel_size,
                               .num_redundant = config.num_redundant_experts};
}

// Under context parallelism every data-parallel rank is a group of context_parallel_size processes.
int world_of(const LLMConfig& c) {
  return c.context_parallel_size > 1 ? c.context_parallel_size * c.data_parallel_size : c.data_parallel_size;
}

bool runs_on_cpu(const EnvConfig& env) {
  return env.accelerator == Accelerator::kCPU || (env.accelerator == Accelerator::kAuto && model::accelerator_count() == 0);
}

// Context parallelism: the world is data_parallel_size groups of context_parallel_size consecutive
// ranks (rank = d * cp + c). CP rank 0 of group d (its leader) builds the engine of data-parallel
// rank d; the other ranks of the group are its helpers and keep their models. With one
// data-parallel rank the CP group is the world; else each group has its own, and the leaders one
// between them (the data-parallel rounds).
void connect_cp(RankRuntime& rt, const LLMConfig& config, const EnvConfig& env, LoadedParts parts,
                const std::string& dir, const std::string& host) {
  auto* m = dynamic_cast<model::ds::DeepseekModel*>(parts.model.get());
  if (!m) DI_THROW(InvalidArgument, "LLMConfig.context_parallel_size: the model is not a DeepSeek-V4-family model");
  const int cp = config.context_parallel_size, dp = config.data_parallel_size, d = rt.rank / cp, c = rt.rank % cp;
  parallel::ProcessGroup* group = rt.world.get();
  if (dp > 1) {
    // Every rank joins its CP group first, then the leaders join theirs: no group waits on a rank
    // that waits on another group.
    rt.cp_group = parallel::make_gloo_group({.rendezvous_dir = dir, .name = "cp" + std::to_string(d), .rank = c,
                                             .size = cp, .hostname = host, .timeout = kGroupTimeout});
    group = rt.cp_group.get();
    if (c == 0)
      rt.leaders = parallel::make_gloo_group({.rendezvous_dir = dir, .name = "dp-leaders", .rank = d, .size = dp,
                                              .hostname = host, .timeout = kGroupTimeout});
  }
  rt.cp = model::ds::enable_context_parallel(*m, *group, config.context_parallel_min_tokens);
  // The CP group is the expert group too: split steps run each rank's experts on every token; the
  // helpers join the other steps' MoE exchanges (cp_serving.h).
  if (cp_shards_experts(config))
    m->enable_expert_parallel(*group, {.num_redundant_experts = config.num_redundant_experts,
                                          .enable_eplb = config.enable_eplb, .eplb_window_size = config.eplb_window_size,
                                          .eplb_step_interval = config.eplb_step_interval});
  // Every rank builds its engine, so a helper's cache has its leader's geometry; a helper's engine
  // is never stepped (its model serves the leader's split steps).
  rt.cp_model = m;
  rt.engine = make_engine(config, env, std::move(parts));
}

uint64_t host_hash(const std::string& host) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : host) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The expert group's device exchange, when ep_device_exchange says so: the seats are all-gathered
// over the (gloo) expert group, then an NCCL communicator is made over it. Null otherwise.
std::shared_ptr<parallel::DeviceAllToAllV> make_ep_device_exchange(RankRuntime& rt, parallel::ProcessGroup& ep,
                                                                   const LLMConfig& config, const EnvConfig& env,
                                                                   int device, const std::string& host) {
  const EpSeat mine{.host = host_hash(host), .device = device,
                    .capable = !runs_on_cpu(env) && parallel::have_nccl() && !config.enable_eplb && device >= 0 &&
                               env.ep_exchange != EpExchange::kHost};
  std::vector<EpSeat> seats(size_t(ep.size()));
  const std::vector<int64_t> sizes(size_t(ep.size()), int64_t(sizeof(EpSeat)));
  ep.all_gather_v(&mine, int64_t(sizeof(EpSeat)), seats.data(), sizes);
  if (!ep_device_exchange(seats)) {
    // Every rank saw the same seats, so every rank refuses (none waits on a communicator).
    if (env.ep_exchange == EpExchange::kDevice)
      DI_THROW(InvalidArgument, "DEEPINFER_EP_EXCHANGE=device, but the expert-parallel group of ", ep.size(),
               " ranks cannot have a device exchange: it needs every rank on a GPU of its own, NCCL in the build "
               "and enable_eplb off (use auto or host)");
    return nullptr;
  }
  rt.ep_device_group = parallel::make_nccl_group(ep, device, "ep");
  return std::shared_ptr<parallel::DeviceAllToAllV>(parallel::make_group_all_to_all(*rt.ep_device_group));
}

// Every rank after its model is loaded: the groups, expert parallelism, the engine.
void connect(RankRuntime& rt, const LLMConfig& config, const EnvConfig& env, LoadedParts parts,
             const std::string& dir, const std::string& host) {
  const parallel::ParallelConfig pc = parallel_config(config, env);
  rt.world = parallel::make_gloo_group({.rendezvous_dir = dir, .name = "world", .rank = rt.rank,
                                        .size = rt.world_size, .hostname = host, .timeout = kGroupTimeout});
  if (config.context_parallel_size > 1) return connect_cp(rt, config, env, std::move(parts), dir, host);
  if (pc.expert_parallel_size > 1) {
    parallel::ProcessGroup* ep = rt.world.get();
    if (pc.expert_parallel_size != pc.data_parallel_size) {
      const parallel::RankPlace place = parallel::place_rank(pc, rt.rank);
      rt.ep_group = parallel::make_gloo_group({.rendezvous_dir = dir, .name = "ep" + std::to_string(place.ep_group),
                                               .rank = place.ep_rank, .size = pc.expert_parallel_size,
                                               .hostname = host, .timeout = kGroupTimeout});
      ep = rt.ep_group.get();
    }
    std::shared_ptr<parallel::DeviceAllToAllV> a2a =
        make_ep_device_exchange(rt, *ep, config, env, parts.model->device_ordinal(), host);
    parts.model->enable_expert_parallel(
        *ep, {.num_redundant_experts = config.num_redundant_experts, .enable_eplb = config.enable_eplb,
              .eplb_window_size = config.eplb_window_size, .eplb_step_interval = config.eplb_step_interval,
              .device_exchange = std::move(a2a)});
  }
  rt.engine = make_engine(config, env, std::move(parts));
}
}  // namespace

RankRuntime::~RankRuntime() {
  driver.reset();  // the shutdown round: workers leave their loops
  if (cp && cp->rank() == 0) {  // a CP group's leader (rank 0, or a data-parallel worker's)
    try {
      model::ds::stop_context_parallel_helpers(*cp);  // the helpers leave theirs
    } catch (const std::exception& e) {
      DI_WARN("context-parallel shutdown: ", e.what());
    }
  }
  engine.reset();
  cp.reset();
  ep_device_group.reset();
  ep_group.reset();
  leaders.reset();
  cp_group.reset();
  world.reset();
  if (workers && !workers->wait(std::chrono::seconds(30)))
    DI_WARN("data-parallel workers did not exit within 30 s of shutdown; killing them");
  workers.reset();
}

bool ep_device_exchange(std::span<const EpSeat> seats) {
  for (size_t i = 0; i < seats.size(); ++i) {
    if (!seats[i].capable) return false;
    for (size_t j = 0; j < i; ++j)
      if (seats[j].host == seats[i].host && seats[j].device == seats[i].device) return false;
  }
  return !seats.empty();
}

parallel::ParallelConfig parallel_config(const LLMConfig& config, const EnvConfig& env) {
  // Under context parallelism the data-parallel layout counts the CP groups (their leaders); the
  // experts' group, if any, is each CP group (cp_shards_experts).
  const int ep = config.context_parallel_size > 1 ? 1 : config.expert_parallel_size;
  parallel::ParallelConfig pc{.data_parallel_size = config.data_parallel_size,
                              .expert_parallel_size = ep > 0 ? ep : config.data_parallel_size};
  pc.validate();
  if (config.context_parallel_size > 1) {
    // GPU ranks split the attention core as CPU ranks do (its rows gathered through the host
    // group); the experts sharded over the CP group are built on the CPU backend only.
    if (!runs_on_cpu(env) && cp_shards_experts(config))
      DI_THROW(InvalidArgument, "LLMConfig.context_parallel_size=", config.context_parallel_size,
               " with expert_parallel_size=", config.expert_parallel_size,
               ": context parallelism with experts sharded over its group runs on the CPU backend only "
               "(accelerator=\"cpu\") in this version; on GPU ranks use expert_parallel_size 0 or 1");
    if (!parallel::have_gloo())
      DI_THROW(InvalidArgument, "LLMConfig.context_parallel_size=", config.context_parallel_size,
               ": this build has no gloo (libgloo-dev), which the ranks' group needs");
  }
  if (pc.is_parallel() && !parallel::have_gloo())
    DI_THROW(InvalidArgument, "LLMConfig.data_parallel_size=", pc.data_parallel_size,
             ": this build has no gloo (libgloo-dev), which the ranks' groups need");
  return pc;
}

std::unique_ptr<RankRuntime> start_driver(const LLMConfig& config, const EnvConfig& env,
                                          const std::optional<parallel::RankEnv>& launched) {
  parallel_config(config, env);  // refuse a bad layout before starting anything
  auto rt = std::make_unique<RankRuntime>();
  rt->world_size = world_of(config);
  std::string dir, host = "127.0.0.1";
  if (launched) {
    if (launched->world_size != rt->world_size)
      DI_THROW(InvalidArgument, "LLMConfig.data_parallel_size=", config.data_parallel_size, " context_parallel_size=",
               config.context_parallel_size, ": ", rt->world_size, " ranks, but the launcher (", launched->source,
               ") started ", launched->world_size);
    DI_CHECK(launched->rank == 0, "start_driver on rank ", launched->rank);
    dir = launched->rendezvous_dir, host = launched->host;
  } else {
    rt->dir = std::make_unique<parallel::RendezvousDir>();
    dir = rt->dir->path();
    parallel::WireWriter w;
    put(w, config);
    write_file(dir + "/" + kConfigFile, std::string(w.bytes().begin(), w.bytes().end()));
    rt->workers = std::make_unique<parallel::WorkerProcesses>(parallel::WorkerLaunch{
        .command = worker_command(config), .world_size = rt->world_size, .rendezvous_dir = dir});
    DI_INFO("data-parallel: started ", rt->world_size - 1, " worker rank(s), rendezvous ", dir);
  }
  // The workers load theirs meanwhile. GPU ranks: rank r on device local_rank mod visible devices.
  LoadedParts parts = load_parts(config, env, launched ? launched->local_rank : 0, expert_shard_for(config, env, 0));
  if (rt->workers) wait_workers_ready(dir, *rt->workers, rt->world_size);
  connect(*rt, config, env, std::move(parts), dir, host);
  if (config.context_parallel_size <= 1) rt->driver = std::make_unique<Driver>(*rt->engine, *rt->world);
  else if (rt->leaders) rt->driver = std::make_unique<Driver>(*rt->engine, *rt->leaders);
  return rt;
}

void serve_worker(const parallel::RankEnv& launched, const LLMConfig* given) {
  DI_CHECK(launched.rank > 0, "serve_worker on rank 0");
  const std::string& dir = launched.rendezvous_dir;
  try {
    LLMConfig config;
    if (given) {
      config = *given;
    } else {
      const std::string bytes = read_file(dir + "/" + kConfigFile);
      parallel::WireReader r(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                             "the LLM config rank 0 wrote");
      config = get_llm_config(r);
      r.expect_done();
    }
    validate_llm_config(config);
    const EnvConfig env = resolve_env(config);
    RankRuntime rt;
    rt.rank = launched.rank, rt.world_size = launched.world_size;
    LoadedParts parts = load_parts(config, env, launched.local_rank, expert_shard_for(config, env, launched.rank));
    if (!given) write_file(ready_file(dir, launched.rank), "");
    connect(rt, config, env, std::move(parts), dir, launched.host);
    if (rt.cp && rt.cp->rank() > 0) model::ds::serve_context_parallel_helper(*rt.cp_model, *rt.cp);
    else RankLoop(*rt.engine, rt.leaders ? *rt.leaders : *rt.world).serve();
  } catch (const std::exception& e) {
    if (!given) {
      try {
        write_file(error_file(dir, launched.rank), e.what());
      } catch (...) {
      }
    }
    throw;
  }
}

int rank_worker_main() {
  try {
    const std::optional<parallel::RankEnv> env = parallel::RankEnv::from_environment();
    if (!env || env->rank == 0)
      DI_THROW(InvalidArgument, "rank-worker: DEEPINFER_RANK (>= 1), DEEPINFER_WORLD_SIZE and DEEPINFER_RENDEZVOUS_DIR "
                                "must be set (the parallel LLM's rank 0 starts its workers with them)");
    serve_worker(*env, nullptr);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer rank-worker: %s\n", e.what());
    return 1;
  }
}

}  // namespace deepinfer::engine::dp
