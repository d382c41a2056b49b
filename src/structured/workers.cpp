// Worker threads for structured outputs (include/deepinfer/structured.h, StructuredWorkers):
// grammar compilation off the caller's thread, and one batch's token masks filled in parallel.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "deepinfer/structured.h"

namespace deepinfer::structured {

struct StructuredWorkers::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool stop = false;
  std::atomic<bool> cancel{false};  // set on destruction: a running precompute stops
  MaskPrecompute precompute;
  std::vector<std::thread> threads;

  void loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stopping, nothing left
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
    }
  }
  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(f));
    }
    cv.notify_one();
  }
};

StructuredWorkers::StructuredWorkers(int threads, MaskPrecompute precompute) : impl_(std::make_unique<Impl>()) {
  DI_CHECK(threads >= 1 && threads <= 256, "StructuredWorkers needs 1..256 threads, got ", threads);
  if (!(precompute.time_budget_ms <= 60000) || precompute.max_cache_bytes < 0)
    DI_THROW(InvalidArgument, "StructuredWorkers: MaskPrecompute needs time_budget_ms <= 60000 and max_cache_bytes >= 0, got ",
             precompute.time_budget_ms, " ms and ", precompute.max_cache_bytes, " bytes");
  impl_->precompute = precompute;
  for (int i = 0; i < threads; ++i) impl_->threads.emplace_back([this] { impl_->loop(); });
}

StructuredWorkers::~StructuredWorkers() {
  impl_->cancel = true;
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
    std::promise<std::shared_ptr<const CompiledGrammar>> p;
    p.set_value(std::move(g));
    return p.get_future().share();
  }
  auto task = std::make_shared<std::packaged_task<std::shared_ptr<const CompiledGrammar>()>>(
      [&compiler, args = std::move(so_args_json)] { return compiler.compile(args); });
  std::shared_future<std::shared_ptr<const CompiledGrammar>> f = task->get_future().share();
  // The precompute runs on this worker right after the compile, once the future is ready (the
  // request can be admitted meanwhile: its first mask needs the prefill first).
  impl_->post([this, task, f] {
    (*task)();
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    try {
      run_precompute(f.get());
    } catch (...) {  // the compile's error: the request gets it through the future
    }
  });
  return f;
}

void StructuredWorkers::run_precompute(const std::shared_ptr<const CompiledGrammar>& g) {
  if (g && impl_->precompute.time_budget_ms > 0 && !impl_->cancel) g->precompute_masks(impl_->precompute, &impl_->cancel);
}

void StructuredWorkers::precompute_async(const std::shared_ptr<const CompiledGrammar>& g) {
  if (!g || impl_->precompute.time_budget_ms <= 0) return;
  impl_->post([this, w = std::weak_ptr<const CompiledGrammar>(g)] {
    if (auto g = w.lock()) run_precompute(g);
  });
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
