// The gloo process groups: every collective on 2-4 ranks (threads of this process, each with its
// own group, meeting through a FileStore directory), random sizes incl. zero, rank-order
// reductions, and failures: a peer that never comes is a timeout error, not a hang.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "deepinfer/error.h"
#include "parallel/gloo_group.h"
#include "parallel/launcher.h"
#include "parallel/process_group.h"
#include "parallel/topology.h"

namespace deepinfer::parallel {
namespace {

// Runs body(group) on `n` ranks, each a thread with its own gloo group; rethrows the first failure.
void on_ranks(int n, const std::function<void(ProcessGroup&)>& body, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  RendezvousDir dir;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = make_gloo_group({.rendezvous_dir = dir.path(), .name = "test", .rank = r, .size = n, .timeout = timeout});
        body(*pg);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Deterministic pseudo-random byte count rank `from` sends rank `to` (0 included).
int64_t pair_bytes(int from, int to, int salt) { return ((from * 7 + to * 13 + salt * 5) % 11) * 3; }
uint8_t pair_byte(int from, int to, int64_t i) { return uint8_t(from * 31 + to * 17 + i * 3 + 1); }

TEST(GlooGroup, AllToAllVariableSizes) {
  for (int n : {2, 3, 4})
    on_ranks(n, [n](ProcessGroup& pg) {
      for (int salt = 0; salt < 3; ++salt) {
        const int me = pg.rank();
        std::vector<int64_t> send(static_cast<size_t>(n)), expect_recv(static_cast<size_t>(n));
        std::vector<uint8_t> packed;
        for (int q = 0; q < n; ++q) {
          send[size_t(q)] = pair_bytes(me, q, salt);
          expect_recv[size_t(q)] = pair_bytes(q, me, salt);
          for (int64_t i = 0; i < send[size_t(q)]; ++i) packed.push_back(pair_byte(me, q, i));
        }
        std::vector<int64_t> recv = exchange_counts(pg, send);
        ASSERT_EQ(recv, expect_recv);
        int64_t total = 0;
        for (int64_t x : recv) total += x;
        std::vector<uint8_t> got(static_cast<size_t>(total));
        pg.all_to_all_v(packed.data(), send, got.data(), recv);
        int64_t off = 0;
        for (int q = 0; q < n; ++q)
          for (int64_t i = 0; i < recv[size_t(q)]; ++i) ASSERT_EQ(got[size_t(off++)], pair_byte(q, me, i)) << q << " " << i;
      }
    });
}

TEST(GlooGroup, GatherBroadcastReduce) {
  for (int n : {2, 3})
    on_ranks(n, [n](ProcessGroup& pg) {
      const int me = pg.rank();
      // all_gather_bytes: rank q's message is q+1 bytes of value q (rank 1 of 3 sends nothing).
      std::vector<uint8_t> mine(size_t(me == 1 ? 0 : me + 1), uint8_t(me));
      auto all = all_gather_bytes(pg, mine);
      ASSERT_EQ(int(all.size()), n);
      for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q)], std::vector<uint8_t>(size_t(q == 1 ? 0 : q + 1), uint8_t(q)));
      // broadcast from the last rank
      auto b = broadcast_bytes(pg, me == n - 1 ? std::vector<uint8_t>{9, 8, 7} : std::vector<uint8_t>{}, n - 1);
      EXPECT_EQ(b, (std::vector<uint8_t>{9, 8, 7}));
      // float sum in rank order: ((x0 + x1) + x2) exactly, on every rank
      std::vector<float> x = {1e8f * float(me + 1), 0.1f * float(me + 1), -3.5f};
      std::vector<float> expect(3, 0.f);
      for (int q = 0; q < n; ++q) {
        const float xs[3] = {1e8f * float(q + 1), 0.1f * float(q + 1), -3.5f};
        for (int i = 0; i < 3; ++i) expect[size_t(i)] = q == 0 ? xs[i] : expect[size_t(i)] + xs[i];
      }
      pg.all_reduce(x.data(), 3, ReduceType::kF32, ReduceOp::kSum);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(std::memcmp(&x[size_t(i)], &expect[size_t(i)], 4), 0);
      int64_t v[2] = {me, -me};
      pg.all_reduce(v, 2, ReduceType::kI64, ReduceOp::kMax);
      EXPECT_EQ(v[0], n - 1);
      EXPECT_EQ(v[1], 0);
      // reduce_scatter: block r of rank q holds q*10 + r
      std::vector<int64_t> blocks(size_t(2 * n));
      for (int r = 0; r < n; ++r) blocks[size_t(2 * r)] = me * 10 + r, blocks[size_t(2 * r + 1)] = 1;
      int64_t out[2];
      pg.reduce_scatter(blocks.data(), out, 2, ReduceType::kI64);
      EXPECT_EQ(out[0], 10 * (n * (n - 1) / 2) + n * me);
      EXPECT_EQ(out[1], n);
      pg.barrier();
      // all_to_all_bytes
      std::vector<std::vector<uint8_t>> to(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) to[size_t(q)].assign(size_t(q + me), uint8_t(me * 16 + q));
      auto from = all_to_all_bytes(pg, to);
      for (int q = 0; q < n; ++q) EXPECT_EQ(from[size_t(q)], std::vector<uint8_t>(size_t(q + me), uint8_t(q * 16 + me)));
    });
}

TEST(GlooGroup, MissingPeerIsATimeoutNotAHang) {
  RendezvousDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    make_gloo_group({.rendezvous_dir = dir.path(), .name = "lonely", .rank = 0, .size = 2,
                     .timeout = std::chrono::milliseconds(1500)});
    FAIL() << "rendezvous with an absent peer succeeded";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

TEST(GlooGroup, PeerThatStopsCallingTimesOut) {
  EXPECT_THROW(on_ranks(2, [](ProcessGroup& pg) {
    if (pg.rank() == 1) return;  // leaves (its group is destroyed) while rank 0 waits
    std::vector<uint8_t> b(16);
    pg.broadcast(b.data(), 16, 1);
  }, std::chrono::milliseconds(3000)), InternalError);
}

TEST(GlooGroup, BadArguments) {
  EXPECT_THROW(make_gloo_group({.rendezvous_dir = "/nonexistent/dir", .rank = 0, .size = 2}), InvalidArgument);
  RendezvousDir dir;
  EXPECT_THROW(make_gloo_group({.rendezvous_dir = dir.path(), .rank = 2, .size = 2}), InvalidArgument);
}

TEST(SingleRankGroup, CollectivesAreCopies) {
  auto pg = make_single_rank_group();
  std::vector<uint8_t> m = {1, 2, 3};
  EXPECT_EQ(all_gather_bytes(*pg, m)[0], m);
  EXPECT_EQ(all_to_all_bytes(*pg, {m})[0], m);
  EXPECT_EQ(broadcast_bytes(*pg, m, 0), m);
}

TEST(Topology, ValidatesAndPlaces) {
  ParallelConfig c{.data_parallel_size = 4, .expert_parallel_size = 2, .context_parallel_size = 4};
  c.validate();
  RankPlace p = place_rank(c, 3);
  EXPECT_EQ(p.ep_group, 1);
  EXPECT_EQ(p.ep_rank, 1);
  EXPECT_EQ(p.cp_group, 0);
  EXPECT_EQ(p.cp_rank, 3);
  EXPECT_THROW((ParallelConfig{.data_parallel_size = 4, .expert_parallel_size = 3}.validate()), InvalidArgument);
  EXPECT_THROW((ParallelConfig{.data_parallel_size = 0}.validate()), InvalidArgument);
  EXPECT_THROW((ParallelConfig{.data_parallel_size = 2}.validate_devices(true, 1)), InvalidArgument);
  (ParallelConfig{.data_parallel_size = 2}).validate_devices(false, 0);
}

TEST(RankEnv, FromLaunchers) {
  auto lookup = [](std::map<std::string, std::string> m) {
    return [m](const char* n) -> const char* {
      auto it = m.find(n);
      return it == m.end() ? nullptr : it->second.c_str();
    };
  };
  EXPECT_FALSE(RankEnv::from_lookup(lookup({})).has_value());
  auto e = RankEnv::from_lookup(lookup({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"DEEPINFER_RENDEZVOUS_DIR", "/x"}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->source, "torchrun");
  EXPECT_EQ(e->rank, 2);
  EXPECT_EQ(e->local_rank, 0);
  EXPECT_EQ(e->rendezvous_dir, "/x");
  auto m = RankEnv::from_lookup(lookup({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"DEEPINFER_RENDEZVOUS_DIR", "/y"}}));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->source, "mpi");
  EXPECT_EQ(m->local_rank, 1);
  EXPECT_THROW(RankEnv::from_lookup(lookup({{"RANK", "1"}, {"WORLD_SIZE", "2"}})), InvalidArgument);  // no rendezvous
  EXPECT_THROW(RankEnv::from_lookup(lookup({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"DEEPINFER_RENDEZVOUS_DIR", "/x"}})), InvalidArgument);
  EXPECT_THROW(RankEnv::from_lookup(lookup({{"DEEPINFER_RANK", "x"}, {"DEEPINFER_WORLD_SIZE", "2"}})), InvalidArgument);
  EXPECT_THROW(RankEnv::from_lookup(lookup({{"DEEPINFER_RANK", "0"}})), InvalidArgument);
}

TEST(Launcher, ReportsExitedWorkers) {
  RendezvousDir dir;
  WorkerProcesses w({.command = {"/bin/sh", "-c", "exit $((DEEPINFER_RANK + 2))"}, .world_size = 3,
                     .rendezvous_dir = dir.path()});
  EXPECT_EQ(w.num_workers(), 2);
  ASSERT_TRUE(w.wait(std::chrono::milliseconds(10000)));
  auto e = w.exited();
  ASSERT_TRUE(e);
  EXPECT_NE(e->find("rank 1"), std::string::npos) << *e;
  EXPECT_NE(e->find("status 3"), std::string::npos) << *e;
  EXPECT_THROW(WorkerProcesses({.command = {"/nonexistent/worker"}, .world_size = 2, .rendezvous_dir = dir.path()}),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::parallel
