#include "core/fair_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace deepinfer {
namespace {

void wait_until_queued(const FairMutex& mu, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  while (mu.queued() < n) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "threads never queued";
    std::this_thread::yield();
  }
}

// A thread that relocks in a loop (the pattern of LLM::generate's step loop) cannot overtake a
// thread that was already waiting: the waiter is served first, after zero of the greedy turns.
TEST(FairMutex, WaiterIsNotOvertakenByARelockingThread) {
  for (int round = 0; round < 20; ++round) {
    FairMutex mu;
    int greedy_turns = 0;  // guarded by mu
    int seen_by_waiter = -1;
    std::atomic<bool> stop{false};
    mu.lock();
    std::thread waiter([&] {
      std::lock_guard<FairMutex> g(mu);
      seen_by_waiter = greedy_turns;
    });
    wait_until_queued(mu, 2);  // the holder + the waiter
    std::thread greedy([&] {
      while (!stop.load()) {
        std::lock_guard<FairMutex> g(mu);
        ++greedy_turns;
      }
    });
    wait_until_queued(mu, 3);  // the greedy thread's first ticket comes after the waiter's
    mu.unlock();
    waiter.join();
    stop = true;
    greedy.join();
    EXPECT_EQ(seen_by_waiter, 0) << "round " << round;
  }
}

// Several threads queued one after another get the lock in that order.
TEST(FairMutex, ServesInArrivalOrder) {
  FairMutex mu;
  std::vector<int> order;  // guarded by mu
  mu.lock();
  std::vector<std::thread> ts;
  for (int i = 0; i < 7; ++i) {
    ts.emplace_back([&, i] {
      std::lock_guard<FairMutex> g(mu);
      order.push_back(i);
    });
    wait_until_queued(mu, i + 2);  // thread i holds its ticket before thread i + 1 starts
  }
  mu.unlock();
  for (auto& t : ts) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(FairMutex, TryLockRespectsTheQueue) {
  FairMutex mu;
  ASSERT_TRUE(mu.try_lock());
  EXPECT_FALSE(mu.try_lock());
  std::thread waiter([&] { std::lock_guard<FairMutex> g(mu); });
  wait_until_queued(mu, 2);
  mu.unlock();
  waiter.join();
  EXPECT_TRUE(mu.try_lock());  // free again and nobody queued
  mu.unlock();
  EXPECT_EQ(mu.queued(), 0);
}

// Mutual exclusion under contention: a non-atomic counter ends exact.
TEST(FairMutex, ExcludesUnderContention) {
  FairMutex mu;
  int64_t n = 0;
  std::vector<std::thread> ts;
  for (int i = 0; i < 5; ++i)
    ts.emplace_back([&] {
      for (int k = 0; k < 2000; ++k) {
        std::lock_guard<FairMutex> g(mu);
        ++n;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(n, 10000);
}

}  // namespace
}  // namespace deepinfer
