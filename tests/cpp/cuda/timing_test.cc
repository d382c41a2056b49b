// Small timings for tools/gpu_check.sh (not a benchmark suite: bench/ holds those). Median of
// 20 event-timed launches after warm-up, inputs random and larger than L2 where it matters.
#include <algorithm>
#include <functional>
#include <numeric>

#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/quant.h"
#include "ops/cuda/router.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;


// hc_pre at decode token counts: the partial-sum grid with one block per (chunk, token tile), as
// before session 11 (16 blocks at one token, V4's n*D = 16384), against the automatic mix split.
TEST(CudaTiming, HcPreMixSplit) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  for (int64_t T_ : {int64_t(1), int64_t(4), int64_t(16), int64_t(64)}) {
    const int64_t D = 4096;
    DevArray<uint16_t> x(to_bf16(randn(T_ * 4 * D, 3))), u(T_ * D);
    DevArray<float> fn(randn(24 * 4 * D, 4, 0.05f)), base(randn(24, 5)), sc(randn(3, 6)), mix(T_ * 24);
    DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, 4, D, oc::HcMode::kLayer) / 4 + 1);
    for (int split : {1, 0}) {  // 1: one block per (chunk, token tile), as before session 11; 0: the automatic split
      const double us = median_us([&](cudaStream_t q) {
        oc::hc_pre({.x = x.get(), .x_stride = 4 * D, .fn = fn.get(), .base = base.get(), .scale = sc.get(), .u = u.get(),
                    .u_stride = D, .mix = mix.get(), .workspace = ws.get(), .tokens = T_, .dim = D, .mix_split = split,
                    .single_launch = -1},
                   q);
      }, s);
      report_time("hc_pre", "bf16 T=" + std::to_string(T_) + " D=4096 mix_split=" + std::to_string(split), us,
                  tflops(2.0 * T_ * 24 * 4 * D, us) + ", " + gbps(T_ * 4 * D * 2.0 + 24 * 4 * D * 4.0, us));
    }
  }
}

// hc_pre (partials + finalize) with the legacy one-block finalize against the wide one (session 13),
// f32 streams as the CUDA backend holds them (bf16 at one token for the older figures), with u and
// mixes only (the single-pass wiring's call: no u), V4's n = 4, D = 4096.
TEST(CudaTiming, HcPreFinalize) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int64_t D = 4096;
  struct Case { int64_t T; DType dt; bool u; };
  for (Case c : {Case{1, DType::kF32, true}, Case{1, DType::kF32, false}, Case{1, DType::kBF16, true},
                 Case{4, DType::kF32, true}, Case{16, DType::kF32, true}, Case{64, DType::kF32, true},
                 Case{512, DType::kF32, true}}) {
    const size_t elem = c.dt == DType::kF32 ? 4 : 2;
    DevArray<float> xf(randn(c.T * 4 * D, 3)), u(c.T * D);
    DevArray<uint16_t> xb(to_bf16(randn(c.dt == DType::kBF16 ? c.T * 4 * D : 1, 3)));
    const void* xp = c.dt == DType::kF32 ? static_cast<const void*>(xf.get()) : xb.get();
    DevArray<float> fn(randn(24 * 4 * D, 4, 0.05f)), base(randn(24, 5)), sc(randn(3, 6)), mix(c.T * 24);
    DevArray<float> ws(oc::hc_pre_workspace_bytes(c.T, 4, D, oc::HcMode::kLayer) / 4 + 1);
    // One call between events carries its launch and submission (~30 us at one token, session 13);
    // 50 calls back to back keep the queue full, so their mean is the device time of one call.
    for (int reps : {1, 50})
      for (bool legacy : {true, false}) {
        const double us = median_us([&](cudaStream_t q) {
          for (int r = 0; r < reps; ++r)
            oc::hc_pre({.x = xp, .dtype = c.dt, .x_stride = 4 * D, .fn = fn.get(), .base = base.get(),
                        .scale = sc.get(), .u = c.u ? u.get() : nullptr, .u_stride = D, .mix = mix.get(),
                        .workspace = ws.get(), .tokens = c.T, .dim = D, .legacy_finalize = legacy,
                        .single_launch = -1},  // the two-kernel forms (CudaTiming.HcSiteGraph: the single launch)
                       q);
        }, s) / reps;
        report_time("hc_pre", std::string(dtype_name(c.dt)) + " T=" + std::to_string(c.T) + (c.u ? "" : " mixes only") +
                                  (legacy ? " legacy finalize" : " wide finalize") +
                                  (reps > 1 ? " (mean of 50 back to back)" : ""),
                    us, gbps(c.T * 4 * D * double(elem) + 24 * 4 * D * 4.0, us));
      }
  }
}

// rmsnorm at the decode step's shapes (V4-Flash, B = 1 and 8) and two prefill ones: the legacy
// two-pass kernel against the session-15 kernels (warp per row up to 1,024, register row beyond),
// per launch in a CUDA graph of 20 (as a captured step runs them). Same bits (norm_test.cc).
TEST(CudaTiming, RmsNormDecode) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  struct Shape {
    int64_t rows, dim;
    DType xd;
    bool weighted;
    const char* what;
  };
  const Shape shapes[] = {{1, 4096, DType::kF32, true, "site norm B=1"},
                          {8, 4096, DType::kF32, true, "site norm B=8"},
                          {1, 1024, DType::kBF16, true, "q_a norm B=1"},
                          {8, 1024, DType::kBF16, true, "q_a norm B=8"},
                          {64, 512, DType::kBF16, false, "per-head q norm B=1"},
                          {512, 512, DType::kBF16, false, "per-head q norm B=8"},
                          {1, 512, DType::kBF16, true, "kv norm B=1"},
                          {8192, 4096, DType::kBF16, true, "prefill 8192x4096"},
                          {262144, 512, DType::kBF16, false, "prefill per-head q 4096x64x512"}};
  std::printf("DI_NORM_TIMING|shape|rows|dim|x|legacy us|new us|new GB/s\n");
  for (const Shape& sh : shapes) {
    const size_t xe = size_t(sh.rows * sh.dim), xb = sh.xd == DType::kF32 ? 4 : 2;
    DevArray<float> xf(sh.xd == DType::kF32 ? randn(xe, 1) : std::vector<float>(1));
    DevArray<uint16_t> xh(sh.xd == DType::kBF16 ? to_bf16(randn(xe, 1)) : std::vector<uint16_t>(1)), y(xe);
    DevArray<float> w(randn(size_t(sh.dim), 2, 0.2f, 1.0f));
    const void* xp = sh.xd == DType::kF32 ? static_cast<const void*>(xf.get()) : xh.get();
    double us[2];
    for (bool legacy : {true, false})
      us[legacy ? 0 : 1] = graph_launch_us([&](cudaStream_t q) {
        oc::rmsnorm({.x = xp, .x_dtype = sh.xd, .x_stride = sh.dim, .w = sh.weighted ? w.get() : nullptr,
                     .w_dtype = DType::kF32, .y = y.get(), .y_dtype = DType::kBF16, .y_stride = sh.dim,
                     .rows = sh.rows, .dim = sh.dim, .legacy = legacy},
                    q);
      }, s);
    std::printf("DI_NORM_TIMING|%s|%lld|%lld|%s|%.2f|%.2f|%.0f\n", sh.what, (long long)sh.rows, (long long)sh.dim,
                std::string(dtype_name(sh.xd)).c_str(), us[0], us[1], double(xe) * (xb + 2) / us[1] / 1e3);
  }
}

// One mHC site at decode sizes (V4: n = 4, D = 4096, f32 streams, h bf16): hc_pre then a separate
// rmsnorm of u (legacy and session-15 kernels) against the norm fused into hc_pre's finalize, per
// site in a CUDA graph of 20 sites.
TEST(CudaTiming, HcSiteFusedNorm) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int64_t D = 4096;
  std::printf("DI_HC_SITE_TIMING|T|hc_pre + legacy rmsnorm us|hc_pre + rmsnorm us|fused us\n");
  for (int64_t T_ : {int64_t(1), int64_t(8), int64_t(64)}) {
    DevArray<float> x(randn(T_ * 4 * D, 3)), u(T_ * D), nw(randn(D, 7, 0.2f, 1.0f));
    DevArray<uint16_t> h(T_ * D);
    DevArray<float> fn(randn(24 * 4 * D, 4, 0.05f)), base(randn(24, 5)), sc(randn(3, 6)), mix(T_ * 24);
    DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, 4, D, oc::HcMode::kLayer) / 4 + 1);
    auto site = [&](cudaStream_t q, int how) {  // 0: + legacy rmsnorm, 1: + rmsnorm, 2: fused
      oc::hc_pre({.x = x.get(), .dtype = DType::kF32, .x_stride = 4 * D, .fn = fn.get(), .base = base.get(),
                  .scale = sc.get(), .u = u.get(), .u_stride = D, .mix = mix.get(), .workspace = ws.get(),
                  .tokens = T_, .dim = D, .single_launch = -1, .h = how == 2 ? h.get() : nullptr, .h_stride = D,
                  .h_w = nw.get()},
                 q);
      if (how < 2)
        oc::rmsnorm({.x = u.get(), .x_dtype = DType::kF32, .x_stride = D, .w = nw.get(), .w_dtype = DType::kF32,
                     .y = h.get(), .y_stride = D, .rows = T_, .dim = D, .legacy = how == 0},
                    q);
    };
    double us[3];
    for (int how = 0; how < 3; ++how) us[how] = graph_launch_us([&](cudaStream_t q) { site(q, how); }, s);
    std::printf("DI_HC_SITE_TIMING|%lld|%.2f|%.2f|%.2f\n", (long long)T_, us[0], us[1], us[2]);
  }
}

// One mHC site's hc_pre (V4: n = 4, D = 4096, f32 streams, layer mode) per launch in a CUDA graph,
// the two kernels (partials + wide finalize, sessions 13-15) against the single launch (session
// 16: a cluster per token; automatic 16 blocks where placeable, forced 8 and 16). "hot": one site
// replayed 20 times (fn in L2); "cold": 48 sites with their own fn and streams in turn (72 MB, more
// than the H100's L2), as in a decode step where the weights between two sites evict fn. The
// automatic rule keeps the two kernels beyond 8 tokens (64, 512: the same path twice, a check that
// prefill did not move). Then the whole site as the engine runs it, hc_pre + the site's rmsnorm of
// u (f32 -> bf16 h, f32 weight), against the norm fused into the single launch (HcPreParams::h).
TEST(CudaTiming, HcSiteGraph) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int64_t D = 4096;
  std::printf("DI_HC_GRAPH|T|fn|two kernels us|automatic us|single cluster 8 us|single cluster 16 us|"
              "two + rmsnorm us|single + rmsnorm us|single, norm fused us\n");
  for (int64_t T_ : {int64_t(1), int64_t(4), int64_t(8), int64_t(64), int64_t(512)})
    for (bool cold : {false, true}) {
      if (cold && T_ > 64) continue;
      const int sites = cold ? 48 : 1;
      std::vector<DevArray<float>> fn, x;
      fn.reserve(sites), x.reserve(sites);
      for (int i = 0; i < sites; ++i) {
        fn.emplace_back(randn(24 * 4 * D, 4 + i, 0.05f));
        x.emplace_back(randn(T_ * 4 * D, 100 + i));
      }
      DevArray<float> u(T_ * D), base(randn(24, 5)), sc(randn(3, 6)), mix(T_ * 24), nw(randn(D, 7, 0.2f, 1.0f));
      DevArray<uint16_t> h(T_ * D);
      DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, 4, D, oc::HcMode::kLayer) / 4 + 1);
      // norm: 0 none, 1 a separate rmsnorm after hc_pre, 2 fused into hc_pre
      auto run = [&](int single, int cluster, int norm) {
        int i = 0;
        return graph_launch_us([&](cudaStream_t q) {
          const int k = i++ % sites;
          oc::hc_pre({.x = x[k].get(), .dtype = DType::kF32, .x_stride = 4 * D, .fn = fn[k].get(), .base = base.get(),
                      .scale = sc.get(), .u = u.get(), .u_stride = D, .mix = mix.get(), .workspace = ws.get(),
                      .tokens = T_, .dim = D, .single_launch = single, .cluster = cluster,
                      .h = norm == 2 ? h.get() : nullptr, .h_stride = D, .h_w = nw.get()},
                     q);
          if (norm == 1)
            oc::rmsnorm({.x = u.get(), .x_dtype = DType::kF32, .x_stride = D, .w = nw.get(), .w_dtype = DType::kF32,
                         .y = h.get(), .y_stride = D, .rows = T_, .dim = D},
                        q);
        }, s, cold ? sites : 20);
      };
      const bool small = T_ <= 64;
      const double two = run(-1, 0, 0), au = run(0, 0, 0);
      const double c8 = small ? run(1, 8, 0) : 0.0, c16 = small ? run(1, 16, 0) : 0.0;
      const double two_n = run(-1, 0, 1), single_n = small ? run(1, 0, 1) : 0.0, fused = small ? run(1, 0, 2) : 0.0;
      std::printf("DI_HC_GRAPH|%lld|%s|%.2f|%.2f|%.2f|%.2f|%.2f|%.2f|%.2f\n", (long long)T_, cold ? "cold" : "hot", two,
                  au, c8, c16, two_n, single_n, fused);
    }
}

TEST(CudaTiming, Kernels) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  {
    const int64_t rows = 8192, dim = 4096;
    DevArray<uint16_t> x(to_bf16(randn(rows * dim, 1))), w(to_bf16(randn(dim, 2))), y(rows * dim);
    const double us = median_us([&](cudaStream_t q) {
      oc::rmsnorm({.x = x.get(), .x_stride = dim, .w = w.get(), .y = y.get(), .y_stride = dim, .rows = rows, .dim = dim}, q);
    }, s);
    report_time("rmsnorm", "bf16 8192x4096", us, gbps(2.0 * rows * dim * 2, us));
  }
  // hc_pre at prefill sizes, f32 streams as the CUDA backend holds them (and bf16), with the decode
  // shape of the partial sums (4-token tiles) against the prefill one (8 tokens, <= 8 mixes a block).
  for (int64_t T_ : {int64_t(64), int64_t(512), int64_t(3840)})
    for (DType dt : {DType::kBF16, DType::kF32})
      for (int tile : {4, 8}) {
        const int64_t D = 4096;
        const double elem = dt == DType::kF32 ? 4.0 : 2.0;
        DevArray<float> xf(randn(dt == DType::kF32 ? T_ * 4 * D : 1, 3)), u(T_ * D);
        DevArray<uint16_t> xb(to_bf16(randn(dt == DType::kBF16 ? T_ * 4 * D : 1, 3)));
        const void* xp = dt == DType::kF32 ? static_cast<const void*>(xf.get()) : xb.get();
        DevArray<float> fn(randn(24 * 4 * D, 4, 0.05f)), base(randn(24, 5)), sc(randn(3, 6)), mix(T_ * 24);
        DevArray<float> ws(oc::hc_pre_workspace_bytes(T_, 4, D, oc::HcMode::kLayer) / 4 + 1);
        const double us = median_us([&](cudaStream_t q) {
          oc::hc_pre({.x = xp, .dtype = dt, .x_stride = 4 * D, .fn = fn.get(), .base = base.get(), .scale = sc.get(),
                      .u = u.get(), .u_stride = D, .mix = mix.get(), .workspace = ws.get(), .tokens = T_, .dim = D,
                      .token_tile = tile},
                     q);
        }, s);
        report_time("hc_pre", std::string(dtype_name(dt)) + " T=" + std::to_string(T_) + " D=4096 tile " +
                                  std::to_string(tile),
                    us, tflops(2.0 * T_ * 24 * 4 * D, us) + ", " + gbps(T_ * 4 * D * elem * 1.25 + 24 * 4 * D * 4.0, us));
      }
  {
    oc::CublasLt lt;
    for (int64_t M : {int64_t(1), int64_t(64), int64_t(4096)}) {
      const int64_t N = 4096, K = 4096;
      DevArray<uint16_t> x(to_bf16(randn(M * K, 7))), w(to_bf16(randn(N * K, 8, 0.02f))), y(M * N);
      const double us = median_us([&](cudaStream_t q) {
        lt.gemm({.x = x.get(), .ldx = K, .w = w.get(), .ldw = K, .y = y.get(), .ldy = N, .M = M, .N = N, .K = K}, q);
      }, s);
      report_time("gemm", "bf16 M=" + std::to_string(M) + " 4096x4096", us,
                  M >= 1024 ? tflops(2.0 * M * N * K, us) : gbps(2.0 * N * K, us));
    }
  }
  {
    oc::CublasLt lt;
    for (int64_t M : {int64_t(4), int64_t(64), int64_t(4096)}) {
      const int64_t N = 4096, K = 4096;
      DevArray<uint16_t> x(to_bf16(randn(M * K, 13)));
      std::vector<uint8_t> w8(N * K);
      std::mt19937 g(3);
      for (auto& b : w8) b = uint8_t(g() % 0x7e);
      DevArray<uint8_t> w(w8), q(M * K), y(M * N * 2);
      DevArray<float> xs(M * K / 128), wsc(std::vector<float>(32 * 32, 0.01f));
      double us = 0;
      try {
        us = median_us([&](cudaStream_t qs) {
        oc::quantize_fp8_act({.x = x.get(), .ldx = K, .q = q.get(), .scale = xs.get(), .M = M, .K = K}, qs);
        lt.gemm_fp8_block({.x = q.get(), .x_scale = xs.get(), .w = w.get(), .w_scale = wsc.get(), .y = y.get(),
                           .ldy = N, .M = M, .N = N, .K = K}, qs);
        }, s);
      } catch (const CudaError& e) {
        std::printf("gemm_fp8_block timing skipped: %s\n", e.what());
        break;
      }
      report_time("gemm_fp8_block", "act quant + gemm M=" + std::to_string(M) + " 4096x4096", us,
                  M >= 1024 ? tflops(2.0 * M * N * K, us) : gbps(1.0 * N * K, us));
    }
  }
  {
    const int64_t T_ = 4096;
    DevArray<float> l(randn(T_ * 256, 9)), b(randn(256, 10, 0.05f)), w(T_ * 6);
    DevArray<int32_t> ids(T_ * 6);
    const double us = median_us([&](cudaStream_t q) {
      oc::router({.logits = l.get(), .logits_stride = 256, .bias = b.get(), .expert_ids = ids.get(), .weights = w.get(),
                  .tokens = T_, .num_experts = 256, .topk = 6, .route_scale = 1.5f}, q);
    }, s);
    report_time("router", "T=4096 E=256 k=6", us, gbps(T_ * 256 * 4.0, us));
  }
  for (int64_t B : {int64_t(1), int64_t(8), int64_t(32), int64_t(128)}) {
    // V4-Flash decode: 64 heads × 512, 128 window keys + 512 selected compressed keys + sink.
    const int64_t H = 64, d = 512, ncmp = 4096;
    DevArray<uint16_t> q(to_bf16(randn(B * H * d, 20))), win(to_bf16(randn(B * 128 * d, 21))),
        cmp(to_bf16(randn(ncmp * d, 22))), out(B * H * d);
    std::vector<int32_t> wb(B), wc(B, 128), cc(B, 512), rows(B * 512);
    std::vector<int64_t> co(B);
    std::mt19937 g(5);
    for (int64_t b = 0; b < B; ++b) {
      wb[b] = int32_t(b * 128);
      co[b] = b * 512;
    }
    for (auto& r : rows) r = int32_t(g() % ncmp);
    DevArray<int32_t> dwb(wb), dwc(wc), dcc(cc), drows(rows);
    DevArray<int64_t> dco(co);
    DevArray<float> sink(randn(H, 23));
    const oc::AttnSplit sp = oc::choose_attention_split(B, H, d, DType::kBF16, 640, device_info().num_sms);
    DevArray<float> ws(oc::sparse_attention_workspace_bytes(B, H, d, sp.num_splits) / 4 + 1);
    const double us = median_us([&](cudaStream_t qs) {
      oc::sparse_attention({.q = q.get(), .q_stride = H * d, .win_kv = win.get(), .cmp_kv = cmp.get(), .kv_stride = d,
                            .win_begin = dwb.get(), .win_count = dwc.get(), .cmp_rows = drows.get(),
                            .cmp_offset = dco.get(), .cmp_count = dcc.get(), .sink = sink.get(),
                            .scale = 0.044194f, .out = out.get(), .out_stride = H * d, .num_tokens = B,
                            .num_heads = H, .head_dim = d, .num_splits = sp.num_splits, .split_keys = sp.split_keys,
                            .workspace = ws.get()}, qs);
    }, s);
    report_time("sparse_attn", "decode b=" + std::to_string(B) + " H=64 640 keys, " + std::to_string(sp.num_splits) + " splits", us,
                tflops(4.0 * B * H * 640 * d, us));
  }
  for (int64_t T_ : {int64_t(1), int64_t(64)}) {
    // Indexer at 64K context: 16384 candidate blocks, 64 heads × 128, top 512.
    const int64_t Hi = 64, di = 128, n = 16384;
    DevArray<uint16_t> q(to_bf16(randn(T_ * Hi * di, 30))), k(to_bf16(randn(n * di, 31)));
    DevArray<float> w(randn(T_ * Hi, 32)), sc(T_ * n);
    std::vector<int32_t> rows(n), cnt(T_, int32_t(n));
    std::iota(rows.begin(), rows.end(), 0);
    std::vector<int64_t> off(T_, 0);
    DevArray<int32_t> drows(rows), dcnt(cnt), out(T_ * 512), outc(T_);
    DevArray<int64_t> doff(off);
    const double us = median_us([&](cudaStream_t qs) {
      oc::indexer_topk({.q = q.get(), .w = w.get(), .k_pool = k.get(), .cand_rows = drows.get(), .cand_offset = doff.get(),
                        .cand_count = dcnt.get(), .num_tokens = T_, .num_heads = Hi, .head_dim = di,
                        .qk_scale = 0.0884f, .w_scale = 0.125f, .topk = 512, .max_candidates = n, .scores = sc.get(),
                        .out_rows = out.get(), .out_count = outc.get()}, qs);
    }, s);
    report_time("indexer_topk", "T=" + std::to_string(T_) + " 16384 cand 64x128", us,
                tflops(2.0 * T_ * n * Hi * di, us));
  }
  {
    const int64_t rows = 65536;
    DevArray<uint16_t> x(to_bf16(randn(rows * 512, 11)));
    const double us = median_us([&](cudaStream_t q) {
      oc::fp8_round_trip({.x = x.get(), .row_stride = 512, .rows = rows}, q);
    }, s);
    report_time("fp8_kv_round", "bf16 65536x512", us, gbps(2.0 * rows * 448 * 2, us));
    DevArray<uint16_t> xi(to_bf16(randn(rows * 128, 12)));
    const double us2 = median_us([&](cudaStream_t q) {
      oc::fp4_round_trip({.x = xi.get(), .row_stride = 128, .rows = rows}, q);
    }, s);
    report_time("hadamard_fp4", "bf16 65536x128", us2, gbps(2.0 * rows * 128 * 2, us2));
  }
}

}  // namespace
}  // namespace deepinfer::cuda
