#include "server/engine_loop.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/check.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "server/kv_transport.h"
#include "server/protocol.h"

namespace deepinfer::server {
EngineLoop::EngineLoop(std::unique_ptr<engine::Engine> engine, EngineLoopOptions options, ServerMetrics& metrics)
    : engine_(std::move(engine)), options_(options), metrics_(metrics) {
  DI_CHECK(engine_ != nullptr, "EngineLoop needs an engine");
  if (options_.kv && options_.kv->is_decode())
    options_.kv->set_on_arrival([this] {
      std::lock_guard<std::mutex> lock(mu_);
      kv_arrived_ = true;
      cv_.notify_one();
    });
  publish();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() { stop(); }

bool EngineLoop::try_reserve(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || reserved_ + engine_waiting_ + n > options_.max_waiting) return false;
  reserved_ += n;
  return true;
}

void EngineLoop::release(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= n;
}

int64_t EngineLoop::num_waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_ + engine_waiting_;
}

void EngineLoop::submit(Submission s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      inbox_.push_back(std::move(s));
      cv_.notify_one();
      return;
    }
    reserved_ -= s.reserved;
  }
  s.sink->on_rejected("the server is shutting down", true);
}

void EngineLoop::abort(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(id);
  cv_.notify_one();
}

KvCounters EngineLoop::kv_counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_counters_;
}

void EngineLoop::stop() {
  if (options_.kv) options_.kv->set_on_arrival(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::admit(Submission& s) {
  if (!s.kv_recv_id.empty() && options_.kv && options_.kv->is_decode()) {
    std::optional<engine::KvBundle> b = options_.kv->take(s.kv_recv_id);
    if (!b) {
      parked_.push_back({std::move(s), engine::now_seconds() + options_.kv_wait_s});
      return;
    }
    int64_t n = -1;
    try {
      n = engine_->import_prefix(*b);
    } catch (const Error& e) {
      DI_WARN("server: KV transfer ", s.kv_recv_id, " refused, computing the prompt here: ", e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    kv_counters_.received++;
    if (n < 0) kv_counters_.import_failed++;
    else kv_counters_.imported_tokens += n;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= s.reserved;
  }
  std::vector<int32_t> kv_prompt;
  if (!s.kv_send_id.empty() && options_.kv && options_.kv->is_prefill()) kv_prompt = s.prompt_ids;
  try {
    engine_->add_request(s.request_id, PromptInput::from_token_ids(std::move(s.prompt_ids)), s.params,
                         engine::now_seconds());
  } catch (const Error& e) {
    s.sink->on_rejected(e.what(), dynamic_cast<const InternalError*>(&e) != nullptr);
    return;
  }
  s.sink->on_admitted();
  tracked_[s.request_id] = Tracked{std::move(s.sink), s.received_time, 0, 0, std::move(kv_prompt), s.kv_send_id, s.kv_send_to};
}

void EngineLoop::admit_parked(bool stopping, const std::vector<std::string>& aborts) {
  if (parked_.empty()) return;
  const double now = engine::now_seconds();
  std::vector<Parked> keep;
  std::vector<Submission> ready;
  for (Parked& p : parked_) {
    if (stopping) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        reserved_ -= p.s.reserved;
      }
      p.s.sink->on_rejected("the server is shutting down", true);
      continue;
    }
    if (std::find(aborts.begin(), aborts.end(), p.s.request_id) != aborts.end()) {
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ -= p.s.reserved;  // its client left before it ran: nothing to answer
      continue;
    }
    const bool due = now >= p.deadline;
    if (!due && !options_.kv->has(p.s.kv_recv_id)) {
      keep.push_back(std::move(p));
      continue;
    }
    if (due) {
      DI_WARN("server: KV transfer ", p.s.kv_recv_id, " did not arrive in ", options_.kv_wait_s,
              " s, computing the prompt here");
      std::lock_guard<std::mutex> lock(mu_);
      kv_counters_.timed_out++;
      p.s.kv_recv_id.clear();
    }
    ready.push_back(std::move(p.s));
  }
  parked_ = std::move(keep);
  for (Submission& s : ready) admit(s);  // its bundle is there (or it computes the prompt)
}

void EngineLoop::export_kv(Tracked& t, const RequestOutput& o) {
  bool sent = false;
  int64_t n = 0;
  try {
    // On the device when the pair moves payloads through CUDA IPC (kv_transport.h), else host bytes.
    engine::KvBundle b = engine_->export_prefix(t.kv_prompt, options_.kv->wants_device_bundle(t.kv_send_to));
    n = b.num_tokens();
    sent = options_.kv->send(t.kv_send_to, t.kv_send_id, std::move(b));
    if (!sent) DI_WARN("server: KV transfer ", t.kv_send_id, ": '", t.kv_send_to, "' is not a connected decode peer");
  } catch (const Error& e) {
    DI_WARN("server: KV export of ", o.request_id, " failed: ", e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (sent) {
    kv_counters_.sent++;
    kv_counters_.exported_tokens += n;
  } else {
    kv_counters_.send_failed++;
  }
}

void EngineLoop::deliver(std::vector<RequestOutput>&& outs) {
  const double now = engine::now_seconds();
  for (RequestOutput& o : outs) {
    auto it = tracked_.find(o.request_id);
    if (it == tracked_.end()) continue;
    Tracked& t = it->second;
    t.prompt_tokens = int64_t(o.prompt_token_ids.size());
    bool any = false;
    for (const CompletionOutput& c : o.outputs) any |= !c.token_ids.empty();
    if (any && t.first_token == 0) t.first_token = now;
    if (!o.finished) {
      t.sink->on_output(std::move(o));
      continue;
    }
    std::vector<std::string> reasons;
    for (const CompletionOutput& c : o.outputs) reasons.push_back(c.finish_reason);
    const int64_t gen = o.metrics.num_generation_tokens;
    // TPOT over the first choice's tokens (the n choices run side by side).
    const int64_t n0 = o.outputs.empty() ? 0 : int64_t(o.outputs[0].token_ids.size());
    const double span = o.metrics.last_token_time - o.metrics.first_token_time;
    metrics_.finished(reasons, t.prompt_tokens, gen, cached_prompt_tokens(o), t.first_token - t.received,
                      n0 > 1 ? span / double(n0 - 1) : 0.0, now - t.received, t.first_token > 0, n0 > 1);
    // Before the answer: the decode request the router sends next finds the bundle on its way.
    if (!t.kv_send_id.empty() && o.error.empty()) export_kv(t, o);
    std::shared_ptr<OutputSink> sink = std::move(t.sink);
    tracked_.erase(it);
    sink->on_output(std::move(o));
  }
}

void EngineLoop::fail_all(const std::string& why) {
  // A failed step leaves the engine's state unknown: end every request (their caches are
  // released by abort) and report the failure to each client.
  std::vector<std::string> ids;
  for (const auto& [id, t] : tracked_) ids.push_back(id);
  for (const std::string& id : ids) {
    try {
      engine_->abort(id);
    } catch (const std::exception& e) {
      DI_WARN("server: abort of ", id, " after a failed step failed too: ", e.what());
    }
    auto it = tracked_.find(id);
    RequestOutput o;
    o.request_id = id;
    o.finished = true;
    o.error = "engine step failed: " + why;
    std::shared_ptr<OutputSink> sink = std::move(it->second.sink);
    tracked_.erase(it);
    sink->on_output(std::move(o));
  }
}

void EngineLoop::publish() {
  EngineGauges g;
  const engine::Scheduler& s = engine_->scheduler();
  const engine::KVCacheManager& c = engine_->cache();
  const engine::SchedulerLoad load = s.load();
  g.num_running = load.running_seqs;
  g.num_waiting = load.waiting_seqs;
  g.running_tokens = load.running_tokens;
  g.waiting_tokens = load.waiting_tokens;
  g.kv_blocks_total = c.geometry().num_blocks;
  g.kv_blocks_free = c.num_free_blocks();
  g.kv_blocks_cached = c.num_cached_blocks();
  g.kv_slots_total = c.geometry().num_slots;
  g.kv_slots_free = c.num_free_slots();
  g.kv_usage = c.usage();
  g.num_steps = s.stats().num_steps;
  g.num_preemptions = s.stats().num_preemptions;
  g.num_draft_tokens = s.stats().num_draft_tokens;
  g.num_accepted_drafts = s.stats().num_accepted_drafts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    engine_waiting_ = g.num_waiting;
    busy_ = engine_->has_unfinished();
    g.num_queued = int64_t(inbox_.size());
  }
  metrics_.set_gauges(g);
}

void EngineLoop::run() {
  for (;;) {
    std::deque<Submission> subs;
    std::vector<std::string> aborts;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stop_ || busy_ || kv_arrived_ || !inbox_.empty() || !aborts_.empty(); };
      if (parked_.empty()) {
        cv_.wait(lock, ready);
      } else {
        double first = parked_.front().deadline;
        for (const Parked& p : parked_) first = std::min(first, p.deadline);
        cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, first - engine::now_seconds())), ready);
      }
      kv_arrived_ = false;
      subs.swap(inbox_);
      aborts.swap(aborts_);
      stopping = stop_;
    }
    for (Submission& s : subs) {
      if (stopping) {
        s.sink->on_rejected("the server is shutting down", true);
        continue;
      }
      admit(s);
    }
    admit_parked(stopping, aborts);
    if (stopping) {
      for (const auto& [id, t] : tracked_) aborts.push_back(id);
    }
    for (const std::string& id : aborts) deliver(engine_->abort(id));
    if (stopping) break;
    if (engine_->has_unfinished()) {
      try {
        deliver(engine_->step());
      } catch (const std::exception& e) {
        DI_WARN("server: engine step failed: ", e.what());
        fail_all(e.what());
      }
    }
    publish();
  }
  publish();
}

}  // namespace deepinfer::server
