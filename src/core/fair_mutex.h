// A mutex that hands the lock over in the order threads asked for it (a ticket lock on a condition
// variable). std::mutex is not fair: a thread that unlocks and at once locks again (LLM::generate's
// loop: step, unlock, poll for Ctrl-C, lock, step) usually wins against a waiter that the unlock
// only woke, so with three callers one of them could wait through dozens of other callers' steps
// (a Ctrl-C in the main thread took up to 2.45 s to be honoured with two other threads
// generating). Here every waiter gets the lock after at most one turn of each thread ahead of it.
// Meets the Lockable requirements (std::lock_guard, std::unique_lock).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace deepinfer {

class FairMutex {
 public:
  FairMutex() = default;
  FairMutex(const FairMutex&) = delete;
  FairMutex& operator=(const FairMutex&) = delete;

  void lock() {
    std::unique_lock<std::mutex> g(m_);
    const uint64_t ticket = next_++;
    cv_.wait(g, [&] { return serving_ == ticket; });
  }
  bool try_lock() {
    std::lock_guard<std::mutex> g(m_);
    if (serving_ != next_) return false;  // held, or others are queued ahead
    ++next_;
    return true;
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> g(m_);
      ++serving_;
    }
    cv_.notify_all();  // the next ticket's holder is one of the waiters; the others wait again
  }
  // Threads holding or waiting for the lock (tests, diagnostics).
  int64_t queued() const {
    std::lock_guard<std::mutex> g(m_);
    return int64_t(next_ - serving_);
  }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  uint64_t next_ = 0;     // the next ticket to hand out
  uint64_t serving_ = 0;  // the ticket that holds the lock (== next_: free)
};

}  // namespace deepinfer
