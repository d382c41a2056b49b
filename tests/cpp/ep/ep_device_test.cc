// The device-side expert-parallel exchange on the GPU: the kernels against their host twins
// (random routing, odd sizes, several chunks, bad ids), then dispatch -> experts -> give_back ->
// combine through DeviceExpertExchange equal one rank's MoE output bit for bit, over the
// in-process loopback (W = 2, 3, 4 simulated ranks on one GPU: a rank with no tokens that
// receives nothing, tokens whose k experts all live on one rank, two layers with different
// placements) and over NCCL at world size 1 (a real NCCL group of one through the same code).
// The experts are a per-row stand-in (ep_fake_expert.cu): the backend's expert GEMMs are the
// single-rank kernels, unchanged; this checks what the exchange adds. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ep_test_util.h"
#include "model/deepseek/cuda/device_expert_exchange.h"
#include "model/deepseek/cuda/ep_exchange.h"
#include "model/deepseek/cuda/glue_kernels.h"
#include "model/deepseek/cuda/loopback_all_to_all.h"
#include "model/deepseek/ep_plan.h"
#include "ops/cuda/runtime.h"
#if DEEPINFER_HAVE_NCCL
#include "parallel/nccl_group.h"
#endif

namespace deepinfer::model::ds::test {
void fake_expert(const void* x, bool bf16, const int64_t* src, const int32_t* e, const float* w, int64_t rows,
                 int64_t D, float* y, cudaStream_t st);
}

namespace deepinfer::model::ds::cuda {
namespace {
namespace dc = deepinfer::cuda;

#define SKIP_WITHOUT_GPU() \
  if (dc::cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << dc::cuda_unavailable_reason()

template <typename T>
dc::DeviceBuffer upload(const std::vector<T>& v) {
  dc::DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) DI_CUDA_CHECK(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}
template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n) DI_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

struct TableOnDevice {
  dc::DeviceBuffer buf;
  EpTableView view;
};
TableOnDevice to_device(const EpRouteTable& t) {
  std::vector<int32_t> flat;
  for (const std::vector<int32_t>* v : {&t.local_phys, &t.rep_off, &t.reps, &t.slot_logical})
    flat.insert(flat.end(), v->begin(), v->end());
  TableOnDevice d{upload(flat), {}};
  const int32_t* p = d.buf.as<int32_t>();
  const size_t a = t.local_phys.size(), b = a + t.rep_off.size(), c = b + t.reps.size();
  d.view = {.local_phys = p, .rep_off = p + a, .reps = p + b, .slot_logical = p + c, .rank = t.rank, .ranks = t.ranks,
            .slots = t.slots, .experts = t.experts};
  return d;
}

std::vector<uint8_t> random_rows(std::mt19937& rng, int64_t n, DType act) {
  const std::vector<float> f = test::random_floats(rng, n, -2.f, 2.f);
  std::vector<uint8_t> out(size_t(n) * (act == DType::kBF16 ? 2 : 4));
  for (int64_t i = 0; i < n; ++i) {
    if (act == DType::kBF16) {
      const uint16_t b = f32_to_bf16(f[size_t(i)]);
      std::memcpy(out.data() + i * 2, &b, 2);
    } else {
      std::memcpy(out.data() + i * 4, &f[size_t(i)], 4);
    }
  }
  return out;
}

TEST(EpDevice, KernelsMatchTwins) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (int32_t W : {1, 2, 3, 5})
    for (DType act : {DType::kBF16, DType::kF32})
      for (int64_t D : {1, 9, 67})
        for (int64_t T : {0, 1, 301}) {
          const int64_t K = 3, P = T * K, ab = int64_t(dtype_bits(act) / 8);
          const int32_t E = 13, S = (E + 4 + W - 1) / W, r = W - 1;
          const parallel::ExpertPlacement L = test::random_placement(rng, E, W, S);
          const EpRouteTable t = make_route_table(L, r);
          std::vector<int32_t> ids = test::random_ids(rng, L, T, K, {}, 0);
          if (P > 5) ids[4] = E, ids[size_t(P - 1)] = -3;  // bad ids: counted, no row
          const std::vector<float> w = test::random_floats(rng, P, 0.1f, 1.f);
          const std::vector<uint8_t> h = random_rows(rng, T * D, act);
          const EpPlan want = ep_plan_host(t, ids.data(), T, K);
          const TableOnDevice td = to_device(t);
          dc::DeviceBuffer ids_d = upload(ids), w_d = upload(w), h_d = upload(h);
          dc::DeviceBuffer dest(P * 4 + 16), slot(P * 4 + 16), pos(P * 8 + 16), counts(size_t(W + 1) * 8),
              scratch(size_t(ep_plan_scratch(P, W)) * 8 + 16);
          ep_plan({.table = td.view, .ids = ids_d.as<int32_t>(), .tokens = T, .topk = K, .dest = dest.as<int32_t>(),
                   .slot = slot.as<int32_t>(), .pos = pos.as<int64_t>(), .counts = counts.as<int64_t>(),
                   .scratch = scratch.as<int64_t>()},
                  nullptr);
          const std::string at = "W " + std::to_string(W) + " D " + std::to_string(D) + " T " + std::to_string(T);
          ASSERT_EQ(download<int64_t>(counts.data(), size_t(W + 1)), want.counts) << at;
          ASSERT_EQ(download<int32_t>(dest.data(), size_t(P)), want.dest) << at;
          ASSERT_EQ(download<int64_t>(pos.data(), size_t(P)), want.pos) << at;
          std::vector<int32_t> slot_h = download<int32_t>(slot.data(), size_t(P));
          for (int64_t i = 0; i < P; ++i)
            if (want.dest[size_t(i)] >= 0) { ASSERT_EQ(slot_h[size_t(i)], want.slot[size_t(i)]) << at << " pair " << i; }
          int64_t rows = 0;
          for (int32_t q = 0; q < W; ++q) rows += want.counts[size_t(q)];
          const int64_t rb = ep_row_bytes(D, act);
          std::vector<uint8_t> send_h(size_t(rows * rb));
          ep_pack_host(want, h.data(), act, D, K, w.data(), send_h.data());
          dc::DeviceBuffer send(size_t(rows * rb) + 16);
          ep_pack({.slot = slot.as<int32_t>(), .pos = pos.as<int64_t>(), .h = h_d.data(), .weights = w_d.as<float>(),
                   .tokens = T, .topk = K, .dim = D, .act = act, .send = send.as<uint8_t>()},
                  nullptr);
          ASSERT_EQ(download<uint8_t>(send.data(), send_h.size()), send_h) << at;
          // The whole send buffer as if rank r received it.
          std::vector<uint8_t> x_h(size_t(rows * D * ab) + 1);
          std::vector<int32_t> lg_h(static_cast<size_t>(rows));
          std::vector<float> wt_h(static_cast<size_t>(rows));
          ASSERT_EQ(ep_unpack_host(t, send_h.data(), rows, D, act, x_h.data(), lg_h.data(), wt_h.data()), 0);
          dc::DeviceBuffer x(x_h.size() + 16), lg(size_t(rows) * 4 + 16), wt(size_t(rows) * 4 + 16), bad(8);
          DI_CUDA_CHECK(cudaMemset(bad.data(), 0, 8));
          ep_unpack({.table = td.view, .recv = send.as<uint8_t>(), .rows = rows, .dim = D, .act = act, .x = x.data(),
                     .logical = lg.as<int32_t>(), .weight = wt.as<float>(), .bad = bad.as<int64_t>()},
                    nullptr);
          x_h.pop_back();
          ASSERT_EQ(download<uint8_t>(x.data(), x_h.size()), x_h) << at;
          ASSERT_EQ(download<int32_t>(lg.data(), size_t(rows)), lg_h) << at;
          ASSERT_EQ(download<float>(wt.data(), size_t(rows)), wt_h) << at;
          ASSERT_EQ(download<int64_t>(bad.data(), 1)[0], 0) << at;
        }
}

TEST(EpDevice, GatherF32) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  const int64_t n = 29, D = 13;
  const std::vector<float> ye = test::random_floats(rng, n * D, -1.f, 1.f);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) idx[size_t(j)] = j % 7 == 3 ? -1 : int64_t(rng() % uint32_t(n));
  dc::DeviceBuffer ye_d = upload(ye), idx_d = upload(idx), out(size_t(n * D) * 4);
  ep_gather_f32(ye_d.as<float>(), idx_d.as<int64_t>(), n, D, out.as<float>(), nullptr);
  const std::vector<float> got = download<float>(out.data(), size_t(n * D));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d)
      ASSERT_EQ(got[size_t(j * D + d)], idx[size_t(j)] < 0 ? 0.f : ye[size_t(idx[size_t(j)] * D + d)]) << j;
  EXPECT_THROW(ep_gather_f32(nullptr, idx_d.as<int64_t>(), n, D, out.as<float>(), nullptr), InvalidArgument);
}

// One rank's inputs for a layer and what it must end with.
struct RankCase {
  int64_t T = 0;
  std::vector<uint8_t> h;
  std::vector<int32_t> ids;
  std::vector<float> w, shared;
};

// The single-rank MoE output of one rank's tokens: every pair through the stand-in expert, then
// the single-rank combine (rows = pair order).
std::vector<float> one_rank(const RankCase& c, DType act, int64_t D, int64_t K, cudaStream_t st) {
  const int64_t P = c.T * K;
  if (c.T == 0) return {};
  std::vector<int64_t> src(static_cast<size_t>(P)), iota(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) src[size_t(i)] = i / K, iota[size_t(i)] = i;
  dc::DeviceBuffer h = upload(c.h), ids = upload(c.ids), w = upload(c.w), s = upload(src), rows = upload(iota),
                   sh = upload(c.shared), ye(size_t(P * D) * 4), out(size_t(c.T * D) * 4);
  test::fake_expert(h.data(), act == DType::kBF16, s.as<int64_t>(), ids.as<int32_t>(), w.as<float>(), P, D, ye.as<float>(), st);
  moe_combine({.ye = ye.as<float>(), .rows = rows.as<int64_t>(), .shared = sh.as<float>(), .out = out.as<float>(),
               .tokens = c.T, .topk = K, .dim = D},
              st);
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  return download<float>(out.data(), size_t(c.T * D));
}

// One rank's layers through the exchange: dispatch, stand-in experts on the received rows,
// give_back, the single-rank combine over rows(). Returns each layer's output and the rows received.
std::vector<std::vector<float>> through_exchange(parallel::DeviceAllToAllV& a2a, const std::vector<parallel::ExpertPlacement>& L,
                                                 const std::vector<RankCase>& layers, DType act, int64_t D, int64_t K,
                                                 std::vector<int64_t>* received) {
  dc::Stream stream;
  const cudaStream_t st = stream.get();
  DeviceExpertExchange ex(a2a, 0);
  std::vector<std::vector<float>> outs;
  for (size_t l = 0; l < layers.size(); ++l) {
    const RankCase& c = layers[l];
    dc::DeviceBuffer h = upload(c.h), ids = upload(c.ids), w = upload(c.w), sh = upload(c.shared),
                     out(size_t(c.T * D) * 4 + 16);
    const DeviceExpertExchange::Received got = ex.dispatch(int64_t(l), L[l], h.data(), act, c.T, D, ids.as<int32_t>(),
                                                           w.as<float>(), K, st);
    received->push_back(got.rows);
    dc::DeviceBuffer y(size_t(got.rows * D) * 4 + 16);
    test::fake_expert(got.x, act == DType::kBF16, nullptr, got.logical, got.weight, got.rows, D, y.as<float>(), st);
    ex.give_back(y.as<float>(), st);
    if (c.T > 0)
      moe_combine({.ye = ex.out(), .rows = ex.rows(), .shared = sh.as<float>(), .out = out.as<float>(), .tokens = c.T,
                   .topk = K, .dim = D},
                  st);
    DI_CUDA_CHECK(cudaStreamSynchronize(st));  // h, ids, ... die at the end of the iteration
    outs.push_back(download<float>(out.data(), size_t(c.T * D)));
  }
  return outs;
}

RankCase make_case(std::mt19937& rng, const parallel::ExpertPlacement& L, int64_t T, int64_t D, int64_t K, DType act,
                   const std::vector<int32_t>& avoid, int32_t rank_all) {
  RankCase c;
  c.T = T;
  c.h = random_rows(rng, T * D, act);
  c.ids = test::random_ids(rng, L, T, K, avoid, rank_all);
  c.w = test::random_floats(rng, T * K, 0.1f, 1.f);
  c.shared = test::random_floats(rng, T * D, -0.5f, 0.5f);
  return c;
}

void expect_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& at) {
  ASSERT_EQ(a.size(), b.size()) << at;
  if (!a.empty()) { ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << at; }
}

TEST(EpDevice, LoopbackMatchesOneRank) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(33);
  const int64_t D = 67, K = 3;
  for (int32_t W : {2, 3, 4})
    for (DType act : {DType::kBF16, DType::kF32}) {
      const int32_t E = 12, S = (E + 3 + W - 1) / W;
      // Layer 0: rank 1 has no tokens and receives nothing; layer 1: another placement, every rank busy.
      const std::vector<parallel::ExpertPlacement> L = {test::random_placement(rng, E, W, S),
                                                        test::random_placement(rng, E, W, S)};
      const std::vector<int32_t> avoid = test::experts_on(L[0], 1);
      std::vector<std::vector<RankCase>> cases(static_cast<size_t>(W));  // [rank][layer]
      for (int32_t r = 0; r < W; ++r) {
        cases[size_t(r)].push_back(make_case(rng, L[0], r == 1 ? 0 : 5 + 97 * r, D, K, act, avoid, 0));
        cases[size_t(r)].push_back(make_case(rng, L[1], 3 + 41 * r, D, K, act, {}, W - 1));
      }
      auto hub = make_loopback_hub(W, 0);
      std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(W));
      std::vector<std::vector<int64_t>> received(static_cast<size_t>(W));
      std::vector<std::exception_ptr> err(static_cast<size_t>(W));
      std::vector<std::thread> th;
      for (int32_t r = 0; r < W; ++r)
        th.emplace_back([&, r] {
          try {
            DI_CUDA_CHECK(cudaSetDevice(0));
            auto a2a = make_loopback_all_to_all(hub, r);
            got[size_t(r)] = through_exchange(*a2a, L, cases[size_t(r)], act, D, K, &received[size_t(r)]);
          } catch (...) {
            err[size_t(r)] = std::current_exception();
          }
        });
      for (auto& t : th) t.join();
      for (auto& e : err)
        if (e) std::rethrow_exception(e);
      EXPECT_EQ(received[1][0], 0) << "W " << W << ": rank 1 should receive nothing in layer 0";
      dc::Stream s;
      for (int32_t r = 0; r < W; ++r)
        for (size_t l = 0; l < 2; ++l)
          expect_bits(got[size_t(r)][l], one_rank(cases[size_t(r)][l], act, D, K, s.get()),
                      "W " + std::to_string(W) + " rank " + std::to_string(r) + " layer " + std::to_string(l) +
                          (act == DType::kBF16 ? " bf16" : " f32"));
    }
}

TEST(EpDevice, NcclWorldOneMatchesOneRank) {
  SKIP_WITHOUT_GPU();
#if DEEPINFER_HAVE_NCCL
  std::mt19937 rng(44);
  const int64_t D = 67, K = 3;
  auto boot = parallel::make_single_rank_group();
  auto nccl = parallel::make_nccl_group(*boot, 0, "ep-test");
  auto a2a = parallel::make_group_all_to_all(*nccl);
  EXPECT_NE(a2a->describe().find("nccl"), std::string::npos) << a2a->describe();
  for (DType act : {DType::kBF16, DType::kF32}) {
    const std::vector<parallel::ExpertPlacement> L = {test::random_placement(rng, 12, 1, 15),
                                                      test::random_placement(rng, 12, 1, 12)};
    const std::vector<RankCase> cases = {make_case(rng, L[0], 211, D, K, act, {}, 0), make_case(rng, L[1], 0, D, K, act, {}, 0)};
    std::vector<int64_t> received;
    const auto got = through_exchange(*a2a, L, cases, act, D, K, &received);
    EXPECT_EQ(received[0], 211 * K);
    dc::Stream s;
    for (size_t l = 0; l < 2; ++l) expect_bits(got[l], one_rank(cases[l], act, D, K, s.get()), "nccl layer " + std::to_string(l));
  }
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

TEST(EpDevice, HostGroupRefusedAndBadIdNamed) {
  SKIP_WITHOUT_GPU();
  auto host = parallel::make_single_rank_group();
  EXPECT_THROW(parallel::make_group_all_to_all(*host), InvalidArgument);
  auto hub = make_loopback_hub(1, 0);
  auto a2a = make_loopback_all_to_all(hub, 0);
  DeviceExpertExchange ex(*a2a, 0);
  std::mt19937 rng(1);
  const parallel::ExpertPlacement L = test::random_placement(rng, 4, 1, 4);
  const std::vector<int32_t> ids = {0, 1, 9, 2};
  const std::vector<float> w(4, 0.5f), h(4 * 3, 1.f);
  dc::DeviceBuffer ids_d = upload(ids), w_d = upload(w), h_d = upload(h);
  try {
    ex.dispatch(0, L, h_d.data(), DType::kF32, 2, 3, ids_d.as<int32_t>(), w_d.as<float>(), 2, nullptr);
    FAIL() << "accepted expert id 9 of 4";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 9 at pair 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::model::ds::cuda
