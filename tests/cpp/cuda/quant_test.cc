// Production numerics against direct implementations of the formulas: nearest representable
// value found by scanning every e4m3 / e2m1 code (ties to the even code), scales from
// 2^ceil(log2 s) computed in double, the Hadamard product as a dense double matrix.
#include "ops/cuda/quant.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// Nearest value of a code table (finite codes only), ties to the even code.
double nearest(double v, const std::vector<double>& vals) {
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < int(vals.size()); ++c) {
    const double d = std::fabs(vals[c] - v);
    if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) {
      bd = d;
      best = c;
    }
  }
  return vals[best];
}
const std::vector<double>& e4m3_vals() {  // positive codes 0..126 (0x7f is NaN)
  static std::vector<double> v = [] {
    std::vector<double> r;
    for (int c = 0; c < 127; ++c) r.push_back(c < 8 ? c * std::ldexp(1.0, -9) : std::ldexp(1.0 + (c & 7) / 8.0, (c >> 3) - 7));
    return r;
  }();
  return v;
}
const std::vector<double>& e2m1_vals() {
  static std::vector<double> v{0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return v;
}
double quantize(double x, double scale, double maxv, const std::vector<double>& vals) {
  const double q = std::min(std::max(x / scale, -maxv), maxv);
  const double m = nearest(std::fabs(q), vals);
  return (q < 0 ? -m : m) * scale;
}
double pow2ceil(double s) { return std::ldexp(1.0, int(std::ceil(std::log2(s)))); }

// Reference fp8 round trip of one row in place (values already in the storage precision).
void ref_fp8_row(std::vector<float>& row, int64_t off, int64_t quant_dims, int block, bool pow2) {
  for (int64_t b = 0; b < quant_dims; b += block) {
    double amax = 0;
    for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(double(row[off + b + i])));
    amax = std::max(amax, 1e-4);
    double scale = double(float(amax) * (1.0f / 448.f));  // the scale itself is an fp32 quantity
    if (pow2) scale = pow2ceil(scale);
    for (int i = 0; i < block; ++i) row[off + b + i] = float(quantize(row[off + b + i], scale, 448, e4m3_vals()));
  }
}
void ref_fp4_block(float* x, int n) {
  double amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(double(x[i])));
  amax = std::max(amax, 6.0 * std::ldexp(1.0, -126));
  const double scale = pow2ceil(double(float(amax) * (1.0f / 6.f)));
  for (int i = 0; i < n; ++i) x[i] = float(quantize(x[i], scale, 6, e2m1_vals()));
}

template <typename T>
std::vector<float> to_f(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return from_bf16(v);
}

void run_fp8(int64_t rows, bool bf16, bool pow2, uint64_t seed) {
  const int64_t hd = 512, qd = 448;
  // Per-row magnitudes spread over decades so scales differ between blocks.
  std::vector<float> x = randn(rows * hd, seed);
  for (int64_t i = 0; i < rows * hd; ++i) x[i] *= std::ldexp(1.0f, int(i / 64 % 9) - 4);
  if (bf16) x = bf16_round(x);
  std::vector<float> ref = x;
  for (int64_t r = 0; r < rows; ++r) ref_fp8_row(ref, r * hd, qd, 64, pow2);
  if (bf16) ref = bf16_round(ref);
  oc::Fp8RoundTripParams p{.row_stride = hd, .rows = rows, .quant_dims = qd, .block = 64, .pow2_scale = pow2};
  std::vector<float> out;
  if (bf16) {
    DevArray<uint16_t> dx(to_bf16(x));
    p.x = dx.get();
    p.dtype = DType::kBF16;
    oc::fp8_round_trip(p, nullptr);
    out = from_bf16(dx.download());
  } else {
    DevArray<float> dx(x);
    p.x = dx.get();
    p.dtype = DType::kF32;
    oc::fp8_round_trip(p, nullptr);
    out = dx.download();
  }
  // Rope dims (448..511) must be untouched: the reference keeps them.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = qd; c < hd; ++c) ASSERT_EQ(out[r * hd + c], x[r * hd + c]);
  const std::string cs = std::string(bf16 ? "bf16" : "f32") + (pow2 ? " pow2" : " f32-scale") + " rows=" + std::to_string(rows);
  // pow2 scales make every step exact: bit-identical. A plain fp32 scale divides (1 ulp).
  report("fp8_kv_round", cs, max_rel_err(out, ref), pow2 ? 0.0 : 1e-6);
}

void run_fp4(int64_t rows, bool hadamard, uint64_t seed) {
  const int64_t d = 128;
  std::vector<float> x = bf16_round(randn(rows * d, seed, 0.7f));
  std::vector<float> ref = x;
  if (hadamard) {
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> y(d, 0.0);
      for (int64_t j = 0; j < d; ++j)
        for (int64_t i = 0; i < d; ++i) y[j] += double(x[r * d + i]) * ((__builtin_popcountll(i & j) & 1) ? -1.0 : 1.0);
      for (int64_t j = 0; j < d; ++j) ref[r * d + j] = float(y[j] / std::sqrt(double(d)));
    }
    ref = bf16_round(ref);
  }
  for (int64_t b = 0; b < rows * d; b += 32) ref_fp4_block(ref.data() + b, 32);
  ref = bf16_round(ref);
  DevArray<uint16_t> dx(to_bf16(x));
  oc::fp4_round_trip({.x = dx.get(), .dtype = DType::kBF16, .row_stride = d, .rows = rows, .dim = d,
                      .hadamard = hadamard},
                     nullptr);
  std::vector<float> out = from_bf16(dx.download());
  const std::string cs = std::string(hadamard ? "hadamard+fp4" : "fp4") + " rows=" + std::to_string(rows);
  if (!hadamard) {
    report("fp4_index_round", cs, max_rel_err(out, ref), 0.0);
    return;
  }
  // With the rotation, fp32 butterflies and the double product can round a value to different
  // bf16 neighbours, which then may land on the other side of an fp4 tie: allow a few
  // elements to differ by one fp4 step, the rest must agree exactly.
  int64_t mismatches = 0;
  for (size_t i = 0; i < out.size(); ++i) mismatches += out[i] != ref[i];
  const double frac = double(mismatches) / double(out.size());
  report("fp4_index_round", cs + " (mismatch fraction)", frac, 2e-3);
  report("fp4_index_round", cs, max_rel_err(out, ref), 0.35);  // at most one e2m1 step of a block max
}

TEST(CudaQuant, Fp8KvRoundTripMatchesFormula) {
  DI_REQUIRE_GPU();
  uint64_t seed = 900;
  for (int64_t rows : token_counts())
    for (bool bf16 : {true, false})
      for (bool pow2 : {true, false}) run_fp8(rows, bf16, pow2, ++seed);
}

TEST(CudaQuant, Fp4IndexerRoundTripMatchesFormula) {
  DI_REQUIRE_GPU();
  uint64_t seed = 950;
  for (int64_t rows : token_counts()) {
    run_fp4(rows * 64, false, ++seed);  // rows × 64 heads of the indexer q
    run_fp4(rows * 64, true, ++seed);
  }
}

TEST(CudaQuant, RejectsBadGeometry) {
  float f = 0;
  EXPECT_THROW(oc::fp8_round_trip({.x = &f, .row_stride = 512, .rows = 1, .quant_dims = 448, .block = 48}, nullptr),
               InvalidArgument);
  EXPECT_THROW(oc::fp4_round_trip({.x = &f, .row_stride = 64, .rows = 1, .dim = 64, .hadamard = true}, nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
