// The data-parallel engine: one Engine per rank (its own requests, scheduler and cache: attention
// data parallelism), driven in lockstep by rank 0.
//
// A round: rank 0 (the Driver) broadcasts its commands (new requests, each with the rank chosen
// for it; aborts; or shutdown); every rank applies those for itself and runs one Engine::step(),
// also when it has nothing to run (its forward then only joins the expert-parallel exchanges,
// CausalLM::joins_collectives); then every rank's report (its outputs and load) is all-gathered.
// The ranks' MoE all-to-alls happen inside the step, in the same order on every rank, so one group
// carries the commands, the experts' traffic and the reports.
//
// Placement: a new request goes to the rank with the least work by the last reports (tokens in
// running sequences + prefill tokens waiting) plus what was sent to it since, ties to the lower KV
// usage, then the lower rank; never round-robin. A request a rank refuses (bad prompt, grammar
// error) comes back as an error output from that rank; the other requests run on.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "parallel/process_group.h"
#include "parallel/wire.h"

namespace deepinfer::engine::dp {

struct RankLoad {
  SchedulerLoad sched;
  int64_t kv_blocks_free = 0, kv_blocks_total = 0;
  bool unfinished = false;  // the rank's engine still holds requests
  int64_t work() const { return sched.running_tokens + sched.waiting_tokens; }
};
RankLoad rank_load(const Engine& engine);

// The rank for a request of `tokens` prompt tokens (see the header comment). `pending[r]`: tokens
// sent to rank r since its last report. Pure; InvalidArgument on an empty or mismatched input.
int pick_rank(std::span<const RankLoad> loads, std::span<const int64_t> pending);

struct NewRequest {
  int32_t rank = 0;
  std::string id;
  double arrival = 0;
  PromptInput prompt;
  SamplingParams params;
};
struct Commands {
  bool shutdown = false;
  std::vector<NewRequest> add;
  std::vector<std::pair<int32_t, std::string>> abort;  // (rank, request id)
};
struct Report {
  RankLoad load;
  std::vector<RequestOutput> outputs;
};

void put(parallel::WireWriter& w, const Commands& c);
Commands get_commands(parallel::WireReader& r);
void put(parallel::WireWriter& w, const Report& rep);
Report get_report(parallel::WireReader& r);

// Every rank's side of a round.
class RankLoop {
 public:
  RankLoop(Engine& engine, parallel::ProcessGroup& world);
  // Rank 0 passes its commands, the others nullptr. Every rank's report, in rank order, or
  // nullopt once rank 0 said shutdown.
  std::optional<std::vector<Report>> round(const Commands* commands);
  // Workers: rounds until shutdown.
  void serve();
  int64_t rounds() const { return rounds_; }

 private:
  Engine& engine_;
  parallel::ProcessGroup& world_;
  int64_t rounds_ = 0;
};

// Rank 0: what LLM drives instead of its Engine when data_parallel_size > 1.
class Driver {
 public:
  Driver(Engine& local, parallel::ProcessGroup& world);
  ~Driver();  // tells the workers to stop (best effort: a dead group is not an error here)

  // Cheap checks (sampling values, the LLM's maxima, an empty prompt) here; the rest on the rank
  // that gets the request, whose refusal comes back from the next step() as an error output.
  void add_request(const std::string& id, const PromptInput& prompt, const SamplingParams& params, double arrival);
  std::vector<RequestOutput> step();
  // A request still queued here ends at once (its output is returned); one on a rank is aborted
  // in the next round, whose outputs carry its final output.
  std::vector<RequestOutput> abort(const std::string& id);
  bool has_unfinished() const;
  void shutdown();

  const std::vector<RankLoad>& loads() const { return loads_; }
  const std::vector<int64_t>& requests_placed() const { return placed_; }  // per rank, since start

 private:
  Engine& local_;
  parallel::ProcessGroup& world_;
  RankLoop loop_;
  Commands next_;
  std::vector<RankLoad> loads_;
  std::vector<int64_t> placed_;
  std::unordered_map<std::string, int32_t> where_;  // unfinished request id -> its rank
  bool stopped_ = false;
};

}  // namespace deepinfer::engine::dp
