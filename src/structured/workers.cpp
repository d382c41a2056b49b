// Worker threads for structured outputs (include/deepinfer/structured.h, StructuredWorkers):
// grammar compilation off the caller's thread, and one batch's token masks filled in parallel.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "deepinfer/structured.h"

namespace deepinfer::structured {

struct StructuredWorkers::Impl {
  std::mutex mu;
  std::condition_variable cv;
  // Two queues: compiles and mask helpers first, precomputes only when none waits. A request's
  // add_request waits for its compile (up to EngineConfig::grammar_compile_wait_s) and a step
  // for its mask helpers; queued behind earlier requests' precomputes (50 ms each on one worker)
  // both waited: bench-structured, 16 requests on one worker, add_request 431 ms in all.
  std::deque<std::function<void()>> queue, background;
  bool stop = false;
  std::atomic<bool> cancel{false};  // set on destruction: a running precompute stops
  // A running precompute's stop flag: set on destruction and while urgent work waits; the
  // precompute then goes back to the background queue with what is left of its time budget.
  std::atomic<bool> yield{false};
  MaskPrecompute precompute;
  std::vector<std::thread> threads;

  // The precompute ledger (MaskPrecompute::max_total_bytes): one entry per grammar precomputed,
  // most recently precomputed or requested first, with its cache bytes as measured when its
  // last precompute ended. Grammars dropped by everyone (evicted from the compiler's cache,
  // their requests done) freed their caches themselves: pruned.
  struct Entry {
    std::weak_ptr<const CompiledGrammar> g;
    const CompiledGrammar* key;
    int64_t bytes = 0;
    int running = 0;  // precomputes of it in flight: not released under them
  };
  std::mutex ledger_mu;
  std::list<Entry> lru;
  int64_t ledger_bytes = 0;
  StructuredWorkers::PrecomputeStats stats;

  // g's live entry or lru.end() (a dead one at the same address is another grammar's).
  // Caller holds ledger_mu; a linear scan: at most the compiler's cached grammars.
  std::list<Entry>::iterator find(const CompiledGrammar* g) {
    auto it = lru.begin();
    while (it != lru.end() && (it->key != g || it->g.expired())) ++it;
    return it;
  }
  // The entry of g, moved to the front (created if missing). Caller holds ledger_mu.
  std::list<Entry>::iterator touch(const std::shared_ptr<const CompiledGrammar>& g) {
    if (auto it = find(g.get()); it != lru.end()) lru.splice(lru.begin(), lru, it);
    else lru.push_front({g, g.get(), 0, 0});
    return lru.begin();
  }
  // Drops dead entries, then releases the least recently used live ones not being precomputed
  // until the ledger is under the cap. Caller holds ledger_mu (a release takes the grammar's
  // own cache locks only, never this one).
  void make_room() {
    for (auto it = lru.begin(); it != lru.end();)
      if (it->g.expired() && it->running == 0) {
        ledger_bytes -= it->bytes;
        it = lru.erase(it);
      } else {
        ++it;
      }
    for (auto it = lru.end(); ledger_bytes > precompute.max_total_bytes && it != lru.begin();) {
      --it;
      if (it->running > 0) continue;
      if (auto g = it->g.lock()) g->release_mask_caches();
      ledger_bytes -= it->bytes;
      ++stats.released;
      it = lru.erase(it);
    }
  }

  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty() || !background.empty(); });
        std::deque<std::function<void()>>& q = queue.empty() ? background : queue;
        if (q.empty()) return;  // stopping, nothing left
        task = std::move(q.front());
        q.pop_front();
        if (queue.empty()) yield = cancel.load();
      }
      task();
    }
  }
  void post(std::function<void()> f, bool in_background = false) {
    {
      std::lock_guard<std::mutex> lock(mu);
      (in_background ? background : queue).push_back(std::move(f));
      if (!in_background) yield = true;
    }
    cv.notify_one();
  }
};

StructuredWorkers::StructuredWorkers(int threads, MaskPrecompute precompute) : impl_(std::make_unique<Impl>()) {
  DI_CHECK(threads >= 1 && threads <= 256, "StructuredWorkers needs 1..256 threads, got ", threads);
  if (!(precompute.time_budget_ms <= 60000) || precompute.max_cache_bytes < 0 || precompute.max_total_bytes < 0)
    DI_THROW(InvalidArgument,
             "StructuredWorkers: MaskPrecompute needs time_budget_ms <= 60000, max_cache_bytes >= 0 and max_total_bytes >= 0, got ",
             precompute.time_budget_ms, " ms, ", precompute.max_cache_bytes, " and ", precompute.max_total_bytes, " bytes");
  impl_->precompute = precompute;
  for (int i = 0; i < threads; ++i) impl_->threads.emplace_back([this] { impl_->loop(); });
}

StructuredWorkers::~StructuredWorkers() {
  impl_->cancel = true;
  impl_->yield = true;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

int StructuredWorkers::num_threads() const { return static_cast<int>(impl_->threads.size()); }

std::shared_future<std::shared_ptr<const CompiledGrammar>> StructuredWorkers::compile_async(GrammarCompiler& compiler,
                                                                                          std::string so_args_json) {
  // Already compiled (a server compiles a request's grammar on its own thread first): ready now,
  // not queued behind another compile.
  if (auto g = compiler.find_cached(so_args_json)) {
    // A new user of a grammar: most recently used in the ledger, precomputed again if the cap
    // released its caches (or it never was: compiled by compile()).
    bool known = false;
    {
      std::lock_guard<std::mutex> lock(impl_->ledger_mu);
      if ((known = impl_->find(g.get()) != impl_->lru.end())) impl_->touch(g);
    }
    if (!known) precompute_async(g);
    std::promise<std::shared_ptr<const CompiledGrammar>> p;
    p.set_value(std::move(g));
    return p.get_future().share();
  }
  auto task = std::make_shared<std::packaged_task<std::shared_ptr<const CompiledGrammar>()>>(
      [&compiler, args = std::move(so_args_json)] { return compiler.compile(args); });
  std::shared_future<std::shared_ptr<const CompiledGrammar>> f = task->get_future().share();
  // The precompute is queued once the future is ready (the request can be admitted meanwhile:
  // its first mask needs the prefill first), behind any compile or mask helper.
  impl_->post([this, task, f] {
    (*task)();
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    try {
      precompute_async(f.get());
    } catch (...) {  // the compile's error: the request gets it through the future
    }
  });
  return f;
}

void StructuredWorkers::run_precompute(const std::shared_ptr<const CompiledGrammar>& g, double budget_ms) {
  Impl& m = *impl_;
  if (!g || budget_ms <= 0 || m.cancel) return;
  MaskPrecompute opts = m.precompute;
  opts.time_budget_ms = budget_ms;
  // One grammar never holds more than the whole cap. Nothing is reserved up front: reserving
  // a full budget released every other grammar whenever the cap was below a few budgets; so
  // while precomputes run the ledger may exceed the cap by their budgets, and each settles it
  // when it ends (older grammars released, least recently used first).
  opts.max_cache_bytes = std::min(opts.max_cache_bytes, opts.max_total_bytes);
  {
    std::lock_guard<std::mutex> lock(m.ledger_mu);
    ++m.touch(g)->running;
    if (opts.max_cache_bytes <= 0) ++m.stats.skipped;
  }
  MaskPrecomputeResult r;
  bool failed = false;
  if (opts.max_cache_bytes > 0) {
    try {
      r = g->precompute_masks(opts, &m.yield);
    } catch (...) {  // a cache; the masks compute what they need themselves
      failed = true;
    }
  }
  // Stopped for urgent work (neither budget spent): the rest later, from the start again
  // (the entries filled so far are found at once).
  const double left = budget_ms - r.ms;
  const bool again = opts.max_cache_bytes > 0 && !failed && !r.complete && !m.cancel && left >= 1 && r.bytes < opts.max_cache_bytes;
  if (again)
    m.post([this, w = std::weak_ptr<const CompiledGrammar>(g), left] {
      if (auto g = w.lock()) run_precompute(g, left);
    }, true);
  // Measured, not the precompute's own count: it stops one entry past its budget, counts no
  // subtree results, and mask calls may have filled entries meanwhile.
  const int64_t now = g->mask_cache_bytes();
  std::lock_guard<std::mutex> lock(m.ledger_mu);
  auto e = m.touch(g);
  m.ledger_bytes += now - e->bytes;
  e->bytes = now;
  --e->running;
  if (!again) ++m.stats.finished;
  m.make_room();
}

StructuredWorkers::PrecomputeStats StructuredWorkers::precompute_stats() const {
  std::lock_guard<std::mutex> lock(impl_->ledger_mu);
  PrecomputeStats s = impl_->stats;
  s.bytes = impl_->ledger_bytes;
  for (const Impl::Entry& e : impl_->lru) {
    s.grammars += e.g.expired() ? 0 : 1;
    s.running += e.running;
  }
  return s;
}

void StructuredWorkers::precompute_async(const std::shared_ptr<const CompiledGrammar>& g) {
  if (!g || impl_->precompute.time_budget_ms <= 0) return;
  impl_->post([this, w = std::weak_ptr<const CompiledGrammar>(g)] {
    if (auto g = w.lock()) run_precompute(g, impl_->precompute.time_budget_ms);
  }, true);
}

void StructuredWorkers::fill_next_token_bitmasks(std::span<GrammarMatcher* const> matchers, std::span<int32_t> words,
                                                 size_t row_words) {
  if (words.size() < matchers.size() * row_words)
    DI_THROW(InvalidArgument, "bitmask batch has ", words.size(), " words, need ", matchers.size() * row_words);
  std::vector<MaskJob> jobs(matchers.size());
  for (size_t i = 0; i < matchers.size(); ++i)
    jobs[i] = {matchers[i], {}, words.subspan(i * row_words, row_words), row_words, 0};
  fill_bitmasks(jobs);
}

void StructuredWorkers::fill_bitmasks(std::span<MaskJob> jobs) {
  for (const MaskJob& j : jobs)
    if (!j.matcher || j.words.size() < (j.draft.size() + 1) * j.row_words)
      DI_THROW(InvalidArgument, "mask job has ", j.words.size(), " words for ", j.draft.size() + 1, " rows of ",
               j.row_words, (j.matcher ? "" : " (and no matcher)"));
  // Jobs are handed out one at a time (masks differ a lot in cost). The caller works too and
  // waits only for helpers that did start: one queued behind a long compilation finds the
  // batch closed when it runs and returns at once, so a compile never delays a step.
  struct Batch {
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    int active = 0;
    bool closed = false;
    std::exception_ptr error;
    std::span<MaskJob> jobs;
    void work() {
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        MaskJob& j = jobs[i];
        try {
          if (j.draft.empty()) {
            j.matcher->fill_next_token_bitmask(j.words.first(j.row_words));
            j.filled = 1;
          } else {
            j.filled = j.matcher->fill_draft_bitmasks(j.draft, j.words, j.row_words);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
        }
      }
    }
  };
  auto b = std::make_shared<Batch>();
  b->jobs = jobs;
  const size_t helpers = std::min<size_t>(impl_->threads.size(), jobs.empty() ? 0 : jobs.size() - 1);
  for (size_t h = 0; h < helpers; ++h)
    impl_->post([b] {
      {
        std::lock_guard<std::mutex> lock(b->mu);
        if (b->closed) return;
        ++b->active;
      }
      b->work();
      std::lock_guard<std::mutex> lock(b->mu);
      if (--b->active == 0) b->cv.notify_all();
    });
  b->work();
  std::unique_lock<std::mutex> lock(b->mu);
  b->closed = true;
  b->cv.wait(lock, [&] { return b->active == 0; });
  if (b->error) std::rethrow_exception(b->error);
}

}  // namespace deepinfer::structured
