#include <cstring>
#include <tuple>

#include "ops/cpu/hc.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/norm.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// f32: the 24 dot products over n·D are summed in another order (~1e-6), Sinkhorn is
// well-conditioned. bf16 streams: u is rounded once to bf16.
constexpr double kTolF32 = 2e-5, kTolBf16 = 8e-3;

struct Site {
  std::vector<float> fn, base, scale;
};
Site make_site(int n, int64_t dim, oc::HcMode mode, uint64_t seed) {
  const int M = oc::hc_num_mix(n, mode);
  Site s;
  s.fn = randn(size_t(M) * n * dim, seed, 0.05f);
  s.base = randn(M, seed + 1, 0.5f);
  s.scale = randn(mode == oc::HcMode::kLayer ? 3 : 1, seed + 2, 0.3f, 1.0f);
  return s;
}

template <typename T>
std::vector<float> as_f32(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return from_bf16(v);
}

template <typename T>
void run_case(int64_t T_, int64_t dim, oc::HcMode mode, uint64_t seed) {
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  const int n = 4, M = oc::hc_num_mix(n, mode);
  Site s = make_site(n, dim, mode, seed);
  std::vector<float> X = randn(T_ * n * dim, seed + 3, 1.0f);
  std::vector<float> y = randn(T_ * dim, seed + 4, 1.0f);
  if (kBf16) {
    X = bf16_round(X);
    y = bf16_round(y);
  }
  ops::cpu::HcSpec spec{.n = n, .dim = dim};
  std::vector<float> u_ref(T_ * dim), post_ref(T_ * n), comb_ref(T_ * n * n), X2_ref(T_ * n * dim);
  if (mode == oc::HcMode::kLayer) {
    ops::cpu::hc_pre(X.data(), T_, spec, s.fn.data(), s.base.data(), s.scale.data(), u_ref.data(), post_ref.data(),
                     comb_ref.data());
    ops::cpu::hc_post(X.data(), y.data(), post_ref.data(), comb_ref.data(), T_, spec, X2_ref.data());
  } else {
    ops::cpu::hc_head(X.data(), T_, spec, s.fn.data(), s.base.data(), s.scale.data(), u_ref.data());
  }

  auto pack = [&](const std::vector<float>& v) {
    if constexpr (kBf16) return to_bf16(v);
    else return v;
  };
  DevArray<T> dX(pack(X)), dy(pack(y)), du(T_ * dim), dX2(T_ * n * dim);
  DevArray<float> dfn(s.fn), dbase(s.base), dscale(s.scale), dmix(T_ * M);
  DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, n, dim, mode) / sizeof(float) + 1);
  du.poison();
  dmix.poison();
  dX2.poison();
  const DType dt = kBf16 ? DType::kBF16 : DType::kF32;
  oc::hc_pre({.x = dX.get(), .dtype = dt, .x_stride = n * dim, .fn = dfn.get(), .base = dbase.get(),
              .scale = dscale.get(), .u = du.get(), .u_stride = dim, .mix = dmix.get(), .workspace = ws.get(),
              .tokens = T_, .n = n, .dim = dim, .mode = mode},
             nullptr);
  const std::string cs = std::string(kBf16 ? "bf16" : "f32") + " T=" + std::to_string(T_) + " D=" + std::to_string(dim);
  const double tol = kBf16 ? kTolBf16 : kTolF32;
  if (mode == oc::HcMode::kHead) {
    report("hc_head", cs, max_rel_err(as_f32(du.download()), u_ref), tol);
    return;
  }
  report("hc_pre_u", cs, max_rel_err(as_f32(du.download()), u_ref), tol);
  std::vector<float> mix = dmix.download(), post, comb;
  for (int64_t t = 0; t < T_; ++t) {
    post.insert(post.end(), mix.begin() + t * M + n, mix.begin() + t * M + 2 * n);
    comb.insert(comb.end(), mix.begin() + t * M + 2 * n, mix.begin() + (t + 1) * M);
  }
  report("hc_pre_post", cs, max_rel_err(post, post_ref), kTolF32);
  report("hc_pre_comb", cs, max_rel_err(comb, comb_ref), kTolF32);
  oc::hc_post({.x = dX.get(), .x_stride = n * dim, .y = dy.get(), .y_stride = dim, .mix = dmix.get(),
               .out = dX2.get(), .out_stride = n * dim, .dtype = dt, .tokens = T_, .n = n, .dim = dim},
              nullptr);
  // hc_post is fed the GPU's own mix; its error budget adds the mix error above.
  report("hc_post", cs, max_rel_err(as_f32(dX2.download()), X2_ref), tol);
}

TEST(CudaHc, PrePostHeadMatchCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 1000;
  for (int64_t T_ : token_counts())
    for (int64_t dim : {int64_t(4096), int64_t(256)}) {
      run_case<float>(T_, dim, oc::HcMode::kLayer, seed += 10);
      run_case<uint16_t>(T_, dim, oc::HcMode::kLayer, seed += 10);
      run_case<float>(T_, dim, oc::HcMode::kHead, seed += 10);
    }
}

// Single-pass wiring (V4.1): mixes of site B from its own input with no collapse (u null), then
// the collapse of B's input with site A's pre weights (read in place from A's mix rows), and the
// one-hot start (null weights: stream 0 exactly). CPU twins hc_mix / hc_collapse; odd dims.
template <typename T>
void run_single_pass(int64_t T_, int64_t dim, uint64_t seed) {
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  const int n = 4, M = oc::hc_num_mix(n, oc::HcMode::kLayer);
  Site a = make_site(n, dim, oc::HcMode::kLayer, seed), b = make_site(n, dim, oc::HcMode::kLayer, seed + 5);
  std::vector<float> Xa = randn(T_ * n * dim, seed + 3), Xb = randn(T_ * n * dim, seed + 4);
  if (kBf16) Xa = bf16_round(Xa), Xb = bf16_round(Xb);
  ops::cpu::HcSpec spec{.n = n, .dim = dim, .sinkhorn_iters = 7, .rms_eps = 1e-20f};
  std::vector<float> pa(T_ * n), qa(T_ * n), ca(T_ * n * n), pb(T_ * n), qb(T_ * n), cb(T_ * n * n);
  ops::cpu::hc_mix(Xa.data(), T_, spec, a.fn.data(), a.base.data(), a.scale.data(), pa.data(), qa.data(), ca.data());
  ops::cpu::hc_mix(Xb.data(), T_, spec, b.fn.data(), b.base.data(), b.scale.data(), pb.data(), qb.data(), cb.data());
  std::vector<float> u_ref(T_ * dim), u0_ref(T_ * dim);
  ops::cpu::hc_collapse(Xb.data(), T_, spec, pa.data(), u_ref.data());
  ops::cpu::hc_collapse(Xb.data(), T_, spec, nullptr, u0_ref.data());
  auto pack = [&](const std::vector<float>& v) {
    if constexpr (kBf16) return to_bf16(v);
    else return v;
  };
  DevArray<T> dXa(pack(Xa)), dXb(pack(Xb)), du(T_ * dim), du0(T_ * dim);
  DevArray<float> fa(a.fn), ba(a.base), sa(a.scale), fb(b.fn), bb(b.base), sb(b.scale), ma(T_ * M), mb(T_ * M);
  DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, n, dim, oc::HcMode::kLayer) / sizeof(float) + 1);
  du.poison();
  du0.poison();
  ma.poison();
  mb.poison();
  const DType dt = kBf16 ? DType::kBF16 : DType::kF32;
  for (auto [dX, f, bs, sc, m] : {std::tuple{&dXa, &fa, &ba, &sa, &ma}, std::tuple{&dXb, &fb, &bb, &sb, &mb}})
    oc::hc_pre({.x = dX->get(), .dtype = dt, .x_stride = n * dim, .fn = f->get(), .base = bs->get(),
                .scale = sc->get(), .u = nullptr, .mix = m->get(), .workspace = ws.get(), .tokens = T_, .n = n,
                .dim = dim, .sinkhorn_iters = 7, .norm_eps = 1e-20f},
               nullptr);
  oc::hc_collapse({.x = dXb.get(), .x_stride = n * dim, .w = ma.get(), .w_stride = M, .u = du.get(), .u_stride = dim,
                   .dtype = dt, .tokens = T_, .n = n, .dim = dim},
                  nullptr);
  oc::hc_collapse({.x = dXb.get(), .x_stride = n * dim, .u = du0.get(), .u_stride = dim, .dtype = dt, .tokens = T_,
                   .n = n, .dim = dim},
                  nullptr);
  const std::string cs = std::string(kBf16 ? "bf16" : "f32") + " T=" + std::to_string(T_) + " D=" + std::to_string(dim);
  std::vector<float> mix = mb.download(), pre, post, comb;
  for (int64_t t = 0; t < T_; ++t) {
    pre.insert(pre.end(), mix.begin() + t * M, mix.begin() + t * M + n);
    post.insert(post.end(), mix.begin() + t * M + n, mix.begin() + t * M + 2 * n);
    comb.insert(comb.end(), mix.begin() + t * M + 2 * n, mix.begin() + (t + 1) * M);
  }
  report("hc_mix_pre", cs, max_rel_err(pre, pb), kTolF32);
  report("hc_mix_post", cs, max_rel_err(post, qb), kTolF32);
  report("hc_mix_comb", cs, max_rel_err(comb, cb), kTolF32);
  report("hc_collapse", cs, max_rel_err(as_f32(du.download()), u_ref), kBf16 ? kTolBf16 : kTolF32);
  EXPECT_EQ(as_f32(du0.download()), kBf16 ? bf16_round(u0_ref) : u0_ref) << "stream 0 " << cs;
}

TEST(CudaHc, SinglePassMixAndCollapseMatchCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 3000;
  for (int64_t T_ : token_counts())
    for (int64_t dim : {int64_t(5120), int64_t(37)}) {
      run_single_pass<float>(T_, dim, seed += 10);
      run_single_pass<uint16_t>(T_, dim, seed += 10);
    }
}

// The partial-sum grid's split over the mixes (HcPreParams::mix_split) never changes a bit: mixes
// and u of the one-block-per-chunk grid (1), the automatic one and uneven splits (5, 7, 24), both
// modes, f32 and bf16, token counts across the 4-token tile, a width with a partial chunk.
// The prefill shape of the partial sums (8 tokens and at most 8 mixes per block, automatic from 256
// tokens) against the decode shape (4 tokens, every mix): mixes and u bit for bit, with the mix
// split on top, both modes, n = 4 and 3, odd token counts on both sides of the automatic switch.
TEST(CudaHc, TokenTileBitIdentical) {
  DI_REQUIRE_GPU();
  uint64_t seed = 7100;
  for (oc::HcMode mode : {oc::HcMode::kLayer, oc::HcMode::kHead})
    for (int n : {4, 3})
      for (int64_t T_ : {int64_t(1), int64_t(13), int64_t(301)})
        for (int64_t dim : {int64_t(4096), int64_t(1000)})
          for (DType dt : {DType::kF32, DType::kBF16}) {
            const int M = oc::hc_num_mix(n, mode);
            const Site st = make_site(n, dim, mode, seed += 10);
            std::vector<float> X = randn(T_ * n * dim, seed + 3, 1.0f);
            DevArray<float> dXf(X), dfn(st.fn), dbase(st.base), dscale(st.scale);
            DevArray<uint16_t> dXb(to_bf16(X));
            DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, n, dim, mode) / sizeof(float) + 1);
            auto run = [&](int tile, int split) {
              DevArray<float> mix(T_ * M), u(T_ * dim);
              mix.poison(), u.poison();
              oc::hc_pre({.x = dt == DType::kF32 ? static_cast<const void*>(dXf.get()) : dXb.get(), .dtype = dt,
                          .x_stride = n * dim, .fn = dfn.get(), .base = dbase.get(), .scale = dscale.get(),
                          .u = u.get(), .u_stride = dim, .mix = mix.get(), .workspace = ws.get(), .tokens = T_,
                          .n = n, .dim = dim, .mode = mode, .mix_split = split, .token_tile = tile,
                          .single_launch = -1},
                         nullptr);
              std::vector<float> out = mix.download(), uh = u.download();
              out.insert(out.end(), uh.begin(), uh.end());
              return out;
            };
            const auto ref = run(4, 1);
            for (auto [tile, split] : {std::pair{8, 0}, std::pair{8, 5}, std::pair{8, 24}, std::pair{0, 0}}) {
              const auto got = run(tile, split);
              ASSERT_EQ(got.size(), ref.size());
              EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
                  << "tile " << tile << " split " << split << " T=" << T_ << " n=" << n << " D=" << dim << " "
                  << dtype_name(dt) << (mode == oc::HcMode::kLayer ? " layer" : " head");
            }
          }
  oc::HcPreParams bad{.x = &seed, .x_stride = 32, .fn = reinterpret_cast<const float*>(&seed),
                      .base = reinterpret_cast<const float*>(&seed), .scale = reinterpret_cast<const float*>(&seed),
                      .u = &seed, .u_stride = 8, .mix = reinterpret_cast<float*>(&seed),
                      .workspace = reinterpret_cast<float*>(&seed), .tokens = 1, .dim = 8, .token_tile = 6};
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);
}

TEST(CudaHc, MixSplitBitIdentical) {
  DI_REQUIRE_GPU();
  uint64_t seed = 5000;
  for (oc::HcMode mode : {oc::HcMode::kLayer, oc::HcMode::kHead})
    for (int64_t T_ : {int64_t(1), int64_t(3), int64_t(9)})
      for (int64_t dim : {int64_t(4096), int64_t(1000)})
        for (DType dt : {DType::kF32, DType::kBF16}) {
          const int n = 4, M = oc::hc_num_mix(n, mode);
          const Site st = make_site(n, dim, mode, seed += 10);
          std::vector<float> X = randn(T_ * n * dim, seed + 3, 1.0f);
          DevArray<float> dXf(X), dfn(st.fn), dbase(st.base), dscale(st.scale);
          DevArray<uint16_t> dXb(to_bf16(X));
          DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, n, dim, mode) / sizeof(float) + 1);
          auto run = [&](int split) {
            DevArray<float> mix(T_ * M), u(T_ * dim);  // u as f32 or 2x the bf16 elements needed
            mix.poison(), u.poison();
            oc::hc_pre({.x = dt == DType::kF32 ? static_cast<const void*>(dXf.get()) : dXb.get(), .dtype = dt,
                        .x_stride = n * dim, .fn = dfn.get(), .base = dbase.get(), .scale = dscale.get(), .u = u.get(),
                        .u_stride = dim, .mix = mix.get(), .workspace = ws.get(), .tokens = T_, .n = n, .dim = dim,
                        .mode = mode, .mix_split = split, .single_launch = -1},
                       nullptr);
            std::vector<float> out = mix.download(), uh = u.download();
            out.insert(out.end(), uh.begin(), uh.end());
            return out;
          };
          const auto ref = run(1);
          for (int split : {0, 5, 7, 24}) {
            const auto got = run(split);
            ASSERT_EQ(got.size(), ref.size());
            EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
                << "split " << split << " T=" << T_ << " D=" << dim << " " << dtype_name(dt)
                << (mode == oc::HcMode::kLayer ? " layer" : " head");
          }
        }
  oc::HcPreParams bad{.x = &seed, .fn = reinterpret_cast<const float*>(&seed), .base = reinterpret_cast<const float*>(&seed),
                      .scale = reinterpret_cast<const float*>(&seed), .u = &seed, .u_stride = 8,
                      .mix = reinterpret_cast<float*>(&seed), .workspace = reinterpret_cast<float*>(&seed), .tokens = 1,
                      .dim = 8, .mix_split = -1};
  bad.x_stride = 32;
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);
}

// The wide finalize (u split over blocks, per-mix fold, column-per-lane Sinkhorn) against the
// legacy one-block kernel: mixes and u bit for bit, for every u split (1, uneven 3, one block per
// 256 dims, clamped 9999, automatic 0), both modes, hc_mult 4, 2, 1 and 3 (the serial Sinkhorn),
// 20 and 7 iterations, f32 and bf16, mixes only (u null), odd widths (a partial chunk, D = 37).
std::vector<float> run_pre(const Site& st, const void* x, DType dt, int64_t T_, int n, int64_t dim, oc::HcMode mode,
                           int iters, bool with_u, bool legacy, int u_split, int single = -1, int cluster = 0) {
  const int M = oc::hc_num_mix(n, mode);
  DevArray<float> dfn(st.fn), dbase(st.base), dscale(st.scale), mix(T_ * M), u(T_ * dim);
  DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, n, dim, mode) / sizeof(float) + 1);
  mix.poison(), u.poison();
  oc::hc_pre({.x = x, .dtype = dt, .x_stride = n * dim, .fn = dfn.get(), .base = dbase.get(), .scale = dscale.get(),
              .u = with_u ? u.get() : nullptr, .u_stride = dim, .mix = mix.get(), .workspace = ws.get(), .tokens = T_,
              .n = n, .dim = dim, .mode = mode, .sinkhorn_iters = iters, .u_split = u_split,
              .legacy_finalize = legacy, .single_launch = single, .cluster = cluster},
             nullptr);
  std::vector<float> out = mix.download(), uh = u.download();
  if (dt == DType::kBF16) uh.resize((T_ * dim + 1) / 2);  // the bf16 elements written, as f32 words
  if (with_u) out.insert(out.end(), uh.begin(), uh.end());
  return out;
}

TEST(CudaHc, WideFinalizeBitIdenticalToLegacy) {
  DI_REQUIRE_GPU();
  uint64_t seed = 7000;
  int cases = 0;
  for (oc::HcMode mode : {oc::HcMode::kLayer, oc::HcMode::kHead})
    for (int n : {4, 2, 1, 3})
      for (int64_t T_ : {int64_t(1), int64_t(3), int64_t(9)})
        for (int64_t dim : {int64_t(4096), int64_t(1000), int64_t(37)})
          for (DType dt : {DType::kF32, DType::kBF16}) {
            const Site st = make_site(n, dim, mode, seed += 10);
            const std::vector<float> X = randn(T_ * n * dim, seed + 3, 1.0f);
            DevArray<float> dXf(X);
            DevArray<uint16_t> dXb(to_bf16(X));
            const void* x = dt == DType::kF32 ? static_cast<const void*>(dXf.get()) : dXb.get();
            const int iters = n == 2 ? 7 : 20;
            for (bool with_u : {true, false}) {
              if (!with_u && mode == oc::HcMode::kHead) continue;  // head mode needs u
              const auto ref = run_pre(st, x, dt, T_, n, dim, mode, iters, with_u, true, 0);
              for (int split : {0, 1, 3, 16, 9999}) {
                const auto got = run_pre(st, x, dt, T_, n, dim, mode, iters, with_u, false, split);
                ASSERT_EQ(got.size(), ref.size());
                EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
                    << "u_split " << split << " n=" << n << " T=" << T_ << " D=" << dim << " " << dtype_name(dt)
                    << (mode == oc::HcMode::kLayer ? " layer" : " head") << (with_u ? "" : " mixes only");
                ++cases;
              }
            }
          }
  EXPECT_GT(cases, 0);
  float f = 0;
  oc::HcPreParams bad{.x = &f, .x_stride = 32, .fn = &f, .base = &f, .scale = &f, .u = &f, .u_stride = 8, .mix = &f,
                      .workspace = &f, .tokens = 1, .dim = 8, .u_split = -2};
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);
}

// Batch invariance of the finalize: a token's mixes and u are the same bits alone (one token: the
// widest u split) as in a batch of 9 (a narrower automatic split), whatever its neighbours hold.
TEST(CudaHc, WideFinalizeBatchInvariant) {
  DI_REQUIRE_GPU();
  const int n = 4, M = 24;
  const int64_t dim = 4096, T_ = 9;
  const Site st = make_site(n, dim, oc::HcMode::kLayer, 7777);
  const std::vector<float> X = randn(T_ * n * dim, 7780, 1.0f);
  const std::vector<float> X0(X.begin() + 4 * n * dim, X.begin() + 5 * n * dim);  // token 4 alone
  DevArray<float> dX(X), dX0(X0);
  const auto all = run_pre(st, dX.get(), DType::kF32, T_, n, dim, oc::HcMode::kLayer, 20, true, false, 0);
  const auto one = run_pre(st, dX0.get(), DType::kF32, 1, n, dim, oc::HcMode::kLayer, 20, true, false, 0);
  EXPECT_EQ(0, std::memcmp(one.data(), all.data() + 4 * M, M * sizeof(float))) << "mixes";
  EXPECT_EQ(0, std::memcmp(one.data() + M, all.data() + T_ * M + 4 * dim, dim * sizeof(float))) << "u";
}

// The single launch (a thread-block cluster per token: partial sums, fold over distributed shared
// memory, transform, u and the Sinkhorn in one kernel) against the legacy two-kernel path: mixes
// and u bit for bit, for the automatic cluster (16 blocks for V4's 16 chunks) and forced smaller
// ones (8: two chunks a block, 3: uneven, 1: the whole token in one block), both modes, hc_mult 4,
// 2, 1 and 3 (the serial Sinkhorn), 20 and 7 iterations, f32 and bf16, mixes only, odd widths and
// token counts (9 and 64: forced beyond the automatic 8).
TEST(CudaHc, SingleLaunchBitIdentical) {
  DI_REQUIRE_GPU();
  uint64_t seed = 11000;
  int cases = 0;
  for (oc::HcMode mode : {oc::HcMode::kLayer, oc::HcMode::kHead})
    for (int n : {4, 2, 1, 3})
      for (int64_t T_ : {int64_t(1), int64_t(3), int64_t(9), int64_t(64)})
        for (int64_t dim : {int64_t(4096), int64_t(1000), int64_t(37)})
          for (DType dt : {DType::kF32, DType::kBF16}) {
            if (T_ == 64 && (n == 2 || n == 1 || dt == DType::kBF16)) continue;  // the large count, fewer shapes
            const Site st = make_site(n, dim, mode, seed += 10);
            const std::vector<float> X = randn(T_ * n * dim, seed + 3, 1.0f);
            DevArray<float> dXf(X);
            DevArray<uint16_t> dXb(to_bf16(X));
            const void* x = dt == DType::kF32 ? static_cast<const void*>(dXf.get()) : dXb.get();
            const int iters = n == 2 ? 7 : 20;
            for (bool with_u : {true, false}) {
              if (!with_u && mode == oc::HcMode::kHead) continue;  // head mode needs u
              const auto ref = run_pre(st, x, dt, T_, n, dim, mode, iters, with_u, true, 0);
              for (int cluster : {0, 8, 3, 1}) {
                if (cluster == 1 && dim != 4096) continue;
                const auto got = run_pre(st, x, dt, T_, n, dim, mode, iters, with_u, false, 0, 1, cluster);
                ASSERT_EQ(got.size(), ref.size());
                EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)))
                    << "cluster " << cluster << " n=" << n << " T=" << T_ << " D=" << dim << " " << dtype_name(dt)
                    << (mode == oc::HcMode::kLayer ? " layer" : " head") << (with_u ? "" : " mixes only");
                ++cases;
              }
              // The automatic choice (single launch up to 8 tokens, the two kernels beyond).
              const auto au = run_pre(st, x, dt, T_, n, dim, mode, iters, with_u, false, 0, 0, 0);
              EXPECT_EQ(0, std::memcmp(au.data(), ref.data(), ref.size() * sizeof(float)))
                  << "automatic n=" << n << " T=" << T_ << " D=" << dim << " " << dtype_name(dt);
              ++cases;
            }
          }
  EXPECT_GT(cases, 500);
  // Wider than the single launch takes (n·D > 65,536: 4 x 20,000): the two kernels, the same bits.
  const Site st = make_site(4, 20000, oc::HcMode::kLayer, 11999);
  DevArray<float> dX(randn(2 * 4 * 20000, 12000, 1.0f));
  const auto ref = run_pre(st, dX.get(), DType::kF32, 2, 4, 20000, oc::HcMode::kLayer, 20, true, true, 0);
  const auto got = run_pre(st, dX.get(), DType::kF32, 2, 4, 20000, oc::HcMode::kLayer, 20, true, false, 0, 1, 0);
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float))) << "D = 20000 fallback";
}

// Batch invariance across the paths: token 4 alone in the single launch equals its mixes and u in
// a batch of 9 (the automatic choice: two kernels) and in a forced single launch of 9.
TEST(CudaHc, SingleLaunchBatchInvariant) {
  DI_REQUIRE_GPU();
  const int n = 4, M = 24;
  const int64_t dim = 4096, T_ = 9;
  const Site st = make_site(n, dim, oc::HcMode::kLayer, 8777);
  const std::vector<float> X = randn(T_ * n * dim, 8780, 1.0f);
  const std::vector<float> X0(X.begin() + 4 * n * dim, X.begin() + 5 * n * dim);  // token 4 alone
  DevArray<float> dX(X), dX0(X0);
  const auto one = run_pre(st, dX0.get(), DType::kF32, 1, n, dim, oc::HcMode::kLayer, 20, true, false, 0, 1, 0);
  for (int single : {0, 1}) {
    const auto all = run_pre(st, dX.get(), DType::kF32, T_, n, dim, oc::HcMode::kLayer, 20, true, false, 0, single, 0);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + 4 * M, M * sizeof(float))) << "mixes, single " << single;
    EXPECT_EQ(0, std::memcmp(one.data() + M, all.data() + T_ * M + 4 * dim, dim * sizeof(float)))
        << "u, single " << single;
  }
  float f = 0;
  oc::HcPreParams bad{.x = &f, .x_stride = 32, .fn = &f, .base = &f, .scale = &f, .u = &f, .u_stride = 8, .mix = &f,
                      .workspace = &f, .tokens = 1, .dim = 8, .cluster = 17};
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);
  bad.cluster = -1;
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);
}

// The site norm fused into hc_pre (HcPreParams::h) against the unfused pair, hc_pre then the
// legacy two-pass rmsnorm on u: mixes, u and h bit for bit (raw bytes), for the wide finalize at
// several u splits (the last-block-done norm after 1, 3 or automatic many blocks) and the legacy
// finalize (which norms in a second launch), both modes, x f32/bf16, h f32/bf16, weighted or not.
struct FusedOut {
  std::vector<float> mix, u;
  std::vector<uint8_t> h;
};
FusedOut run_fused(const Site& st, const void* x, DType dt, int64_t T_, int n, int64_t dim, oc::HcMode mode,
                   DType hd, const float* hw, bool fused, bool legacy, int u_split, int single = -1) {
  const int M = oc::hc_num_mix(n, mode);
  const size_t eb = dt == DType::kF32 ? 4 : 2, hb = hd == DType::kF32 ? 4 : 2;
  DevArray<float> dfn(st.fn), dbase(st.base), dscale(st.scale), mix(T_ * M), u((T_ * dim * eb + 3) / 4);
  DevArray<uint8_t> h(size_t(T_ * dim) * hb);
  DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, n, dim, mode) / sizeof(float) + 1);
  mix.poison(), u.poison(), h.poison(), ws.poison();  // poisoned counters: the partials kernel must zero them
  oc::hc_pre({.x = x, .dtype = dt, .x_stride = n * dim, .fn = dfn.get(), .base = dbase.get(), .scale = dscale.get(),
              .u = u.get(), .u_stride = dim, .mix = mode == oc::HcMode::kLayer ? mix.get() : nullptr,
              .workspace = ws.get(), .tokens = T_, .n = n, .dim = dim, .mode = mode, .u_split = u_split,
              .legacy_finalize = legacy, .single_launch = single, .h = fused ? h.get() : nullptr, .h_dtype = hd,
              .h_stride = dim, .h_w = hw},
             nullptr);
  if (!fused)
    oc::rmsnorm({.x = u.get(), .x_dtype = dt, .x_stride = dim, .w = hw, .w_dtype = DType::kF32, .y = h.get(),
                 .y_dtype = hd, .y_stride = dim, .rows = T_, .dim = dim, .legacy = true},
                nullptr);
  FusedOut o{mode == oc::HcMode::kLayer ? mix.download() : std::vector<float>{}, u.download(), h.download()};
  return o;
}

TEST(CudaHc, FusedNormBitIdenticalToUnfused) {
  DI_REQUIRE_GPU();
  uint64_t seed = 9100;
  int cases = 0;
  for (int64_t T_ : {int64_t(1), int64_t(3), int64_t(9), int64_t(64), int64_t(513)})
    for (int64_t dim : {int64_t(4096), int64_t(1000), int64_t(37)})
      for (DType dt : {DType::kF32, DType::kBF16})
        for (oc::HcMode mode : {oc::HcMode::kLayer, oc::HcMode::kHead}) {
          const int n = 4;
          if (T_ == 513 && (mode == oc::HcMode::kHead || dt == DType::kBF16)) continue;  // the prefill tile, once
          const Site st = make_site(n, dim, mode, seed += 10);
          const std::vector<float> X = randn(T_ * n * dim, seed + 3, 1.0f);
          DevArray<float> dXf(X), w(randn(size_t(dim), seed + 4, 0.2f, 1.0f));
          DevArray<uint16_t> dXb(to_bf16(X));
          const void* x = dt == DType::kF32 ? static_cast<const void*>(dXf.get()) : dXb.get();
          for (DType hd : {DType::kBF16, DType::kF32})
            for (bool weighted : {true, false}) {
              if (!weighted && hd == DType::kF32) continue;
              const float* hw = weighted ? w.get() : nullptr;
              const FusedOut ref = run_fused(st, x, dt, T_, n, dim, mode, hd, hw, false, false, 0);
              // -1: the legacy finalize; -2: the single launch forced (its norm after a second cluster
              // barrier, at every token count); -3: the automatic choice (single launch up to 8 tokens).
              for (int split : {0, 1, 3, -1, -2, -3}) {
                const int single = split == -2 ? 1 : split == -3 ? 0 : -1;
                const FusedOut got =
                    run_fused(st, x, dt, T_, n, dim, mode, hd, hw, true, split == -1, std::max(split, 0), single);
                const std::string cs = "u_split " + std::to_string(split) + " T=" + std::to_string(T_) + " D=" +
                                       std::to_string(dim) + " x " + std::string(dtype_name(dt)) + " h " +
                                       std::string(dtype_name(hd)) +
                                       (weighted ? "" : " unweighted") +
                                       (mode == oc::HcMode::kLayer ? " layer" : " head");
                EXPECT_EQ(got.mix, ref.mix) << cs;
                EXPECT_EQ(0, std::memcmp(got.u.data(), ref.u.data(), got.u.size() * 4)) << "u " << cs;
                EXPECT_EQ(0, std::memcmp(got.h.data(), ref.h.data(), got.h.size())) << "h " << cs;
                ++cases;
              }
            }
        }
  EXPECT_EQ(cases, (5 * 3 * 2 * 2 - 3 * 3) * 3 * 6);
  float f = 0;
  oc::HcPreParams bad{.x = &f, .x_stride = 32, .fn = &f, .base = &f, .scale = &f, .u = nullptr, .u_stride = 8,
                      .mix = &f, .workspace = &f, .tokens = 1, .dim = 8, .h = &f, .h_stride = 8};
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);  // h without u
  bad.u = &f;
  bad.h_stride = 4;
  EXPECT_THROW(oc::hc_pre(bad, nullptr), InvalidArgument);  // h stride < dim
}

// The fused norm is batch invariant: token 4's h alone (one token: the widest u split, so the most
// blocks meet at the counter) equals its h in a batch of 9.
TEST(CudaHc, FusedNormBatchInvariant) {
  DI_REQUIRE_GPU();
  const int n = 4;
  const int64_t dim = 4096, T_ = 9;
  const Site st = make_site(n, dim, oc::HcMode::kLayer, 9777);
  const std::vector<float> X = randn(T_ * n * dim, 9780, 1.0f);
  const std::vector<float> X0(X.begin() + 4 * n * dim, X.begin() + 5 * n * dim);
  DevArray<float> dX(X), dX0(X0), w(randn(size_t(dim), 9781, 0.2f, 1.0f));
  const FusedOut all =
      run_fused(st, dX.get(), DType::kF32, T_, n, dim, oc::HcMode::kLayer, DType::kBF16, w.get(), true, false, 0);
  const FusedOut one =
      run_fused(st, dX0.get(), DType::kF32, 1, n, dim, oc::HcMode::kLayer, DType::kBF16, w.get(), true, false, 0);
  EXPECT_EQ(0, std::memcmp(one.h.data(), all.h.data() + 4 * dim * 2, size_t(dim) * 2)) << "h";
  const FusedOut one_single =  // the single launch's norm (second cluster barrier) alone
      run_fused(st, dX0.get(), DType::kF32, 1, n, dim, oc::HcMode::kLayer, DType::kBF16, w.get(), true, false, 0, 1);
  EXPECT_EQ(0, std::memcmp(one_single.h.data(), all.h.data() + 4 * dim * 2, size_t(dim) * 2)) << "h, single launch";
}

TEST(CudaHc, InPlacePostEqualsOutOfPlace) {
  DI_REQUIRE_GPU();
  const int64_t T_ = 7, dim = 256;
  const int n = 4, M = 24;
  std::vector<float> X = randn(T_ * n * dim, 5), y = randn(T_ * dim, 6), mix = randn(T_ * M, 7, 0.3f, 0.5f);
  DevArray<float> dX(X), dy(y), dmix(mix), dout(T_ * n * dim);
  oc::HcPostParams p{.x = dX.get(), .x_stride = n * dim, .y = dy.get(), .y_stride = dim, .mix = dmix.get(),
                     .out = dout.get(), .out_stride = n * dim, .dtype = DType::kF32, .tokens = T_, .n = n, .dim = dim};
  oc::hc_post(p, nullptr);
  p.out = dX.get();
  oc::hc_post(p, nullptr);
  EXPECT_EQ(dout.download(), dX.download());
}

TEST(CudaHc, RejectsTooManyStreams) {
  float f = 0;
  EXPECT_THROW(oc::hc_post({.x = &f, .x_stride = 80, .y = &f, .y_stride = 8, .mix = &f, .out = &f, .out_stride = 80,
                            .tokens = 1, .n = 5, .dim = 8},
                           nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
