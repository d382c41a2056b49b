// Grouped MoE decode (moe_decode.h moe_decode_grouped, issue #13): the step's (token, expert)
// pairs sorted by expert on the device (ops/cuda/moe_route, tiles of kMoeDecodeTileM), each touched
// expert's weights streamed once for all its tokens. SKIPs without a GPU.
//  * vs its host twin: FP4 / FP8 / bf16 weights, odd token counts, experts hit by 0, 1 and more
//    than a tile of tokens, an invalid id, widths that are not multiples of the 128-input chunk or
//    of a block's rows; every warp shape (variant) bit-identical to the default one, including the
//    shared-memory rings v5..v8, the FP4 instruction diet v9..v13 and the bulk-copy rings v14..v16
//    (and those against v3 at the V4 / V4.1 widths); the diet's nibble decode against the
//    reference form on the CPU; the row bands and L2 prefetches of v17..v24 likewise.
//  * batch invariance: a token alone and inside random batches (other positions, other
//    neighbours) gives bit-identical expert outputs.
//  * timing (V4-Flash and V4.1-Flash widths, random top-6 routing, a fresh routing every call):
//    the pair kernel (moe_decode) vs the grouped one vs the grouped prefill GEMM in the same run,
//    GB/s of the DISTINCT expert bytes and their share of the 4.3 TB/s floor.
// Lines "[gpu-moe] ..." are collected by tools/gpu_model_check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/cuda/moe_decode.h"
#include "model/deepseek/cuda/moe_fp4_pairs.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/moe_route.h"
#include "ops/cuda/runtime.h"
#include "ops/cuda/swiglu.h"

namespace deepinfer::model::v4 {
namespace {
using ops::cuda::ExpertFormat;
namespace oc = ops::cuda;

// Random expert matrix [rows, in] in format f (+ its e8m0 scales): unit-scale dot products.
std::vector<uint8_t> rand_matrix(ExpertFormat f, int64_t rows, int64_t in, std::mt19937& g, std::vector<uint8_t>& scale) {
  scale.clear();
  if (f == ExpertFormat::kPlain) {
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    std::vector<uint8_t> w(size_t(rows * in) * 2);
    for (int64_t i = 0; i < rows * in; ++i) {
      const uint16_t h = f32_to_bf16(u(g));
      std::memcpy(w.data() + 2 * i, &h, 2);
    }
    return w;
  }
  std::vector<uint8_t> w(size_t(f == ExpertFormat::kFP4 ? rows * in / 2 : rows * in));
  for (auto& b : w) {
    b = uint8_t(g());
    if (f == ExpertFormat::kFP8 && (b & 0x7f) == 0x7f) b = 0x31;  // no NaN codes
  }
  scale.resize(size_t(rows * (f == ExpertFormat::kFP4 ? in / 32 : (in + 127) / 128)));
  for (auto& s : scale) s = uint8_t((f == ExpertFormat::kFP4 ? 121 : 117) + g() % 5);
  return w;
}

// Host copies of per-expert buffers, their device copies and the device pointer table.
struct Table {
  std::vector<std::vector<uint8_t>> host;
  std::vector<const void*> hptr;
  std::vector<cuda::DeviceBuffer> bufs;
  cuda::DeviceBuffer dtable;
  void upload() {
    std::vector<const void*> d;
    hptr.clear();
    for (const auto& h : host) {
      bufs.emplace_back(std::max<size_t>(h.size(), 16));
      if (!h.empty()) cuda::copy_h2d(bufs.back().data(), h.data(), h.size(), nullptr);
      d.push_back(bufs.back().data());
      hptr.push_back(h.data());
    }
    dtable = cuda::DeviceBuffer(d.size() * sizeof(void*));
    cuda::copy_h2d(dtable.data(), d.data(), d.size() * sizeof(void*), nullptr);
  }
  // n device copies of one host buffer (no host copies kept)
  void upload_copies(const std::vector<uint8_t>& h, int64_t n) {
    std::vector<const void*> d;
    for (int64_t i = 0; i < n; ++i) {
      bufs.emplace_back(h.size());
      cuda::copy_h2d(bufs.back().data(), h.data(), h.size(), nullptr);
      d.push_back(bufs.back().data());
    }
    dtable = cuda::DeviceBuffer(d.size() * sizeof(void*));
    cuda::copy_h2d(dtable.data(), d.data(), d.size() * sizeof(void*), nullptr);
  }
  template <typename T>
  const T* const* dev() const { return static_cast<const T* const*>(dtable.data()); }
  template <typename T>
  const T* const* hst() const { return reinterpret_cast<const T* const*>(hptr.data()); }
};

struct Experts {
  ExpertFormat f;
  Table w13, w2, s13, s2;
  Experts(ExpertFormat fmt, int64_t E, int64_t D, int64_t I, std::mt19937& g) : f(fmt) {
    for (int64_t e = 0; e < E; ++e) {
      std::vector<uint8_t> a, b;
      w13.host.push_back(rand_matrix(f, 2 * I, D, g, a));
      w2.host.push_back(rand_matrix(f, D, I, g, b));
      s13.host.push_back(a);
      s2.host.push_back(b);
    }
    w13.upload(), w2.upload(), s13.upload(), s2.upload();
  }
  void device(gpu::MoeDecodeGroupedParams& p) const {
    p.w13 = w13.dev<void>(), p.w2 = w2.dev<void>(), p.format = f;
    p.w13_scale = f == ExpertFormat::kPlain ? nullptr : s13.dev<uint8_t>();
    p.w2_scale = f == ExpertFormat::kPlain ? nullptr : s2.dev<uint8_t>();
  }
};

// The device routing of a step (moe_route with the grouped decode's tile).
struct Route {
  int64_t T, K, E, max_tiles;
  cuda::DeviceBuffer ids, wts, seg, perm_src, perm_w, comb, tiles, ntiles;
  Route(int64_t t, int64_t k, int64_t e, int tile_m = gpu::kMoeDecodeTileM)
      : T(t), K(k), E(e), max_tiles(oc::moe_route_max_tiles(t * k, e, tile_m)), ids(size_t(t * k) * 4),
        wts(size_t(t * k) * 4), seg(size_t(e + 1) * 4), perm_src(size_t(t * k) * 8), perm_w(size_t(t * k) * 4),
        comb(size_t(t * k) * 8), tiles(size_t(std::max<int64_t>(max_tiles, 1)) * 4), ntiles(4), tile(tile_m) {}
  int tile;
  void set(const std::vector<int32_t>& hid, const std::vector<float>& hw) {
    cuda::copy_h2d(ids.data(), hid.data(), hid.size() * 4, nullptr);
    cuda::copy_h2d(wts.data(), hw.data(), hw.size() * 4, nullptr);
  }
  void run(cudaStream_t s = nullptr) {
    oc::moe_route({.ids = ids.as<int32_t>(), .weights = wts.as<float>(), .tokens = T, .topk = K, .experts = E,
                   .tile_m = tile, .seg = seg.as<int32_t>(), .perm_src = perm_src.as<int64_t>(),
                   .perm_w = perm_w.as<float>(), .comb = comb.as<int64_t>(), .tiles = tiles.as<int32_t>(),
                   .num_tiles = ntiles.as<int32_t>(), .max_tiles = max_tiles},
                  s);
  }
  void params(gpu::MoeDecodeGroupedParams& p) const {
    p.seg = seg.as<int32_t>(), p.perm_src = perm_src.as<int64_t>(), p.perm_w = perm_w.as<float>();
    p.tiles = tiles.as<int32_t>(), p.num_tiles = ntiles.as<int32_t>(), p.max_tiles = max_tiles;
    p.tokens = T, p.topk = K, p.num_experts = E;
  }
  std::vector<int64_t> comb_host() const {
    std::vector<int64_t> c(size_t(T * K));
    cuda::copy_d2h(c.data(), comb.data(), c.size() * 8, nullptr);
    return c;
  }
};

std::vector<uint16_t> rand_x(int64_t n, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> x(static_cast<size_t>(n));
  for (auto& v : x) v = f32_to_bf16(u(g));
  return x;
}

// Runs the grouped decode on the device: ye [T*K, D] f32 in sorted rows (NaN where unwritten).
std::vector<float> run_grouped(const Experts& ex, Route& rt, const cuda::DeviceBuffer& dx, int64_t D, int64_t I,
                               int variant, float limit) {
  const int64_t P = rt.T * rt.K;
  cuda::DeviceBuffer act(size_t(P * I) * 2), ye(size_t(P * D) * 4);
  DI_CUDA_CHECK(cudaMemset(ye.data(), 0xFF, ye.size_bytes()));
  rt.run();
  gpu::MoeDecodeGroupedParams p{.x = dx.data(), .act = act.data(), .ye = ye.as<float>(), .dim = D, .inter = I,
                                .limit = limit, .variant = variant};
  rt.params(p);
  ex.device(p);
  gpu::moe_decode_grouped(p, nullptr);
  std::vector<float> out(size_t(P * D));
  cuda::copy_d2h(out.data(), ye.data(), out.size() * 4, nullptr);
  return out;
}

void twin_case(ExpertFormat f, int64_t T, int64_t E, int64_t K, int64_t D, int64_t I, uint32_t seed) {
  std::mt19937 g(seed);
  const Experts ex(f, E, D, I, g);
  const auto x = rand_x(T * D, g);
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> wts(ids.size());
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (size_t i = 0; i < ids.size(); ++i) {
    // a hot expert (more than a tile of tokens when T is large), the rest uniform; expert E-1 never
    ids[i] = u(g) < 0.4f ? 1 : int32_t(g() % (E - 1));
    wts[i] = 0.25f + 0.5f * u(g);
  }
  if (T > 2) ids[size_t(T * K / 2)] = int32_t(E + 3);  // invalid: no row, skipped by the combine
  // host routing and twin
  const int64_t P = T * K, mt = oc::moe_route_max_tiles(P, E, gpu::kMoeDecodeTileM);
  std::vector<int32_t> seg(size_t(E + 1)), tiles(static_cast<size_t>(mt)), nt(1);
  std::vector<int64_t> perm(static_cast<size_t>(P)), comb(static_cast<size_t>(P));
  std::vector<float> pw(static_cast<size_t>(P));
  oc::moe_route_host({.ids = ids.data(), .weights = wts.data(), .tokens = T, .topk = K, .experts = E,
                      .tile_m = gpu::kMoeDecodeTileM, .seg = seg.data(), .perm_src = perm.data(), .perm_w = pw.data(),
                      .comb = comb.data(), .tiles = tiles.data(), .num_tiles = nt.data(), .max_tiles = mt});
  std::vector<uint16_t> act(size_t(P * I));
  std::vector<float> ye(size_t(P * D), 0.f);
  gpu::MoeDecodeGroupedParams hp{.x = x.data(), .seg = seg.data(), .perm_src = perm.data(), .perm_w = pw.data(),
                                 .tiles = tiles.data(), .num_tiles = nt.data(), .max_tiles = mt,
                                 .w13 = ex.w13.hst<void>(), .w2 = ex.w2.hst<void>(), .format = f,
                                 .w13_scale = ex.s13.hst<uint8_t>(), .w2_scale = ex.s2.hst<uint8_t>(),
                                 .act = act.data(), .ye = ye.data(), .tokens = T, .topk = K, .num_experts = E,
                                 .dim = D, .inter = I, .limit = 0.9f};
  gpu::moe_decode_grouped_host(hp);
  cuda::DeviceBuffer dx(x.size() * 2);
  cuda::copy_h2d(dx.data(), x.data(), x.size() * 2, nullptr);
  Route rt(T, K, E);
  rt.set(ids, wts);
  const auto got = run_grouped(ex, rt, dx, D, I, 0, 0.9f);
  ASSERT_EQ(rt.comb_host(), comb);
  double max_abs = 0, max_ref = 0;
  for (int64_t r = 0; r < seg[size_t(E)]; ++r)
    for (int64_t j = 0; j < D; ++j) {
      const float a = got[size_t(r * D + j)], b = ye[size_t(r * D + j)];
      ASSERT_FALSE(std::isnan(a)) << "unwritten row " << r << " col " << j;
      max_abs = std::max(max_abs, double(std::abs(a - b)));
      max_ref = std::max(max_ref, double(std::abs(b)));
    }
  const double rel = max_abs / std::max(max_ref, 1e-30);
  EXPECT_LE(rel, 8e-3) << oc::expert_format_name(f) << " T=" << T << " D=" << D << " I=" << I;
  std::printf("[gpu-moe] moe_decode_grouped %s T=%lld E=%lld D=%lld I=%lld: max rel err %.2e vs host twin (%d tiles)\n",
              oc::expert_format_name(f), (long long)T, (long long)E, (long long)D, (long long)I, rel, nt[0]);
  for (int v = 1; v <= gpu::kMoeDecodeGroupedVariants; ++v) {  // other shapes: the same sums, bit for bit (4: FP4 by table)
    const auto gv = run_grouped(ex, rt, dx, D, I, v, 0.9f);
    if (v != 4 || f != ExpertFormat::kFP4) {
      EXPECT_EQ(0, std::memcmp(gv.data(), got.data(), size_t(seg[size_t(E)] * D) * 4)) << "variant " << v;
      continue;
    }
    double d = 0;
    for (int64_t i = 0; i < seg[size_t(E)] * D; ++i) d = std::max(d, double(std::abs(gv[size_t(i)] - ye[size_t(i)])));
    EXPECT_LE(d / std::max(max_ref, 1e-30), 8e-3) << "variant 4";
  }
}

TEST(MoeDecodeGrouped, MatchesHostTwin) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  uint32_t seed = 70;
  for (ExpertFormat f : {ExpertFormat::kFP4, ExpertFormat::kFP8, ExpertFormat::kPlain}) {
    twin_case(f, 1, 5, 2, 96, 160, ++seed);
    twin_case(f, 7, 5, 3, 96, 160, ++seed);
    twin_case(f, 33, 9, 2, 224, 96, ++seed);   // hot expert: > 8 rows, several tiles
  }
  twin_case(ExpertFormat::kFP4, 19, 12, 6, 544, 288, ++seed);  // K tail chunk of 32, rows past the block
  // widths multiples of 128: v5 copies FP4 scales by cp.async (else by plain loads)
  twin_case(ExpertFormat::kFP4, 13, 7, 3, 256, 384, ++seed);
  twin_case(ExpertFormat::kFP8, 13, 7, 3, 256, 384, ++seed);
}

// The shared-memory rings (v5..v8) and the instruction diet (v9..v13) against v3 at the model widths, bit for bit:
// FP4 / FP8 / bf16 weights, odd tile fills (a hot expert over several tiles, experts with 1..8
// rows), an invalid id; ye of every written row compared as bytes.
TEST(MoeDecodeGrouped, SharedRingMatchesV3AtModelWidths) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  struct Width {
    const char* name;
    int64_t D, I;
  };
  uint32_t seed = 400;
  for (const Width w : {Width{"V4-Flash", 4096, 2048}, Width{"V4.1-Flash", 5120, 2304}})
    for (ExpertFormat f : {ExpertFormat::kFP4, ExpertFormat::kFP8, ExpertFormat::kPlain}) {
      std::mt19937 g(++seed);
      const int64_t E = f == ExpertFormat::kPlain ? 3 : 5, T = 13, K = 3, P = T * K;
      const Experts ex(f, E, w.D, w.I, g);
      const auto x = rand_x(T * w.D, g);
      std::vector<int32_t> ids(static_cast<size_t>(P));
      std::vector<float> wts(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = g() % 2 ? 1 : int32_t(g() % E), wts[i] = 0.2f + float(i % 7) / 9.f;
      ids[7] = int32_t(E + 2);  // invalid: no row
      cuda::DeviceBuffer dx(x.size() * 2);
      cuda::copy_h2d(dx.data(), x.data(), x.size() * 2, nullptr);
      Route rt(T, K, E);
      rt.set(ids, wts);
      const auto ref = run_grouped(ex, rt, dx, w.D, w.I, 3, 0.9f);
      std::vector<int32_t> seg(size_t(E + 1));
      cuda::copy_d2h(seg.data(), rt.seg.data(), seg.size() * 4, nullptr);
      const int64_t rows = seg[size_t(E)];
      ASSERT_EQ(rows, P - 1);
      for (int64_t i = 0; i < rows * w.D; ++i) ASSERT_FALSE(std::isnan(ref[size_t(i)])) << "v3 left element " << i;
      for (int v = 5; v <= gpu::kMoeDecodeGroupedVariants; ++v) {
        const auto got = run_grouped(ex, rt, dx, w.D, w.I, v, 0.9f);
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), size_t(rows * w.D) * 4))
            << w.name << " " << oc::expert_format_name(f) << " variant " << v;
      }
      std::printf("[gpu-moe] moe_decode_grouped %s %s: v5..v24 == v3 bit for bit (%lld rows x %lld)\n", w.name,
                  oc::expert_format_name(f), (long long)rows, (long long)w.D);
    }
}

// CPU only: the grouped twin over moe_route_host's permutation gives the pair twin's numbers (both
// sum in input order), row for row through comb; all formats, a hot expert, an invalid id.
TEST(MoeDecodeGrouped, HostTwinMatchesPairTwin) {
  const int64_t T = 11, E = 6, K = 3, D = 96, I = 64;
  uint32_t seed = 3;
  for (ExpertFormat f : {ExpertFormat::kFP4, ExpertFormat::kFP8, ExpertFormat::kPlain}) {
    std::mt19937 g(++seed);
    std::vector<std::vector<uint8_t>> w13, w2, s13, s2;
    std::vector<const void*> p13, p2;
    std::vector<const uint8_t*> ps13, ps2;
    for (int64_t e = 0; e < E; ++e) {
      std::vector<uint8_t> a, b;
      w13.push_back(rand_matrix(f, 2 * I, D, g, a));
      w2.push_back(rand_matrix(f, D, I, g, b));
      s13.push_back(a);
      s2.push_back(b);
    }
    for (int64_t e = 0; e < E; ++e)
      p13.push_back(w13[size_t(e)].data()), p2.push_back(w2[size_t(e)].data()), ps13.push_back(s13[size_t(e)].data()),
          ps2.push_back(s2[size_t(e)].data());
    const auto x = rand_x(T * D, g);
    std::vector<int32_t> ids(size_t(T * K));
    std::vector<float> wts(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = g() % 2 ? 2 : int32_t(g() % E), wts[i] = 0.3f + float(i % 5) / 7.f;
    ids[4] = -1;
    const int64_t P = T * K, mt = oc::moe_route_max_tiles(P, E, gpu::kMoeDecodeTileM);
    std::vector<int32_t> seg(size_t(E + 1)), tiles(static_cast<size_t>(mt)), nt(1);
    std::vector<int64_t> perm(static_cast<size_t>(P)), comb(static_cast<size_t>(P));
    std::vector<float> pw(static_cast<size_t>(P));
    oc::moe_route_host({.ids = ids.data(), .weights = wts.data(), .tokens = T, .topk = K, .experts = E,
                        .tile_m = gpu::kMoeDecodeTileM, .seg = seg.data(), .perm_src = perm.data(),
                        .perm_w = pw.data(), .comb = comb.data(), .tiles = tiles.data(), .num_tiles = nt.data(),
                        .max_tiles = mt});
    std::vector<uint16_t> act(size_t(P * I)), act2(size_t(P * I));
    std::vector<float> ye(size_t(P * D), 0.f), ye2(size_t(P * D), 0.f);
    gpu::moe_decode_grouped_host({.x = x.data(), .seg = seg.data(), .perm_src = perm.data(), .perm_w = pw.data(),
                                  .tiles = tiles.data(), .num_tiles = nt.data(), .max_tiles = mt, .w13 = p13.data(),
                                  .w2 = p2.data(), .format = f, .w13_scale = ps13.data(), .w2_scale = ps2.data(),
                                  .act = act.data(), .ye = ye.data(), .tokens = T, .topk = K, .num_experts = E,
                                  .dim = D, .inter = I, .limit = 0.8f});
    gpu::moe_decode_host({.x = x.data(), .expert_ids = ids.data(), .weights = wts.data(), .w13 = p13.data(),
                          .w2 = p2.data(), .format = f, .w13_scale = ps13.data(), .w2_scale = ps2.data(),
                          .act = act2.data(), .ye = ye2.data(), .tokens = T, .topk = K, .num_experts = E, .dim = D,
                          .inter = I, .dtype = DType::kBF16, .limit = 0.8f});
    EXPECT_EQ(comb[4], -1);
    for (int64_t a = 0; a < P; ++a) {
      if (comb[size_t(a)] < 0) continue;
      EXPECT_EQ(0, std::memcmp(ye.data() + comb[size_t(a)] * D, ye2.data() + a * D, size_t(D) * 4))
          << oc::expert_format_name(f) << " pair " << a;
    }
  }
}

// CPU only: v9's FP4 decode (13 instructions per word) gives v1..v3's words bit for bit: every
// nibble value at every position among random neighbours, random words, the all-sign / all-max words.
TEST(MoeFp4Pairs, MatchesReference) {
  namespace mg = gpu::moe_grouped;
  std::mt19937 g(13);
  auto check = [](uint32_t w) {
    uint32_t o[4];
    mg::fp4_pair_words(w, o);
    for (int q = 0; q < 4; ++q)
      if (o[q] != mg::fp4_pair_bits_ref(w, q)) {
        ADD_FAILURE() << "word " << std::hex << w << " q " << q << ": " << o[q] << " vs " << mg::fp4_pair_bits_ref(w, q);
        return false;
      }
    return true;
  };
  for (uint32_t w : {0u, 0xFFFFFFFFu, 0x88888888u, 0x77777777u, 0x80808080u, 0x08080808u, 0x12345678u}) ASSERT_TRUE(check(w));
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t c = 0; c < 16; ++c)
      for (int r = 0; r < 256; ++r) {
        const uint32_t w = (uint32_t(g()) & ~(0xFu << (4 * pos))) | (c << (4 * pos));
        ASSERT_TRUE(check(w));
      }
  for (int r = 0; r < 1 << 20; ++r) ASSERT_TRUE(check(uint32_t(g())));
  // the words are e2m1 * 2^-126 as bf16 bits: nibble 0 of word 0 through the numeric reference
  for (uint32_t c = 0; c < 16; ++c) {
    uint32_t o[4];
    mg::fp4_pair_words(c | (c << 16), o);
    EXPECT_EQ(bf16_to_f32(uint16_t(o[0] & 0xFFFF)), fp4e2m1_to_f32(uint8_t(c)) * std::ldexp(1.f, -126)) << c;
    EXPECT_EQ(o[0] >> 16, o[0] & 0xFFFF) << c;
  }
}

TEST(MoeDecodeGrouped, RejectsUnsupportedShapes) {
  EXPECT_FALSE(gpu::moe_decode_grouped_supported(DType::kF32, 64, 64));
  EXPECT_FALSE(gpu::moe_decode_grouped_supported(DType::kBF16, 48, 64));
  EXPECT_TRUE(gpu::moe_decode_grouped_supported(DType::kBF16, 96, 160));
  std::vector<float> ye(1);
  gpu::MoeDecodeGroupedParams p{.ye = ye.data(), .tokens = 0, .topk = 1, .num_experts = 1, .dim = 40, .inter = 64};
  EXPECT_THROW(gpu::moe_decode_grouped_host(p), InvalidArgument);
  p.dim = 64;
  p.tokens = 2;
  p.max_tiles = 1;  // below moe_route's bound
  EXPECT_THROW(gpu::moe_decode_grouped_host(p), InvalidArgument);
  // diagnostic (load-only) variants: FP4 and widths multiples of 128 only; no variant past them
  gpu::MoeDecodeGroupedParams q{.ye = ye.data(), .tokens = 0, .topk = 1, .num_experts = 1, .dim = 128, .inter = 128};
  q.format = ExpertFormat::kFP8, q.variant = gpu::kMoeDecodeGroupedProbeFirst;
  EXPECT_THROW(gpu::moe_decode_grouped_host(q), InvalidArgument);
  q.format = ExpertFormat::kFP4, q.dim = 96;
  EXPECT_THROW(gpu::moe_decode_grouped_host(q), InvalidArgument);
  q.dim = 128, q.variant = gpu::kMoeDecodeGroupedVariants + 1;
  EXPECT_THROW(gpu::moe_decode_grouped_host(q), InvalidArgument);
}

// A token's expert outputs do not depend on the batch: alone, and inside two batches (different
// positions and neighbours, tiles shared with other tokens), bit for bit.
TEST(MoeDecodeGrouped, BatchInvariant) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const int64_t E = 24, K = 6, D = 384, I = 256, T = 40;  // multiples of 128: v14..v16's rings run
  std::mt19937 g(91);
  const Experts ex(ExpertFormat::kFP4, E, D, I, g);
  const auto x = rand_x(T * D, g);
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> wts(ids.size());
  for (int64_t t = 0; t < T; ++t) {  // distinct experts per token; experts 0-3 are hot
    std::set<int32_t> s;
    while (int64_t(s.size()) < K) s.insert(g() % 3 == 0 ? int32_t(g() % 4) : int32_t(g() % E));
    int k = 0;
    for (int32_t e : s) {
      ids[size_t(t * K + k)] = e;
      wts[size_t(t * K + k)] = 0.1f + float(k) / 8.f;
      ++k;
    }
  }
  // Expert outputs of token rows `tok` (a batch): out[i][k] = ye row of (tok[i], k).
  // DI_MOE_GROUPED_TEST_VARIANTS="14,16" narrows the list (compute-sanitizer runs of one kernel)
  std::vector<int> variants{0, 5, 7, 8, 9, 11, 14, 15, 16, 17, 19, 20, 23};
  if (const char* only = std::getenv("DI_MOE_GROUPED_TEST_VARIANTS")) {
    variants.clear();
    for (const char* c = only; *c;) {
      char* end = nullptr;
      variants.push_back(int(std::strtol(c, &end, 10)));
      c = *end ? end + 1 : end;
    }
  }
  for (int variant : variants) {
    auto batch = [&](const std::vector<int64_t>& tok) {
      const int64_t n = int64_t(tok.size());
      std::vector<uint16_t> bx(size_t(n * D));
      std::vector<int32_t> bi(size_t(n * K));
      std::vector<float> bw(size_t(n * K));
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(x.begin() + tok[size_t(i)] * D, D, bx.begin() + i * D);
        std::copy_n(ids.begin() + tok[size_t(i)] * K, K, bi.begin() + i * K);
        std::copy_n(wts.begin() + tok[size_t(i)] * K, K, bw.begin() + i * K);
      }
      cuda::DeviceBuffer dx(bx.size() * 2);
      cuda::copy_h2d(dx.data(), bx.data(), bx.size() * 2, nullptr);
      Route rt(n, K, E);
      rt.set(bi, bw);
      const auto ye = run_grouped(ex, rt, dx, D, I, variant, 7.f);
      const auto comb = rt.comb_host();
      std::vector<std::vector<float>> out(size_t(n * K));
      for (int64_t a = 0; a < n * K; ++a)
        out[size_t(a)].assign(ye.begin() + comb[size_t(a)] * D, ye.begin() + (comb[size_t(a)] + 1) * D);
      return out;
    };
    std::vector<int64_t> all(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) all[size_t(t)] = t;
    const auto full = batch(all);
    std::vector<int64_t> sub(all);
    std::shuffle(sub.begin(), sub.end(), g);
    sub.resize(17);
    const auto part = batch(sub);
    int checked = 0;
    for (int64_t i = 0; i < int64_t(sub.size()); ++i) {
      const int64_t t = sub[size_t(i)];
      const auto alone = i < 4 ? batch({t}) : std::vector<std::vector<float>>{};
      for (int64_t k = 0; k < K; ++k) {
        const auto& f = full[size_t(t * K + k)];
        EXPECT_EQ(0, std::memcmp(f.data(), part[size_t(i * K + k)].data(), size_t(D) * 4)) << "token " << t << " k " << k;
        if (!alone.empty()) {
          EXPECT_EQ(0, std::memcmp(f.data(), alone[size_t(k)].data(), size_t(D) * 4)) << "token " << t;
        }
        ++checked;
      }
    }
    std::printf("[gpu-moe] moe_decode_grouped variant %d batch invariance: %d (token, k) rows bit-identical across 3 batch "
                "shapes\n", variant, checked);
  }
}

// ---- timing ----
struct Timer {
  cudaEvent_t a{}, b{};
  Timer() {
    DI_CUDA_CHECK(cudaEventCreate(&a));
    DI_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
  template <typename F>
  double us(int reps, F&& f) {
    f(0);  // warm-up
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    DI_CUDA_CHECK(cudaEventRecord(a));
    for (int r = 0; r < reps; ++r) f(r);
    DI_CUDA_CHECK(cudaEventRecord(b));
    DI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0 * ms / reps;
  }
};

void timing(const char* name, int64_t E, int64_t K, int64_t D, int64_t I) {
  const ExpertFormat f = ExpertFormat::kFP4;
  std::mt19937 g(5);
  std::vector<uint8_t> s13, s2;
  const auto w13 = rand_matrix(f, 2 * I, D, g, s13);
  const auto w2 = rand_matrix(f, D, I, g, s2);
  Table t13, t2, ts13, ts2;  // E copies of one random expert (each read from its own memory)
  t13.upload_copies(w13, E), t2.upload_copies(w2, E), ts13.upload_copies(s13, E), ts2.upload_copies(s2, E);
  const double expert_bytes = double(w13.size() + s13.size() + w2.size() + s2.size());
  const int64_t Tmax = 256, NR = 8;  // NR routings per batch size, cycled call by call
  cuda::DeviceBuffer dx(size_t(Tmax * D) * 2), act(size_t(Tmax * K * I) * 2), gu(size_t(Tmax * K * 2 * I) * 2),
      ye(size_t(Tmax * K * D) * 4), ye_old(size_t(Tmax * K * D) * 4);
  {
    const auto hx = rand_x(Tmax * D, g);
    cuda::copy_h2d(dx.data(), hx.data(), hx.size() * 2, nullptr);
  }
  Timer tm;
  const int reps = 24;
  for (int64_t T : {1, 8, 32, 64, 128, 256}) {
    std::vector<Route> rts, rts64;
    double distinct = 0;
    for (int64_t r = 0; r < NR; ++r) {
      std::vector<int32_t> ids(size_t(T * K));
      std::vector<float> wts(ids.size(), 1.f / float(K));
      std::set<int32_t> touched;
      for (int64_t t = 0; t < T; ++t) {
        std::set<int32_t> s;
        while (int64_t(s.size()) < K) s.insert(int32_t(g() % E));
        int k = 0;
        for (int32_t e : s) ids[size_t(t * K + k++)] = e, touched.insert(e);
      }
      distinct += double(touched.size()) / NR;
      rts.emplace_back(T, K, E);
      rts.back().set(ids, wts);
      rts64.emplace_back(T, K, E, oc::kGroupedTileM);
      rts64.back().set(ids, wts);
    }
    const double dbytes = distinct * expert_bytes, pbytes = double(T * K) * expert_bytes;
    auto rate = [&](double us) { return dbytes / us / 1e3; };  // GB/s of distinct bytes
    gpu::MoeDecodeGroupedParams gp{.x = dx.data(), .act = act.data(), .ye = ye.as<float>(), .dim = D, .inter = I,
                                   .limit = 10.f};
    gp.w13 = t13.dev<void>(), gp.w2 = t2.dev<void>(), gp.format = f, gp.w13_scale = ts13.dev<uint8_t>(),
    gp.w2_scale = ts2.dev<uint8_t>();
    constexpr int kNv = gpu::kMoeDecodeGroupedVariants + 1;
    double t_new[kNv];
    for (int v = 0; v < kNv; ++v)
      t_new[v] = tm.us(reps, [&](int r) {
        Route& rt = rts[size_t(r % NR)];
        rt.run();
        gpu::MoeDecodeGroupedParams p = gp;
        rt.params(p);
        p.variant = v;
        gpu::moe_decode_grouped(p, nullptr);
      });
    const double t_route = tm.us(reps, [&](int r) { rts[size_t(r % NR)].run(); });
    double t_old = 0;
    if (T <= gpu::kMoeDecodeMaxTokens) {
      t_old = tm.us(reps, [&](int r) {
        const Route& rt = rts[size_t(r % NR)];
        gpu::moe_decode({.x = dx.data(), .expert_ids = rt.ids.as<int32_t>(), .weights = rt.wts.as<float>(),
                         .w13 = gp.w13, .w2 = gp.w2, .format = f, .w13_scale = gp.w13_scale, .w2_scale = gp.w2_scale,
                         .act = act.data(), .ye = ye_old.as<float>(), .tokens = T, .topk = K, .num_experts = E,
                         .dim = D, .inter = I, .dtype = DType::kBF16, .limit = 10.f},
                        nullptr);
      });
    }
    const double t_gemm = tm.us(reps, [&](int r) {  // the prefill path: route (tile 64), GEMM, swiglu, GEMM
      Route& rt = rts64[size_t(r % NR)];
      rt.run();
      oc::GroupedGemmParams q{.x = dx.data(), .ldx = D, .x_rows = rt.perm_src.as<int64_t>(), .w = gp.w13,
                              .scale = gp.w13_scale, .format = f, .seg = rt.seg.as<int32_t>(),
                              .tiles = rt.tiles.as<int32_t>(), .num_tiles = rt.ntiles.as<int32_t>(),
                              .max_tiles = rt.max_tiles, .experts = E, .N = 2 * I, .K = D, .y = gu.data(),
                              .ldy = 2 * I, .y_dtype = DType::kBF16};
      oc::grouped_gemm(q, nullptr);
      oc::swiglu({.gate = gu.data(), .gate_stride = 2 * I, .up = gu.as<uint16_t>() + I, .up_stride = 2 * I,
                  .in_dtype = DType::kBF16, .row_weight = rt.perm_w.as<float>(), .out = act.data(), .out_stride = I,
                  .out_dtype = DType::kBF16, .rows = T * K, .inter = I, .limit = 10.f},
                 nullptr);
      q.x = act.data(), q.ldx = I, q.x_rows = nullptr, q.w = gp.w2, q.scale = gp.w2_scale, q.N = D, q.K = I;
      q.y = ye.data(), q.ldy = D, q.y_dtype = DType::kF32;
      oc::grouped_gemm(q, nullptr);
    });
    // load-only probes of the access patterns (moe_decode.h): v9's (v3's), v13's, v14..v16's rings
    constexpr int kNp = gpu::kMoeDecodeGroupedProbeLast - gpu::kMoeDecodeGroupedProbeFirst + 1;
    double t_probe[kNp];
    for (int v = 0; v < kNp; ++v)
      t_probe[v] = tm.us(reps, [&](int r) {
        Route& rt = rts[size_t(r % NR)];
        rt.run();
        gpu::MoeDecodeGroupedParams p = gp;
        rt.params(p);
        p.variant = gpu::kMoeDecodeGroupedProbeFirst + v;
        gpu::moe_decode_grouped(p, nullptr);
      });
    const int vb = int(std::min_element(t_new, t_new + kNv) - t_new);
    std::printf("[gpu-moe] grouped-decode %s B=%lld: %.1f distinct experts (%.0f MB; pairs %.0f MB) | pair kernel %s | "
                "grouped v0 %.1f us %.0f GB/s %.0f%% (v1 %.1f v2 %.1f v3 %.1f table v4 %.1f | smem v5 %.1f us %.0f GB/s %.0f%% "
                "v6 %.1f v7 %.1f v8 %.1f | diet v9 %.1f us %.0f GB/s %.0f%% v10 %.1f v11 %.1f v12 %.1f v13 %.1f; best v%d %.0f%%; route %.1f us) | "
                "prefill GEMM %.1f us %.0f%%\n",
                name, (long long)T, distinct, dbytes / 1e6, pbytes / 1e6,
                t_old > 0 ? (std::to_string(int(t_old * 10) / 10.0).substr(0, 6) + " us " +
                             std::to_string(int(rate(t_old))) + " GB/s " + std::to_string(int(100 * rate(t_old) / 4300)) + "%")
                                .c_str()
                          : "-",
                t_new[0], rate(t_new[0]), 100 * rate(t_new[0]) / 4300, t_new[1], t_new[2], t_new[3], t_new[4],
                t_new[5], rate(t_new[5]), 100 * rate(t_new[5]) / 4300, t_new[6], t_new[7], t_new[8], t_new[9],
                rate(t_new[9]), 100 * rate(t_new[9]) / 4300, t_new[10], t_new[11], t_new[12], t_new[13], vb,
                100 * rate(t_new[vb]) / 4300, t_route, t_gemm, 100 * rate(t_gemm) / 4300);
    std::printf("[gpu-moe] grouped-decode %s B=%lld: bulk ring v14 %.1f us %.0f GB/s %.0f%% v15 %.1f us %.0f GB/s v16 %.1f us "
                "%.0f GB/s | v13 %.1f us %.0f GB/s v6 %.1f us %.0f GB/s v9 %.1f v10 %.1f | load-only: v3 addressing %.1f us "
                "%.0f GB/s, v13's %.1f us %.0f GB/s, ring 8x512x4 %.1f us %.0f GB/s, 8x1024x2 %.1f us %.0f GB/s, 4x512x3 %.1f "
                "us %.0f GB/s, 4x2048x2 %.1f us %.0f GB/s (times include route %.1f us)\n",
                name, (long long)T, t_new[14], rate(t_new[14]), 100 * rate(t_new[14]) / 4300, t_new[15], rate(t_new[15]),
                t_new[16], rate(t_new[16]), t_new[13], rate(t_new[13]), t_new[6], rate(t_new[6]), t_new[9], t_new[10],
                t_probe[0], rate(t_probe[0]), t_probe[1], rate(t_probe[1]), t_probe[2], rate(t_probe[2]), t_probe[3],
                rate(t_probe[3]), t_probe[4], rate(t_probe[4]), t_probe[5], rate(t_probe[5]), t_route);
    if (T == 32) {  // same routing: the grouped result vs the pair kernel's, through comb
      Route& rt = rts[0];
      rt.run();
      gpu::MoeDecodeGroupedParams p = gp;
      rt.params(p);
      gpu::moe_decode_grouped(p, nullptr);
      gpu::moe_decode({.x = dx.data(), .expert_ids = rt.ids.as<int32_t>(), .weights = rt.wts.as<float>(), .w13 = gp.w13,
                       .w2 = gp.w2, .format = f, .w13_scale = gp.w13_scale, .w2_scale = gp.w2_scale, .act = act.data(),
                       .ye = ye_old.as<float>(), .tokens = T, .topk = K, .num_experts = E, .dim = D, .inter = I,
                       .dtype = DType::kBF16, .limit = 10.f},
                      nullptr);
      std::vector<float> a(size_t(T * K * D)), b(a.size());
      cuda::copy_d2h(a.data(), ye.data(), a.size() * 4, nullptr);
      cuda::copy_d2h(b.data(), ye_old.data(), b.size() * 4, nullptr);
      const auto comb = rt.comb_host();
      double max_abs = 0, max_ref = 0;
      for (int64_t q = 0; q < T * K; ++q)
        for (int64_t j = 0; j < D; ++j) {
          max_abs = std::max(max_abs, double(std::abs(a[size_t(comb[size_t(q)] * D + j)] - b[size_t(q * D + j)])));
          max_ref = std::max(max_ref, double(std::abs(b[size_t(q * D + j)])));
        }
      const double rel = max_abs / std::max(max_ref, 1e-30);
      EXPECT_LE(rel, 1e-2) << name;
      std::printf("[gpu-moe] grouped-decode %s B=32: max rel diff %.2e vs the pair kernel\n", name, rel);
    }
  }
}

// The up and the down kernel timed apart (session 16, issue #13 item 5): per variant, the grouped
// decode's kernels alone (the NR routings are computed once before timing, so the route is NOT in
// these times, unlike timing() above), GB/s of the distinct experts' bytes of that kernel's matrix
// (w13 + scales for up, w2 + scales for down) and their share of the card's bandwidth (3.35 TB/s
// H100 SXM, 4.3 TB/s measured H200; other cards: the H100's figure).
void timing_kernels(const char* name, int64_t E, int64_t K, int64_t D, int64_t I, const std::vector<int>& variants) {
  const ExpertFormat f = ExpertFormat::kFP4;
  std::mt19937 g(7);
  std::vector<uint8_t> s13, s2;
  const auto w13 = rand_matrix(f, 2 * I, D, g, s13);
  const auto w2 = rand_matrix(f, D, I, g, s2);
  Table t13, t2, ts13, ts2;
  t13.upload_copies(w13, E), t2.upload_copies(w2, E), ts13.upload_copies(s13, E), ts2.upload_copies(s2, E);
  const double up_bytes = double(w13.size() + s13.size()), down_bytes = double(w2.size() + s2.size());
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const bool h200 = std::string(prop.name).find("H200") != std::string::npos;
  const double floor_gbs = h200 ? 4300 : 3350;
  const int64_t Tmax = 64, NR = 8;
  cuda::DeviceBuffer dx(size_t(Tmax * D) * 2), act(size_t(Tmax * K * I) * 2), ye(size_t(Tmax * K * D) * 4);
  {
    const auto hx = rand_x(Tmax * D, g);
    cuda::copy_h2d(dx.data(), hx.data(), hx.size() * 2, nullptr);
  }
  Timer tm;
  const int reps = 30;
  for (int64_t T : {1, 8, 32, 64}) {
    std::vector<Route> rts;
    double distinct = 0;
    for (int64_t r = 0; r < NR; ++r) {
      std::vector<int32_t> ids(size_t(T * K));
      std::vector<float> wts(ids.size(), 1.f / float(K));
      std::set<int32_t> touched;
      for (int64_t t = 0; t < T; ++t) {
        std::set<int32_t> st;
        while (int64_t(st.size()) < K) st.insert(int32_t(g() % E));
        int k = 0;
        for (int32_t e : st) ids[size_t(t * K + k++)] = e, touched.insert(e);
      }
      distinct += double(touched.size()) / NR;
      rts.emplace_back(T, K, E);
      rts.back().set(ids, wts);
      rts.back().run();
    }
    gpu::MoeDecodeGroupedParams gp{.x = dx.data(), .act = act.data(), .ye = ye.as<float>(), .dim = D, .inter = I,
                                   .limit = 10.f};
    gp.w13 = t13.dev<void>(), gp.w2 = t2.dev<void>(), gp.format = f, gp.w13_scale = ts13.dev<uint8_t>(),
    gp.w2_scale = ts2.dev<uint8_t>();
    for (int kernels : {1, 2, 3}) {
      const double bytes = distinct * (kernels == 1 ? up_bytes : kernels == 2 ? down_bytes : up_bytes + down_bytes);
      std::string line;
      for (int v : variants) {
        const double us = tm.us(reps, [&](int r) {
          gpu::MoeDecodeGroupedParams p = gp;
          rts[size_t(r % NR)].params(p);
          p.variant = v, p.kernels = kernels;
          gpu::moe_decode_grouped(p, nullptr);
        });
        const double gbs = bytes / us / 1e3;
        char b[96];
        std::snprintf(b, sizeof b, " | v%d %.1f us %.0f GB/s %.0f%%", v, us, gbs, 100 * gbs / floor_gbs);
        line += b;
      }
      std::printf("[gpu-moe] kernels %s B=%lld %s: %.1f distinct experts, %.0f MB (%s, share of %.2f TB/s)%s\n", name,
                  (long long)T, kernels == 1 ? "up" : kernels == 2 ? "down" : "up+down", distinct, bytes / 1e6,
                  prop.name, floor_gbs / 1e3, line.c_str());
    }
  }
}

TEST(MoeDecodeGrouped, TimingKernels) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::vector<int> variants{0,  9,  13, 17, 18, 19, 20, 21, 22, 23, 24, gpu::kMoeDecodeGroupedProbeFirst,
                                  gpu::kMoeDecodeGroupedProbeFirst + 1, gpu::kMoeDecodeGroupedProbeFirst + 6,
                                  gpu::kMoeDecodeGroupedProbeFirst + 7};
  timing_kernels("V4-Flash (E 256 top-6, D 4096, I 2048)", 256, 6, 4096, 2048, variants);
  timing_kernels("V4.1-Flash (E 384 top-6, D 5120, I 2304)", 384, 6, 5120, 2304, variants);
}

TEST(MoeDecodeGrouped, Timing) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  timing("V4-Flash (E 256 top-6, D 4096, I 2048)", 256, 6, 4096, 2048);
  timing("V4.1-Flash (E 384 top-6, D 5120, I 2304)", 384, 6, 5120, 2304);
}

}  // namespace
}  // namespace deepinfer::model::v4
