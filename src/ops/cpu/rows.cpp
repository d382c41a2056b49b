#include "ops/cpu/rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::ops::cpu {
namespace {
float load(const void* base, DType dt, int64_t idx) {
  return dt == DType::kF32 ? static_cast<const float*>(base)[idx] : bf16_to_f32(static_cast<const uint16_t*>(base)[idx]);
}
void store(void* base, DType dt, int64_t idx, float v) {
  if (dt == DType::kF32)
    static_cast<float*>(base)[idx] = v;
  else
    static_cast<uint16_t*>(base)[idx] = f32_to_bf16(v);
}
bool float_dtype(DType d) { return d == DType::kF32 || d == DType::kBF16; }
}  // namespace

void validate_gather_rows(const GatherRowsArgs& p) {
  if (p.rows < 0 || p.width < 0) DI_THROW(InvalidArgument, "gather_rows: bad shape rows=", p.rows, " width=", p.width);
  if (!float_dtype(p.src_dtype) || !float_dtype(p.dst_dtype))
    DI_THROW(InvalidArgument, "gather_rows: dtypes ", dtype_name(p.src_dtype), " -> ", dtype_name(p.dst_dtype),
             " (f32 or bf16 only)");
  if (p.rows == 0 || p.width == 0) return;
  if (!p.src_a || !p.dst) DI_THROW(InvalidArgument, "gather_rows: null src_a or dst");
  if (p.a_stride < p.width || p.dst_stride < p.width || (p.src_b && p.b_stride < p.width))
    DI_THROW(InvalidArgument, "gather_rows: row strides (a ", p.a_stride, ", b ", p.b_stride, ", dst ", p.dst_stride,
             ") < width ", p.width);
}

void gather_rows(const GatherRowsArgs& p) {
  validate_gather_rows(p);
  const bool same = p.src_dtype == p.dst_dtype;
  const size_t elem = p.src_dtype == DType::kF32 ? 4 : 2;
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t si = p.src_index ? p.src_index[i] : i;
    const bool a = si >= 0;
    const int64_t row = a ? si : -si - 1;
    const void* src = a ? p.src_a : p.src_b;
    const int64_t stride = a ? p.a_stride : p.b_stride;
    const int64_t di = p.dst_index ? p.dst_index[i] : i;
    if (di < 0) continue;
    if (same) {  // a plain copy: bit-exact and fast
      std::memcpy(static_cast<char*>(p.dst) + size_t(di * p.dst_stride) * elem,
                  static_cast<const char*>(src) + size_t(row * stride) * elem, size_t(p.width) * elem);
      continue;
    }
    for (int64_t e = 0; e < p.width; ++e)
      store(p.dst, p.dst_dtype, di * p.dst_stride + e, load(src, p.src_dtype, row * stride + e));
  }
}

void add_position_bias(const PositionBiasArgs& p) {
  if (p.rows < 0 || p.width < 0 || p.m <= 0)
    DI_THROW(InvalidArgument, "add_position_bias: bad shape rows=", p.rows, " width=", p.width, " m=", p.m);
  for (int64_t t = 0; t < p.rows; ++t) {
    float* z = p.z + t * p.z_stride;
    const float* b = p.bias + (p.pos[t] % p.m) * p.width;
    for (int64_t e = 0; e < p.width; ++e) z[e] += b[e];
  }
}

void moe_combine(const MoeCombineArgs& p) {
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t e = 0; e < p.dim; ++e) {
      float acc = 0.f;
      for (int64_t k = 0; k < p.topk; ++k) {
        const int64_t r = p.rows[t * p.topk + k];
        if (r >= 0) acc += p.ye[r * p.dim + e];
      }
      if (p.shared) acc += p.shared[t * p.dim + e];
      p.out[t * p.dim + e] = acc;
    }
}

void validate_decode_pool(const DecodePoolArgs& p) {
  if (p.tokens < 0 || p.ratio <= 0 || p.width <= 0 || (p.overlap && p.width % 2) ||
      p.rows_per_token != (p.overlap ? 2 * p.ratio : p.ratio) || p.ld < 2 * p.width)
    DI_THROW(InvalidArgument, "decode_pool: bad shape tokens=", p.tokens, " ratio=", p.ratio, " width=", p.width,
             " rows_per_token=", p.rows_per_token, " ld=", p.ld);
  if (p.tokens > 0 && (!p.stage || !p.block || !p.out)) DI_THROW(InvalidArgument, "decode_pool: null stage, block or out");
}

void decode_pool(const DecodePoolArgs& p) {
  validate_decode_pool(p);
  const int64_t d = p.overlap ? p.width / 2 : p.width, m = p.ratio, ld = p.ld;
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int64_t b = p.block[t];
    if (b < 0) continue;
    const int64_t row0 = p.overlap ? m * (b - 1) : m * b;
    const float* a = p.stage + t * p.rows_per_token * ld;
    const float* z = a + p.width;
    for (int64_t e = 0; e < d; ++e) {
      std::vector<std::pair<int64_t, int64_t>> slots;  // (row, column)
      if (p.overlap)
        for (int64_t s = std::max<int64_t>(m * (b - 1), 0); s < m * b; ++s) slots.push_back({s - row0, e});
      for (int64_t s = m * b; s < m * b + m; ++s) slots.push_back({s - row0, (p.overlap ? d : 0) + e});
      float mx = -INFINITY;
      for (auto [r, c] : slots) mx = std::fmax(mx, z[r * ld + c]);
      float sum = 0.f, acc = 0.f;
      for (auto [r, c] : slots) {
        const float w = std::exp(z[r * ld + c] - mx);
        sum += w;
        acc += w * a[r * ld + c];
      }
      p.out[t * d + e] = acc / sum;
    }
  }
}

void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < streams; ++j)
      for (int64_t i = 0; i < dim; ++i) x[(t * streams + j) * dim + i] += v[t * dim + i];
}

void validate_input_patch(const InputPatchArgs& a) {
  if (a.count < 0 || a.n_streams <= 0)
    DI_THROW(InvalidArgument, "patch_input_tokens: count ", a.count, " / n_streams ", a.n_streams, " invalid");
  if (a.count > 0 && (!a.patch || !a.sampled || !a.token_ids || !a.embed_src))
    DI_THROW(InvalidArgument, "patch_input_tokens: null patch, sampled, token_ids or embed_src");
}

void patch_input_tokens(const InputPatchArgs& a) {
  validate_input_patch(a);
  for (int64_t i = 0; i < a.count; ++i) {
    const int64_t t = a.patch[2 * i];
    const int32_t id = a.sampled[a.patch[2 * i + 1]];
    a.token_ids[t] = id;
    for (int64_t j = 0; j < a.n_streams; ++j) a.embed_src[t * a.n_streams + j] = id;
  }
}

}  // namespace deepinfer::ops::cpu
