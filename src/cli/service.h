// What the long-running commands (`serve`, `router`) share: a stop on SIGINT / SIGTERM taken by
// the main thread with sigwait.
#pragma once
#include <csignal>
#include <cstdio>

namespace deepinfer::cli {

// Blocks SIGINT and SIGTERM in this thread before any other starts (threads inherit the mask, so
// only the main thread receives them, in wait_for_stop) and ignores SIGPIPE (a client that hangs
// up mid-response is a write error, not a crash).
inline sigset_t block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return sigs;
}

// Waits for SIGINT or SIGTERM and says which one stops `who`.
inline void wait_for_stop(const sigset_t& sigs, const char* who) {
  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "%s: %s, stopping\n", who, sig == SIGINT ? "SIGINT" : "SIGTERM");
}

}  // namespace deepinfer::cli
