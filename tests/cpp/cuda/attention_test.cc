#include "ops/cpu/attention.h"
#include "ops/cuda/attention.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// f32: exp/sum order differs from the CPU loop; bf16: one output rounding.
constexpr double kTolF32 = 2e-5, kTolBf16 = 8e-3;

template <typename T>
void run_case(int64_t T_, int64_t H, int64_t d, int max_cmp, uint64_t seed, int split_keys = 0) {
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  std::mt19937_64 g(seed);
  const int64_t win_rows = T_ + 127, cmp_rows_n = 700;
  std::vector<float> q = randn(T_ * H * d, seed, 1.0f);
  std::vector<float> wkv = randn(win_rows * d, seed + 1, 1.0f);
  std::vector<float> ckv = randn(cmp_rows_n * d, seed + 2, 1.0f);
  std::vector<float> sink = randn(H, seed + 3, 1.0f);
  if (kBf16) {
    q = bf16_round(q);
    wkv = bf16_round(wkv);
    ckv = bf16_round(ckv);
  }
  std::vector<int32_t> wb(T_), wc(T_), cc(T_), rows;
  std::vector<int64_t> co(T_);
  for (int64_t t = 0; t < T_; ++t) {
    wb[t] = int32_t(t);
    wc[t] = (t % 5 == 4) ? 0 : int32_t(1 + g() % 128);  // some tokens without window keys
    cc[t] = (t % 3 == 1) ? 0 : int32_t(g() % (max_cmp + 1));
    co[t] = int64_t(rows.size());
    for (int i = 0; i < cc[t]; ++i) rows.push_back(g() % 50 == 0 ? -1 : int32_t(g() % cmp_rows_n));
  }
  if (T_ >= 5) cc[4] = 0;  // token 4: no keys at all -> zeros
  rows.push_back(0);       // never empty
  std::vector<float> ref(T_ * H * d);
  ops::cpu::sparse_attention({.q = q.data(), .num_tokens = T_, .num_heads = H, .head_dim = d, .win_kv = wkv.data(),
                              .win_begin = wb.data(), .win_count = wc.data(), .cmp_kv = ckv.data(),
                              .cmp_rows = rows.data(), .cmp_offset = co.data(), .cmp_count = cc.data(),
                              .sink = sink.data(), .scale = 1.0f / std::sqrt(float(d)), .out = ref.data()});
  auto pack = [&](const std::vector<float>& v) {
    if constexpr (kBf16) return to_bf16(v);
    else return v;
  };
  DevArray<T> dq(pack(q)), dw(pack(wkv)), dc(pack(ckv)), dout(T_ * H * d);
  DevArray<int32_t> dwb(wb), dwc(wc), dcc(cc), drows(rows);
  DevArray<int64_t> dco(co);
  DevArray<float> dsink(sink);
  dout.poison();
  const int max_keys = 128 + max_cmp;
  const int splits = split_keys ? (max_keys + split_keys - 1) / split_keys : 1;
  DevArray<float> ws(oc::sparse_attention_workspace_bytes(T_, H, d, splits) / sizeof(float) + 1);
  ws.poison();
  oc::sparse_attention({.q = dq.get(), .q_stride = H * d, .win_kv = dw.get(), .cmp_kv = dc.get(), .kv_stride = d,
                        .dtype = kBf16 ? DType::kBF16 : DType::kF32, .win_begin = dwb.get(), .win_count = dwc.get(),
                        .cmp_rows = drows.get(), .cmp_offset = dco.get(), .cmp_count = dcc.get(),
                        .sink = dsink.get(), .scale = 1.0f / std::sqrt(float(d)), .out = dout.get(),
                        .out_stride = H * d, .num_tokens = T_, .num_heads = H, .head_dim = d,
                        .num_splits = splits, .split_keys = split_keys, .workspace = ws.get()},
                       nullptr);
  std::vector<float> out;
  if constexpr (kBf16) out = from_bf16(dout.download());
  else out = dout.download();
  const std::string cs = std::string(kBf16 ? "bf16" : "f32") + " T=" + std::to_string(T_) + " H=" +
                         std::to_string(H) + " d=" + std::to_string(d) + " cmp<=" + std::to_string(max_cmp) +
                         (split_keys ? " split " + std::to_string(splits) + "x" + std::to_string(split_keys) : "");
  report("sparse_attention", cs, max_rel_err(out, ref), kBf16 ? kTolBf16 : kTolF32);
}

TEST(CudaSparseAttention, MatchesCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (int64_t T_ : {int64_t(1), int64_t(7), int64_t(64), int64_t(133)}) {
    run_case<uint16_t>(T_, 64, 512, 512, seed += 10);  // V4-Flash decode/prefill shape
    run_case<float>(T_, 64, 512, 512, seed += 10);
    run_case<float>(T_, 8, 64, 40, seed += 10);         // tiny config
  }
  run_case<uint16_t>(7, 13, 96, 20, seed += 10);  // heads not a multiple of 8
}

TEST(CudaSparseAttention, SplitKvMatchesCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 4500;
  for (int64_t T_ : {int64_t(1), int64_t(7), int64_t(64)}) {
    run_case<uint16_t>(T_, 64, 512, 512, seed += 10, 48);  // 14 splits, boundaries inside the window
    run_case<float>(T_, 64, 512, 512, seed += 10, 64);
    run_case<float>(T_, 8, 64, 40, seed += 10, 16);
  }
  const oc::AttnSplit s = oc::choose_attention_split(1, 64, 640, 132);
  EXPECT_GT(s.num_splits, 1);
  EXPECT_GE(int64_t(s.num_splits) * s.split_keys, 640);
  EXPECT_EQ(s.split_keys % 16, 0);
  EXPECT_EQ(oc::choose_attention_split(4096, 64, 640, 132).num_splits, 1);
  EXPECT_GT(oc::choose_attention_split(32, 64, 640, 132).num_splits, 1);
}

TEST(CudaSparseAttention, RejectsBadHeadDim) {
  float f = 0;
  int32_t i = 0;
  EXPECT_THROW(oc::sparse_attention({.q = &f, .q_stride = 100, .win_kv = &f, .kv_stride = 100, .win_begin = &i,
                                     .win_count = &i, .sink = &f, .out = &f, .out_stride = 100, .num_tokens = 1,
                                     .num_heads = 1, .head_dim = 100},
                                    nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
