// Compiled with -ffp-contract=off (CMakeLists.txt): every multiply and add rounds on its own, so the
// AVX-512 / AVX2 / baseline clones of the kernel give the same bits.
#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"
#include "ops/cpu/target_clones.h"

namespace deepinfer::ops::cpu {
namespace {
constexpr int64_t kLanes = 16;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

[[gnu::always_inline]] inline Lanes load(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// q.k in one fixed order: 16 lane sums (lane l adds the i = l mod 16 terms in increasing i), folded
// 8+8, 4+4, 2+2, 1+1, then the d % 16 tail in order. The same for every token, head and batch.
[[gnu::always_inline]] inline float dot(const float* q, const float* k, int64_t d) {
  const int64_t d16 = d - d % kLanes;
  Lanes acc = Lanes{};
  for (int64_t i = 0; i < d16; i += kLanes) acc = acc + load(q + i) * load(k + i);
  float v[kLanes];
  __builtin_memcpy(v, &acc, sizeof(v));
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t l = 0; l < w; ++l) v[l] = v[l] + v[l + w];
  float s = v[0];
  for (int64_t i = d16; i < d; ++i) s = s + q[i] * k[i];
  return s;
}

// One token, all heads: each head one pass with an online softmax (running max, rescaled sums)
// that starts from the sink logit, so no per-item buffers are needed; a GPU kernel does the same.
// The heads share every key row (one K=V head), so a key is loaded once and the heads' independent
// updates overlap; each head's arithmetic is the same sequence as on its own.
DI_TARGET_CLONES
void attend(const SparseAttnArgs& a, int64_t t) {
  const int64_t H = a.num_heads, d = a.head_dim;
  constexpr int64_t kMaxHeads = 256;
  float mx[kMaxHeads], denom[kMaxHeads];
  const float* q = a.q + t * H * d;
  float* o = a.out + t * H * d;
  std::fill(o, o + H * d, 0.f);
  for (int64_t h = 0; h < H; ++h) mx[h] = a.sink[h], denom[h] = 1.0f;  // exp(sink - mx)
  int64_t nkeys = 0;
  auto visit = [&](const float* k) {
    for (int64_t h = 0; h < H; ++h) {
      float* oh = o + h * d;
      const float s = dot(q + h * d, k, d) * a.scale;
      if (s > mx[h]) {
        const float c = std::exp(mx[h] - s);
        denom[h] *= c;
        for (int64_t i = 0; i < d; ++i) oh[i] *= c;
        mx[h] = s;
      }
      const float p = std::exp(s - mx[h]);
      denom[h] += p;
      for (int64_t i = 0; i < d; ++i) oh[i] += p * k[i];
    }
    ++nkeys;
  };
  const int64_t nw = a.win_count[t];
  for (int64_t j = 0; j < nw; ++j) visit(a.win_kv + (int64_t(a.win_begin[t]) + j) * d);
  const int64_t nc = a.cmp_count ? a.cmp_count[t] : 0;
  for (int64_t j = 0; j < nc; ++j) {
    const int32_t r = a.cmp_rows[a.cmp_offset[t] + j];
    if (r >= 0) visit(a.cmp_kv + int64_t(r) * d);
  }
  for (int64_t h = 0; h < H; ++h) {
    const float inv = nkeys == 0 ? 0.f : 1.0f / denom[h];
    for (int64_t i = 0; i < d; ++i) o[h * d + i] *= inv;
  }
}
}  // namespace

void sparse_attention(const SparseAttnArgs& a) {
  const int64_t T = a.num_tokens, H = a.num_heads, d = a.head_dim;
  DI_CHECK(a.q && a.out && a.sink && a.win_begin && a.win_count, "sparse_attention: missing inputs");
  DI_CHECK(H > 0 && H <= 256, "sparse_attention: ", H, " heads (1..256)");
  // Work item = token (all its heads).
  parallel_for(0, T, [&](int64_t t) { attend(a, t); }, grain_for(4 * d * H * (a.cmp_count ? 64 : 32)));
}

}  // namespace deepinfer::ops::cpu
