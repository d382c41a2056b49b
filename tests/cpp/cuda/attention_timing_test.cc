// Sparse attention decode timing at the V4 shape (issue #13): the tensor-core kernel next to the
// CUDA-core one in the same run, against the floor and FlashMLA's published SM90 figures.
// 64 heads x 512, 128 window keys + 512 selected compressed keys per token, sink, bf16 KV.
// Inputs rotate over 4 sets and the compressed pool is 96 MB, so a launch reads its keys from HBM,
// not L2 (50 MB). Figures: per launch in a CUDA graph of 20 launches (as in a captured decode step;
// median of 9 replays), and for the main two also the median of 20 event-timed groups of 10
// back-to-back stream launches / 10 (host launch cost included where it exceeds the kernel's).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "ops/cuda/attention.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// Measured ceilings on this workplace's H200 (KINDS.md): bf16 tensor cores, device copy.
constexpr double kPeakTflops = 790, kPeakTBps = 4.3;

struct AnchorRow {
  int64_t b;
  double flashmla_us;  // ../shared/docs/ANCHORS.md (FP8 KV)
};

TEST(CudaTiming, SparseAttentionDecode) {
  DI_REQUIRE_GPU();
  Stream st;
  const cudaStream_t s = st.get();
  const int64_t H = 64, d = 512, nwin = 128, ncmp_sel = 512, keys = nwin + ncmp_sel, pool = 96 * 1024;
  constexpr int kSets = 4, kReps = 10;
  const int sms = device_info().num_sms;
  DevArray<uint16_t> cmp(to_bf16(randn(pool * d, 22)));
  std::printf("%6s %10s %10s %7s %9s %8s %9s %7s %10s %8s %s\n", "b", "cuda_us", "tc_us", "speedup", "TFLOP/s",
              "GB/s", "floor_us", "floor%", "FlashMLA", "vs_FMLA", "splits");
  for (const AnchorRow row : {AnchorRow{1, 15.1}, AnchorRow{8, 16.0}, AnchorRow{32, 27.1}, AnchorRow{128, 49.5},
                              AnchorRow{256, 91.7}}) {
    const int64_t B = row.b;
    // DI_ATTN_TIMING_B=<b>: that batch only (for a profiler run of one shape).
    if (const char* only = std::getenv("DI_ATTN_TIMING_B"); only && std::atoll(only) != B) continue;
    DevArray<uint16_t> q(to_bf16(randn(kSets * B * H * d, 20))), win(to_bf16(randn(kSets * B * nwin * d, 21))),
        out(B * H * d);
    std::vector<int32_t> wb(kSets * B), wc(B, int32_t(nwin)), cc(B, int32_t(ncmp_sel)), rows(kSets * B * ncmp_sel);
    std::vector<int64_t> co(B);
    std::mt19937 g(5);
    for (int64_t i = 0; i < kSets * B; ++i) wb[i] = int32_t(i * nwin);
    for (int64_t b = 0; b < B; ++b) co[b] = b * ncmp_sel;
    for (auto& r : rows) r = int32_t(g() % pool);
    DevArray<int32_t> dwb(wb), dwc(wc), dcc(cc), drows(rows);
    DevArray<int64_t> dco(co);
    DevArray<float> sink(randn(H, 23));
    DevArray<float> ws(oc::sparse_attention_workspace_bytes(B, H, d, 4 * sms / B + 1) / 4 + 1);
    auto launcher = [&](oc::AttnKernel kernel, oc::AttnSplit sp) {
      return [&, kernel, sp, set = 0](cudaStream_t qs) mutable {
        const int64_t z = set++ % kSets;
        oc::sparse_attention({.q = q.get() + z * B * H * d, .q_stride = H * d, .win_kv = win.get(), .cmp_kv = cmp.get(),
                              .kv_stride = d, .win_begin = dwb.get() + z * B, .win_count = dwc.get(),
                              .cmp_rows = drows.get() + z * B * ncmp_sel, .cmp_offset = dco.get(),
                              .cmp_count = dcc.get(), .sink = sink.get(), .scale = 0.044194f, .out = out.get(),
                              .out_stride = H * d, .num_tokens = B, .num_heads = H, .head_dim = d,
                              .num_splits = sp.num_splits, .split_keys = sp.split_keys, .workspace = ws.get(),
                              .kernel = kernel},
                             qs);
      };
    };
    auto time_cfg = [&](oc::AttnKernel kernel, oc::AttnSplit sp) {
      auto launch = launcher(kernel, sp);
      launch(s);  // outside the capture: one-time attribute setup
      return graph_launch_us(launch, s);
    };
    auto stream_cfg = [&](oc::AttnKernel kernel, oc::AttnSplit sp) {
      auto launch = launcher(kernel, sp);
      return median_us([&](cudaStream_t qs) {
               for (int r = 0; r < kReps; ++r) launch(qs);
             }, s) / kReps;
    };
    const oc::AttnSplit used[2] = {oc::choose_attention_split(B, H, keys, sms),
                                   oc::choose_attention_split(B, H, d, DType::kBF16, keys, sms)};
    const double us[2] = {time_cfg(oc::AttnKernel::kCudaCores, used[0]), time_cfg(oc::AttnKernel::kAuto, used[1])};
    const double us_stream[2] = {stream_cfg(oc::AttnKernel::kCudaCores, used[0]),
                                 stream_cfg(oc::AttnKernel::kAuto, used[1])};
    // The alternatives the split rule chose among (tile x keys per split), for the record.
    std::string alt;
    for (const int tile : {32, 64})
      for (const int sk : {0, 32, 64, 96, 128, 160, 192, 320}) {
        if (sk % tile) continue;
        const int splits = sk ? int((keys + sk - 1) / sk) : 1;
        if (B * splits > 4 * sms || (sk && splits < 2)) continue;
        const oc::AttnKernel kern = tile == 32 ? oc::AttnKernel::kTensorCoresTile32 : oc::AttnKernel::kTensorCoresTile64;
        const double u = time_cfg(kern, sk ? oc::AttnSplit{splits, sk} : oc::AttnSplit{});
        char buf[64];
        std::snprintf(buf, sizeof buf, " t%d/%dx%d:%.1f", tile, splits, sk, u);
        alt += buf;
      }
    std::printf("alt b=%lld (graph us, t<tile>/<splits>x<keys per split>)%s\n", (long long)B, alt.c_str());
    std::printf("stream b=%lld: cuda cores %.2f us, tensor cores %.2f us (10 back-to-back launches)\n", (long long)B,
                us_stream[0], us_stream[1]);
    const double flop = 4.0 * B * H * keys * d;
    const double bytes = B * (keys * d * 2.0 + 2.0 * H * d * 2.0);  // keys once, q in, out
    const double floor_us = std::max(flop / (kPeakTflops * 1e6), bytes / (kPeakTBps * 1e6));
    std::printf("%6lld %10.2f %10.2f %6.2fx %9.1f %8.0f %9.2f %6.1f%% %10.1f %7.2fx %d/%d\n", (long long)B, us[0],
                us[1], us[0] / us[1], flop / us[1] / 1e6, bytes / us[1] / 1e3, floor_us, 100.0 * floor_us / us[1],
                row.flashmla_us, us[1] / row.flashmla_us, used[0].num_splits, used[1].num_splits);
    report_time("sparse_attn_tc", "decode b=" + std::to_string(B) + " H=64 640 keys, " +
                                      std::to_string(used[1].num_splits) + " splits", us[1],
                tflops(flop, us[1]) + ", " + gbps(bytes, us[1]));
    report_time("sparse_attn_cuda_cores", "decode b=" + std::to_string(B) + " H=64 640 keys, " +
                                              std::to_string(used[0].num_splits) + " splits", us[0],
                tflops(flop, us[0]) + ", " + gbps(bytes, us[0]));
  }
}

}  // namespace
}  // namespace deepinfer::cuda
