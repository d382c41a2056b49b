// See dp_engine.h.
#include "engine/dp/dp_engine.h"

#include <tuple>

#include "core/check.h"
#include "core/logging.h"
#include "engine/dp/codec.h"

namespace deepinfer::engine::dp {
namespace {
using parallel::WireReader;
using parallel::WireWriter;

// Prompt tokens a request will add to its rank, known before it is tokenized there.
int64_t prompt_estimate(const PromptInput& p) {
  return p.is_token_ids ? int64_t(p.token_ids.size()) : int64_t(p.text.size()) / 4 + 1;
}

void put_load(WireWriter& w, const RankLoad& l) {
  for (int64_t v : {l.sched.running_seqs, l.sched.waiting_seqs, l.sched.running_tokens, l.sched.waiting_tokens,
                    l.kv_blocks_free, l.kv_blocks_total})
    w.put<int64_t>(v);
  w.put_bool(l.unfinished);
}

RankLoad get_load(WireReader& r) {
  RankLoad l;
  for (int64_t* v : {&l.sched.running_seqs, &l.sched.waiting_seqs, &l.sched.running_tokens, &l.sched.waiting_tokens,
                     &l.kv_blocks_free, &l.kv_blocks_total})
    *v = r.get<int64_t>("rank load");
  l.unfinished = r.get_bool("rank unfinished");
  return l;
}

RequestOutput error_output(const NewRequest& n, const std::string& message) {
  RequestOutput o;
  o.request_id = n.id;
  o.prompt = n.prompt.is_token_ids ? "" : n.prompt.text;
  o.prompt_token_ids = n.prompt.token_ids;
  o.finished = true;
  o.error = message;
  o.metrics.arrival_time = n.arrival;
  return o;
}

// The final output of a request that never reached a rank (aborted while queued here).
RequestOutput aborted_output(const NewRequest& n) {
  RequestOutput o = error_output(n, "");
  o.outputs.resize(size_t(std::max(n.params.n, 1)));
  for (size_t i = 0; i < o.outputs.size(); ++i) o.outputs[i].index = int(i), o.outputs[i].finish_reason = "abort";
  return o;
}
}  // namespace

RankLoad rank_load(const Engine& engine) {
  return {.sched = engine.scheduler().load(), .kv_blocks_free = engine.cache().num_free_blocks(),
          .kv_blocks_total = engine.cache().geometry().num_blocks, .unfinished = engine.has_unfinished()};
}

int pick_rank(std::span<const RankLoad> loads, std::span<const int64_t> pending) {
  if (loads.empty() || loads.size() != pending.size())
    DI_THROW(InvalidArgument, "pick_rank: ", loads.size(), " rank loads, ", pending.size(), " pending counts");
  int best = 0;
  auto key = [&](size_t r) {
    const RankLoad& l = loads[r];
    // KV usage as a fraction, compared exactly: used_a * total_b vs used_b * total_a.
    return std::make_tuple(l.work() + pending[r], l.kv_blocks_total - l.kv_blocks_free, l.kv_blocks_total);
  };
  for (size_t r = 1; r < loads.size(); ++r) {
    const auto [wa, ua, ta] = key(r);
    const auto [wb, ub, tb] = key(size_t(best));
    if (wa != wb) {
      if (wa < wb) best = int(r);
      continue;
    }
    if (ua * std::max<int64_t>(tb, 1) < ub * std::max<int64_t>(ta, 1)) best = int(r);
  }
  return best;
}

void put(WireWriter& w, const Commands& c) {
  w.put_bool(c.shutdown);
  w.put<uint64_t>(c.add.size());
  for (const NewRequest& n : c.add) {
    w.put<int32_t>(n.rank);
    w.put_str(n.id);
    w.put<double>(n.arrival);
    put(w, n.prompt);
    put(w, n.params);
  }
  w.put<uint64_t>(c.abort.size());
  for (const auto& [rank, id] : c.abort) w.put<int32_t>(rank), w.put_str(id);
}

Commands get_commands(WireReader& r) {
  Commands c;
  c.shutdown = r.get_bool("shutdown");
  const uint64_t n = r.count(4 + 8 + 8, "new requests");
  for (uint64_t i = 0; i < n; ++i) {
    NewRequest q;
    q.rank = r.get<int32_t>("request rank");
    q.id = r.get_str("request id");
    q.arrival = r.get<double>("request arrival");
    q.prompt = get_prompt(r);
    q.params = get_sampling_params(r);
    c.add.push_back(std::move(q));
  }
  const uint64_t na = r.count(4 + 8, "aborts");
  for (uint64_t i = 0; i < na; ++i) {
    const int32_t rank = r.get<int32_t>("abort rank");
    c.abort.emplace_back(rank, r.get_str("abort id"));
  }
  return c;
}

void put(WireWriter& w, const Report& rep) {
  put_load(w, rep.load);
  w.put<uint64_t>(rep.outputs.size());
  for (const RequestOutput& o : rep.outputs) put(w, o);
}

Report get_report(WireReader& r) {
  Report rep;
  rep.load = get_load(r);
  const uint64_t n = r.count(8, "outputs");
  for (uint64_t i = 0; i < n; ++i) rep.outputs.push_back(get_request_output(r));
  return rep;
}

// ---- RankLoop ----

RankLoop::RankLoop(Engine& engine, parallel::ProcessGroup& world) : engine_(engine), world_(world) {}

std::optional<std::vector<Report>> RankLoop::round(const Commands* commands) {
  const int me = world_.rank();
  DI_CHECK((me == 0) == (commands != nullptr), "data-parallel round: rank ", me,
           commands ? " passed commands (only rank 0 does)" : " has no commands");
  std::vector<uint8_t> msg;
  if (commands) {
    WireWriter w;
    put(w, *commands);
    msg = w.take();
  }
  msg = parallel::broadcast_bytes(world_, std::move(msg), 0);
  WireReader rd(msg, "data-parallel commands from rank 0");
  const Commands cmd = get_commands(rd);
  rd.expect_done();
  if (cmd.shutdown) return std::nullopt;
  ++rounds_;
  Report mine;
  for (const NewRequest& n : cmd.add) {
    if (n.rank != me) continue;
    try {
      engine_.add_request(n.id, n.prompt, n.params, n.arrival);
    } catch (const Error& e) {
      // This request fails alone; the round goes on for every rank.
      mine.outputs.push_back(error_output(n, e.what()));
    }
  }
  for (const auto& [rank, id] : cmd.abort)
    if (rank == me)
      for (RequestOutput& o : engine_.abort(id)) mine.outputs.push_back(std::move(o));
  // Always one step, so that every rank's forward joins the same collectives.
  for (RequestOutput& o : engine_.step()) mine.outputs.push_back(std::move(o));
  mine.load = rank_load(engine_);
  WireWriter w;
  put(w, mine);
  std::vector<std::vector<uint8_t>> all = parallel::all_gather_bytes(world_, w.bytes());
  std::vector<Report> reports;
  reports.reserve(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    WireReader rr(all[r], detail::str_cat("data-parallel report of rank ", r));
    reports.push_back(get_report(rr));
    rr.expect_done();
  }
  return reports;
}

void RankLoop::serve() {
  DI_CHECK(world_.rank() != 0, "rank 0 drives the rounds; it does not serve them");
  while (round(nullptr)) {
  }
}

// ---- Driver ----

Driver::Driver(Engine& local, parallel::ProcessGroup& world)
    : local_(local), world_(world), loop_(local, world), loads_(size_t(world.size())), placed_(size_t(world.size()), 0) {
  DI_CHECK(world_.rank() == 0, "the data-parallel driver is rank 0, not ", world_.rank());
  for (RankLoad& l : loads_) l = rank_load(local_);  // every rank starts like this one: empty
}

Driver::~Driver() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    DI_WARN("data-parallel shutdown: ", e.what());
  }
}

void Driver::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  Commands c;
  c.shutdown = true;
  loop_.round(&c);
}

void Driver::add_request(const std::string& id, const PromptInput& prompt, const SamplingParams& params,
                         double arrival) {
  if (stopped_) DI_THROW(InvalidArgument, "the data-parallel engine was shut down");
  if (where_.count(id)) DI_THROW(InvalidArgument, "request id '", id, "' is already running");
  for (const NewRequest& n : next_.add)
    if (n.id == id) DI_THROW(InvalidArgument, "request id '", id, "' is already running");
  params.validate(local_.model().vocab_size());
  if (prompt.is_token_ids ? prompt.token_ids.empty() : prompt.text.empty())
    DI_THROW(InvalidArgument, "request '", id, "': prompt is empty");
  std::vector<int64_t> pending(loads_.size(), 0);
  for (const NewRequest& n : next_.add) pending[size_t(n.rank)] += prompt_estimate(n.prompt);
  const int rank = pick_rank(loads_, pending);
  next_.add.push_back({.rank = rank, .id = id, .arrival = arrival, .prompt = prompt, .params = params});
}

std::vector<RequestOutput> Driver::step() {
  if (stopped_) DI_THROW(InvalidArgument, "the data-parallel engine was shut down");
  Commands c = std::move(next_);
  next_ = {};
  for (const NewRequest& n : c.add) where_[n.id] = n.rank, placed_[size_t(n.rank)]++;
  std::optional<std::vector<Report>> reports = loop_.round(&c);
  DI_CHECK(reports.has_value(), "data-parallel round ended the engine");
  std::vector<RequestOutput> out;
  for (size_t r = 0; r < reports->size(); ++r) {
    Report& rep = (*reports)[r];
    loads_[r] = rep.load;
    for (RequestOutput& o : rep.outputs) {
      if (o.finished) where_.erase(o.request_id);
      out.push_back(std::move(o));
    }
  }
  return out;
}

std::vector<RequestOutput> Driver::abort(const std::string& id) {
  for (size_t i = 0; i < next_.add.size(); ++i)
    if (next_.add[i].id == id) {
      RequestOutput o = aborted_output(next_.add[i]);
      next_.add.erase(next_.add.begin() + int64_t(i));
      return {o};
    }
  auto it = where_.find(id);
  if (it != where_.end()) next_.abort.emplace_back(it->second, id);
  return {};
}

bool Driver::has_unfinished() const {
  if (!next_.add.empty() || !next_.abort.empty()) return true;
  for (const RankLoad& l : loads_)
    if (l.unfinished) return true;
  return false;
}

}  // namespace deepinfer::engine::dp
