// The tensor-core sparse attention kernel (attention_mma.h) against the CPU twin and against
// itself run token by token: odd key counts, partial tiles, negative (skipped) ids, tokens with
// no keys, sink on and off, split and unsplit, 64 and 128 heads.
#include <cmath>

#include "ops/cpu/attention.h"
#include "ops/cuda/attention.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

constexpr double kTolBf16 = 8e-3;  // as attention_test.cc: bf16 inputs, P and the output rounded to bf16

// Inputs of one case, host side (bf16-representable floats) and on the device.
struct AttnCase {
  int64_t T = 0, H = 64, d = 512;
  std::vector<float> q, wkv, ckv, sink;
  std::vector<int32_t> wb, wc, cc, rows;
  std::vector<int64_t> co;
  int max_keys = 0;
};

AttnCase make_case(int64_t T_, int64_t H, int max_win, int max_cmp, uint64_t seed, bool sink_on) {
  AttnCase c;
  c.T = T_;
  c.H = H;
  std::mt19937_64 g(seed);
  const int64_t win_rows = T_ + max_win, cmp_rows_n = 1531;  // odd pool size
  c.q = bf16_round(randn(T_ * H * c.d, seed, 1.0f));
  c.wkv = bf16_round(randn(win_rows * c.d, seed + 1, 1.0f));
  c.ckv = bf16_round(randn(cmp_rows_n * c.d, seed + 2, 1.0f));
  c.sink = sink_on ? randn(H, seed + 3, 1.0f) : std::vector<float>(H, -INFINITY);
  c.wb.resize(T_);
  c.wc.resize(T_);
  c.cc.resize(T_);
  c.co.resize(T_);
  for (int64_t t = 0; t < T_; ++t) {
    c.wb[t] = int32_t(t);
    c.wc[t] = (t % 5 == 3) ? 0 : int32_t(1 + g() % max_win);  // odd counts, some without window keys
    c.cc[t] = (t % 4 == 1) ? 0 : int32_t(g() % (max_cmp + 1));
    c.co[t] = int64_t(c.rows.size());
    for (int i = 0; i < c.cc[t]; ++i) c.rows.push_back(g() % 23 == 0 ? -1 : int32_t(g() % cmp_rows_n));
    c.max_keys = std::max(c.max_keys, c.wc[t] + c.cc[t]);
  }
  if (T_ >= 7) c.wc[6] = 0, c.cc[6] = 0;  // token 6: no keys at all -> zeros
  c.rows.push_back(0);                    // never empty
  return c;
}

std::vector<float> cpu_ref(const AttnCase& c) {
  std::vector<float> ref(c.T * c.H * c.d);
  ops::cpu::sparse_attention({.q = c.q.data(), .num_tokens = c.T, .num_heads = c.H, .head_dim = c.d,
                              .win_kv = c.wkv.data(), .win_begin = c.wb.data(), .win_count = c.wc.data(),
                              .cmp_kv = c.ckv.data(), .cmp_rows = c.rows.data(), .cmp_offset = c.co.data(),
                              .cmp_count = c.cc.data(), .sink = c.sink.data(), .scale = 1.0f / std::sqrt(float(c.d)),
                              .out = ref.data()});
  return ref;
}

// Runs tokens [t0, t0 + n) of the case as one launch (pointers offset as a batch-invariant caller
// does); returns their outputs as raw bf16 bits.
struct DeviceCase {
  DevArray<uint16_t> q, w, c;
  DevArray<int32_t> wb, wc, cc, rows;
  DevArray<int64_t> co;
  DevArray<float> sink;
  explicit DeviceCase(const AttnCase& a)
      : q(to_bf16(a.q)), w(to_bf16(a.wkv)), c(to_bf16(a.ckv)), wb(a.wb), wc(a.wc), cc(a.cc), rows(a.rows), co(a.co),
        sink(a.sink) {}
};

std::vector<uint16_t> gpu_run(const AttnCase& a, DeviceCase& dv, oc::AttnKernel kernel, int split_keys,
                              int64_t t0 = 0, int64_t n = -1) {
  if (n < 0) n = a.T;
  const int64_t H = a.H, d = a.d;
  const int splits = split_keys ? (a.max_keys + split_keys - 1) / split_keys : 1;
  DevArray<uint16_t> out(n * H * d);
  out.poison();
  DevArray<float> ws(oc::sparse_attention_workspace_bytes(n, H, d, splits) / sizeof(float) + 1);
  ws.poison();
  oc::sparse_attention({.q = dv.q.get() + t0 * H * d, .q_stride = H * d, .win_kv = dv.w.get(), .cmp_kv = dv.c.get(),
                        .kv_stride = d, .dtype = DType::kBF16, .win_begin = dv.wb.get() + t0,
                        .win_count = dv.wc.get() + t0, .cmp_rows = dv.rows.get(), .cmp_offset = dv.co.get() + t0,
                        .cmp_count = dv.cc.get() + t0, .sink = dv.sink.get(), .scale = 1.0f / std::sqrt(float(d)),
                        .out = out.get(), .out_stride = H * d, .num_tokens = n, .num_heads = H, .head_dim = d,
                        .num_splits = splits, .split_keys = split_keys, .workspace = ws.get(), .kernel = kernel},
                       nullptr);
  return out.download();
}

std::vector<float> bits_to_f32(const std::vector<uint16_t>& v) { return from_bf16(v); }

TEST(CudaSparseAttention, TensorCoresMatchCpuTwin) {
  DI_REQUIRE_GPU();
  EXPECT_TRUE(oc::sparse_attention_uses_tensor_cores(64, 512, DType::kBF16));
  EXPECT_FALSE(oc::sparse_attention_uses_tensor_cores(64, 512, DType::kF32));
  EXPECT_FALSE(oc::sparse_attention_uses_tensor_cores(13, 512, DType::kBF16));
  uint64_t seed = 9100;
  struct Shape {
    int64_t T, H;
    int max_win, max_cmp;
    bool sink;
  };
  for (const Shape s : {Shape{1, 64, 128, 512, true}, Shape{7, 64, 128, 512, false}, Shape{19, 64, 33, 97, true},
                        Shape{3, 128, 128, 300, true}, Shape{111, 64, 128, 512, true}}) {
    const AttnCase a = make_case(s.T, s.H, s.max_win, s.max_cmp, seed += 10, s.sink);
    DeviceCase dv(a);
    const std::vector<float> ref = cpu_ref(a);
    const oc::AttnSplit auto_split = oc::choose_attention_split(a.T, a.H, a.d, DType::kBF16, a.max_keys, 132);
    for (const oc::AttnKernel kern : {oc::AttnKernel::kTensorCoresTile32, oc::AttnKernel::kTensorCoresTile64,
                                      oc::AttnKernel::kAuto}) {
      const int tile = kern == oc::AttnKernel::kTensorCoresTile64 ? 64 : 32;
      for (int sk : {0, 32, 64, 96, 128, auto_split.split_keys}) {
        if (kern != oc::AttnKernel::kAuto && sk % tile) continue;  // that pin does not take this split
        if (kern == oc::AttnKernel::kAuto && sk != auto_split.split_keys) continue;
        if (a.T > 64 && (sk == 32 || sk == 96)) continue;  // keeps the suite short under compute-sanitizer
        const std::vector<float> out = bits_to_f32(gpu_run(a, dv, kern, sk));
        const std::string cs = (kern == oc::AttnKernel::kAuto ? std::string("tensor cores (auto)")
                                                              : "tensor cores tile " + std::to_string(tile)) +
                               " T=" + std::to_string(a.T) +
                               " H=" + std::to_string(a.H) + " keys<=" + std::to_string(a.max_keys) +
                               (s.sink ? " sink" : " no sink") +
                               (sk ? " split_keys " + std::to_string(sk) : " one pass");
        report("sparse_attention", cs, max_rel_err(out, ref), kTolBf16);
      }
    }
  }
}

// A token's output must not depend on the batch: alone (one-token launches) and inside the batch,
// bit for bit, with and without a fixed split (the batch-invariant mode's 128 keys).
TEST(CudaSparseAttention, TensorCoresBatchInvariant) {
  DI_REQUIRE_GPU();
  const AttnCase a = make_case(9, 64, 128, 512, 9700, true);
  DeviceCase dv(a);
  for (const oc::AttnKernel kern : {oc::AttnKernel::kTensorCoresTile32, oc::AttnKernel::kTensorCoresTile64})
    for (int sk : {0, 128}) {
      const std::vector<uint16_t> all = gpu_run(a, dv, kern, sk);
      const size_t per = size_t(a.H * a.d);
      for (int64_t t = 0; t < a.T; ++t) {
        const std::vector<uint16_t> one = gpu_run(a, dv, kern, sk, t, 1);
        EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + t * per))
            << "token " << t << " alone differs from the batch (split_keys " << sk << ", tile "
            << (kern == oc::AttnKernel::kTensorCoresTile32 ? 32 : 64) << ")";
      }
    }
  // The split rule: the token-count-free choice is the caller's (split_keys fixed); the adaptive
  // one fills about one wave and never leaves a split past the longest list.
  for (int64_t T_ : {int64_t(1), int64_t(8), int64_t(32), int64_t(64)}) {
    const oc::AttnSplit s = oc::choose_attention_split(T_, 64, 512, DType::kBF16, 640, 132);
    EXPECT_GT(s.num_splits, 1) << T_;
    EXPECT_EQ(s.split_keys % 32, 0) << T_;
    EXPECT_GE(int64_t(s.num_splits) * s.split_keys, 640) << T_;
    EXPECT_LT(int64_t(s.num_splits - 1) * s.split_keys, 640) << T_;
    EXPECT_LE(T_ * s.num_splits, 132) << T_;
  }
  EXPECT_EQ(oc::choose_attention_split(128, 64, 512, DType::kBF16, 640, 132).num_splits, 1);
}

TEST(CudaSparseAttention, TensorCoresAgreeWithCudaCores) {
  DI_REQUIRE_GPU();
  const AttnCase a = make_case(5, 64, 128, 512, 9900, true);
  DeviceCase dv(a);
  const std::vector<float> cc = bits_to_f32(gpu_run(a, dv, oc::AttnKernel::kCudaCores, 64));
  const std::vector<float> t32 = bits_to_f32(gpu_run(a, dv, oc::AttnKernel::kTensorCoresTile32, 64));
  const std::vector<float> t64 = bits_to_f32(gpu_run(a, dv, oc::AttnKernel::kTensorCoresTile64, 64));
  report("sparse_attention", "tensor cores tile 32 vs CUDA cores, split 64", max_rel_err(t32, cc), kTolBf16);
  report("sparse_attention", "tensor cores tile 64 vs CUDA cores, split 64", max_rel_err(t64, cc), kTolBf16);
}

TEST(CudaSparseAttention, TensorCoresRejectUncoveredShapes) {
  DI_REQUIRE_GPU();
  const AttnCase a = make_case(2, 64, 128, 512, 9950, true);
  ASSERT_GT(a.max_keys, 48);
  DeviceCase dv(a);
  EXPECT_THROW(gpu_run(a, dv, oc::AttnKernel::kTensorCores, 48), InvalidArgument);  // split not a multiple of 32
  EXPECT_THROW(gpu_run(a, dv, oc::AttnKernel::kTensorCoresTile64, 96), InvalidArgument);  // nor of 64
}

}  // namespace
}  // namespace deepinfer::cuda
