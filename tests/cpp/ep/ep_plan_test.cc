// Host side of the device expert-parallel exchange (model/deepseek/ep_plan.h): the route table,
// the plan's rules (local replica first, else the token-index replica; stable per destination),
// pack/unpack round trips in bf16 and f32 at odd sizes, W simulated ranks through the twins
// against one rank, and the twins against the host-staged ExpertParallel::dispatch over gloo.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ep_test_util.h"
#include "model/deepseek/ep_plan.h"
#include "model/deepseek/expert_parallel.h"
#if DEEPINFER_HAVE_GLOO
#include "parallel/gloo_group.h"
#include "parallel/launcher.h"
#endif

namespace deepinfer::model::ds {
namespace {

TEST(EpPlan, RouteTableAndRules) {
  std::mt19937 rng(7);
  for (int32_t W : {1, 2, 3, 5}) {
    const int32_t E = 11, S = (E + 3 + W - 1) / W;  // >= 3 redundant slots
    const parallel::ExpertPlacement L = test::random_placement(rng, E, W, S);
    for (int32_t r = 0; r < W; ++r) {
      const EpRouteTable t = make_route_table(L, r);
      const int64_t T = 37, K = 3;
      std::vector<int32_t> ids = test::random_ids(rng, L, T, K, {}, r);
      const EpPlan p = ep_plan_host(t, ids.data(), T, K);
      EXPECT_EQ(p.counts[size_t(W)], 0);
      std::vector<int64_t> start(size_t(W), 0), seen(size_t(W), 0);
      for (int32_t q = 1; q < W; ++q) start[size_t(q)] = start[size_t(q - 1)] + p.counts[size_t(q - 1)];
      for (int64_t i = 0; i < T * K; ++i) {
        const int32_t e = ids[size_t(i)], phys = p.dest[size_t(i)] * S + p.slot[size_t(i)];
        EXPECT_EQ(L.physical_to_logical[size_t(phys)], e) << "pair " << i;
        const std::vector<int32_t>& reps = L.logical_to_physical[size_t(e)];
        int32_t want = reps[size_t((i / K) % int64_t(reps.size()))];
        for (int32_t q : reps)
          if (q / S == r) { want = q; break; }
        EXPECT_EQ(phys, want) << "pair " << i;
        // Stable: the pairs of one destination fill its rows in pair order.
        const int32_t d = p.dest[size_t(i)];
        EXPECT_EQ(p.pos[size_t(i)], start[size_t(d)] + seen[size_t(d)]++) << "pair " << i;
      }
    }
  }
  EXPECT_THROW(make_route_table(test::random_placement(rng, 5, 2, 3), 2), InvalidArgument);
}

TEST(EpPlan, BadIdsAreCountedAndSkipped) {
  std::mt19937 rng(3);
  const parallel::ExpertPlacement L = test::random_placement(rng, 6, 2, 4);
  const EpRouteTable t = make_route_table(L, 0);
  const std::vector<int32_t> ids = {0, 6, 1, -1, 5};
  const EpPlan p = ep_plan_host(t, ids.data(), 5, 1);
  EXPECT_EQ(p.counts[2], 2);
  EXPECT_EQ(p.counts[0] + p.counts[1], 3);
  EXPECT_EQ(p.pos[1], -1);
  EXPECT_EQ(p.dest[3], -1);
}

TEST(EpPlan, RowBytesAndBadInput) {
  EXPECT_EQ(ep_row_bytes(1, DType::kBF16), 32);
  EXPECT_EQ(ep_row_bytes(8, DType::kBF16), 32);
  EXPECT_EQ(ep_row_bytes(9, DType::kF32), 16 + 48);
  EXPECT_THROW(ep_row_bytes(0, DType::kF32), InvalidArgument);
  EXPECT_THROW(ep_row_bytes(4, DType::kI32), InvalidArgument);
}

TEST(EpPlan, PackUnpackRoundTrip) {
  std::mt19937 rng(11);
  for (DType act : {DType::kBF16, DType::kF32})
    for (int64_t D : {1, 7, 33}) {
      const int32_t W = 3, E = 9, S = 4;
      const parallel::ExpertPlacement L = test::random_placement(rng, E, W, S);
      const int64_t T = 13, K = 2, ab = int64_t(dtype_bits(act) / 8);
      std::vector<uint8_t> h(size_t(T * D * ab));
      for (uint8_t& b : h) b = uint8_t(rng());
      const std::vector<float> w = test::random_floats(rng, T * K, 0.1f, 1.f);
      const std::vector<int32_t> ids = test::random_ids(rng, L, T, K, {}, 0);
      const EpRouteTable t0 = make_route_table(L, 0);
      const EpPlan p = ep_plan_host(t0, ids.data(), T, K);
      const int64_t rb = ep_row_bytes(D, act);
      std::vector<uint8_t> send(size_t(T * K * rb));
      ep_pack_host(p, h.data(), act, D, K, w.data(), send.data());
      // Unpack every destination's block as that rank would receive it (rank 0 the only sender).
      for (int32_t q = 0, row0 = 0; q < W; row0 += int32_t(p.counts[size_t(q)]), ++q) {
        const EpRouteTable tq = make_route_table(L, q);
        const int64_t m = p.counts[size_t(q)];
        std::vector<uint8_t> x(size_t(std::max<int64_t>(m * D * ab, 1)));
        std::vector<int32_t> logical(static_cast<size_t>(m));
        std::vector<float> wt(static_cast<size_t>(m));
        EXPECT_EQ(ep_unpack_host(tq, send.data() + row0 * rb, m, D, act, x.data(), logical.data(), wt.data()), 0);
        for (int64_t i = 0; i < T * K; ++i) {
          if (p.dest[size_t(i)] != q) continue;
          const int64_t j = p.pos[size_t(i)] - row0;
          EXPECT_EQ(logical[size_t(j)], ids[size_t(i)]);
          EXPECT_EQ(wt[size_t(j)], w[size_t(i)]);
          EXPECT_EQ(std::memcmp(x.data() + j * D * ab, h.data() + (i / K) * D * ab, size_t(D * ab)), 0);
        }
      }
      // A corrupted slot is reported, not read through.
      int32_t bad = S;
      std::memcpy(send.data(), &bad, 4);
      std::vector<uint8_t> x(size_t(D * ab));
      int32_t lg = 0;
      float wt = 0;
      EXPECT_EQ(ep_unpack_host(make_route_table(L, p.dest[0]), send.data(), 1, D, act, x.data(), &lg, &wt), 1);
      EXPECT_EQ(lg, -1);
    }
}

// The exchange of W ranks simulated with the twins: every rank's combined output equals one
// rank's (per-row expert function, sums in k order), incl. a rank with no tokens, a rank that
// receives nothing and a token whose k experts all live on one rank.
float expert_fn(float x, int32_t e, float w) { return w * x * (1.f + 0.125f * float(e)) + 0.001f * float(e); }

TEST(EpPlan, SimulatedRanksMatchOneRank) {
  std::mt19937 rng(5);
  for (int32_t W : {2, 3, 4}) {
    const int32_t E = 10, S = (E + 2 + W - 1) / W;
    const int64_t D = 5, K = 3;
    const parallel::ExpertPlacement L = test::random_placement(rng, E, W, S);
    const std::vector<int32_t> avoid = test::experts_on(L, 1);  // rank 1 has no tokens and receives nothing
    std::vector<int64_t> T(static_cast<size_t>(W));
    std::vector<std::vector<float>> h(static_cast<size_t>(W)), w(static_cast<size_t>(W));
    std::vector<std::vector<int32_t>> ids(static_cast<size_t>(W));
    std::vector<EpPlan> plan;
    std::vector<std::vector<uint8_t>> send(static_cast<size_t>(W));
    const int64_t rb = ep_row_bytes(D, DType::kF32);
    for (int32_t r = 0; r < W; ++r) {
      T[size_t(r)] = r == 1 ? 0 : 3 + 4 * r;
      h[size_t(r)] = test::random_floats(rng, T[size_t(r)] * D, -1.f, 1.f);
      w[size_t(r)] = test::random_floats(rng, T[size_t(r)] * K, 0.1f, 1.f);
      ids[size_t(r)] = test::random_ids(rng, L, T[size_t(r)], K, avoid, 0);
      plan.push_back(ep_plan_host(make_route_table(L, r), ids[size_t(r)].data(), T[size_t(r)], K));
      send[size_t(r)].resize(size_t(T[size_t(r)] * K * rb));
      ep_pack_host(plan.back(), h[size_t(r)].data(), DType::kF32, D, K, w[size_t(r)].data(), send[size_t(r)].data());
    }
    // Rank q's arrivals: sender 0's block for q, then sender 1's, ...; outputs go back likewise.
    std::vector<std::vector<float>> back(static_cast<size_t>(W));
    for (int32_t r = 0; r < W; ++r) back[size_t(r)].assign(size_t(T[size_t(r)] * K * D), 0.f);
    for (int32_t q = 0; q < W; ++q) {
      const EpRouteTable tq = make_route_table(L, q);
      int64_t received = 0;
      for (int32_t r = 0; r < W; ++r) {
        int64_t off = 0;
        for (int32_t x = 0; x < q; ++x) off += plan[size_t(r)].counts[size_t(x)];
        const int64_t m = plan[size_t(r)].counts[size_t(q)];
        received += m;
        std::vector<float> x(size_t(m * D));
        std::vector<int32_t> lg(static_cast<size_t>(m));
        std::vector<float> wt(static_cast<size_t>(m));
        ASSERT_EQ(ep_unpack_host(tq, send[size_t(r)].data() + off * rb, m, D, DType::kF32, x.data(), lg.data(), wt.data()), 0);
        for (int64_t j = 0; j < m; ++j)
          for (int64_t d = 0; d < D; ++d)
            back[size_t(r)][size_t((off + j) * D + d)] = expert_fn(x[size_t(j * D + d)], lg[size_t(j)], wt[size_t(j)]);
      }
      if (q == 1) { EXPECT_EQ(received, 0) << "W " << W; }
    }
    for (int32_t r = 0; r < W; ++r)
      for (int64_t t = 0; t < T[size_t(r)]; ++t)
        for (int64_t d = 0; d < D; ++d) {
          float one = 0.f, ep = 0.f;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t i = t * K + k;
            one += expert_fn(h[size_t(r)][size_t(t * D + d)], ids[size_t(r)][size_t(i)], w[size_t(r)][size_t(i)]);
            ep += back[size_t(r)][size_t(plan[size_t(r)].pos[size_t(i)] * D + d)];
          }
          ASSERT_EQ(std::memcmp(&one, &ep, 4), 0) << "W " << W << " rank " << r << " token " << t << " d " << d;
        }
  }
}

#if DEEPINFER_HAVE_GLOO
// The twins send what the host-staged ExpertParallel::dispatch sends: every rank receives the
// same rows (values, slots, weights) in the same order.
TEST(EpPlan, TwinsMatchHostStagedDispatch) {
  const int32_t W = 3, E = 8, S = 4;
  const int64_t D = 7, K = 2;
  std::mt19937 rng(9);
  const parallel::ExpertPlacement L = test::random_placement(rng, E, W, S);
  std::vector<std::vector<float>> h(static_cast<size_t>(W)), w(static_cast<size_t>(W));
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(W));
  std::vector<int64_t> T = {5, 0, 9};
  for (int32_t r = 0; r < W; ++r) {
    h[size_t(r)] = test::random_floats(rng, T[size_t(r)] * D, -1.f, 1.f);
    w[size_t(r)] = test::random_floats(rng, T[size_t(r)] * K, 0.1f, 1.f);
    ids[size_t(r)] = test::random_ids(rng, L, T[size_t(r)], K, {}, r);
    w[size_t(r)].reserve(1);  // a rank without tokens still passes weights (every rank passes them or none)
  }
  std::vector<std::vector<float>> got_rows(static_cast<size_t>(W)), got_w(static_cast<size_t>(W));
  std::vector<std::vector<int32_t>> got_slot(static_cast<size_t>(W));
  {
    parallel::RendezvousDir dir;
    std::vector<std::thread> th;
    std::vector<std::exception_ptr> err(static_cast<size_t>(W));
    for (int32_t r = 0; r < W; ++r)
      th.emplace_back([&, r] {
        try {
          auto pg = parallel::make_gloo_group({.rendezvous_dir = dir.path(), .name = "ep", .rank = r, .size = W});
          ExpertParallel ep(*pg, {L});
          ep.dispatch(0, h[size_t(r)].data(), T[size_t(r)], D, ids[size_t(r)].data(), K, w[size_t(r)].data());
          const ExpertParallel::Received g = ep.received();
          got_rows[size_t(r)].assign(g.rows.begin(), g.rows.end());
          got_slot[size_t(r)].assign(g.slot.begin(), g.slot.end());
          got_w[size_t(r)].assign(g.weight.begin(), g.weight.end());
          pg->barrier();  // no rank tears its group down while a peer's messages are in flight
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
          err[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : th) t.join();
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
  }
  const int64_t rb = ep_row_bytes(D, DType::kF32);
  for (int32_t q = 0; q < W; ++q) {
    const EpRouteTable tq = make_route_table(L, q);
    std::vector<float> rows, wts;
    std::vector<int32_t> logical;
    for (int32_t r = 0; r < W; ++r) {
      const EpPlan p = ep_plan_host(make_route_table(L, r), ids[size_t(r)].data(), T[size_t(r)], K);
      std::vector<uint8_t> send(size_t(T[size_t(r)] * K * rb));
      ep_pack_host(p, h[size_t(r)].data(), DType::kF32, D, K, w[size_t(r)].data(), send.data());
      int64_t off = 0;
      for (int32_t x = 0; x < q; ++x) off += p.counts[size_t(x)];
      const int64_t m = p.counts[size_t(q)];
      std::vector<float> x(size_t(m * D)), wt(static_cast<size_t>(m));
      std::vector<int32_t> lg(static_cast<size_t>(m));
      ep_unpack_host(tq, send.data() + off * rb, m, D, DType::kF32, x.data(), lg.data(), wt.data());
      rows.insert(rows.end(), x.begin(), x.end());
      wts.insert(wts.end(), wt.begin(), wt.end());
      logical.insert(logical.end(), lg.begin(), lg.end());
    }
    ASSERT_EQ(rows.size(), got_rows[size_t(q)].size()) << "rank " << q;
    EXPECT_EQ(rows, got_rows[size_t(q)]) << "rank " << q;
    EXPECT_EQ(wts, got_w[size_t(q)]) << "rank " << q;
    for (size_t j = 0; j < logical.size(); ++j)
      EXPECT_EQ(logical[j], tq.slot_logical[size_t(got_slot[size_t(q)][j])]) << "rank " << q << " row " << j;
  }
}
#endif

}  // namespace
}  // namespace deepinfer::model::ds
