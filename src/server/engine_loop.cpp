#include "server/engine_loop.h"

#include <algorithm>

#include "core/check.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "server/protocol.h"

namespace deepinfer::server {
EngineLoop::EngineLoop(std::unique_ptr<engine::Engine> engine, EngineLoopOptions options, ServerMetrics& metrics)
    : engine_(std::move(engine)), options_(options), metrics_(metrics) {
  DI_CHECK(engine_ != nullptr, "EngineLoop needs an engine");
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

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::admit(Submission& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= s.reserved;
  }
  try {
    engine_->add_request(s.request_id, PromptInput::from_token_ids(std::move(s.prompt_ids)), s.params,
                         engine::now_seconds());
  } catch (const Error& e) {
    s.sink->on_rejected(e.what(), dynamic_cast<const InternalError*>(&e) != nullptr);
    return;
  }
  s.sink->on_admitted();
  tracked_[s.request_id] = Tracked{std::move(s.sink), s.received_time, 0, 0};
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
  g.num_running = int64_t(s.num_running());
  g.num_waiting = int64_t(s.num_waiting());
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
      cv_.wait(lock, [&] { return stop_ || busy_ || !inbox_.empty() || !aborts_.empty(); });
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
