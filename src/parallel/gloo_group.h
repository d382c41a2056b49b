// Process groups between CPU ranks over gloo's TCP transport. Ranks meet through a rendezvous
// store: a directory every rank can reach (gloo's FileStore; one node, or several sharing a
// filesystem). Several groups may share one directory: each takes its own name.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "parallel/process_group.h"

namespace deepinfer::parallel {

struct GlooGroupOptions {
  std::string rendezvous_dir;     // the store's directory (created by the launcher)
  std::string name = "world";     // distinguishes groups sharing the directory
  int rank = 0, size = 1;
  std::string hostname = "127.0.0.1";  // address this rank listens on (GLOO_SOCKET_IFNAME-style choice left to the launcher)
  std::chrono::milliseconds timeout{600000};
};

// Connects the full mesh (blocks until every rank of the group has joined or `timeout` passed).
// Throws InternalError naming the store and group when rendezvous fails; InvalidArgument for
// rank/size out of range or a missing directory.
std::unique_ptr<ProcessGroup> make_gloo_group(const GlooGroupOptions& options);

bool have_gloo();  // this build links gloo
}  // namespace deepinfer::parallel
