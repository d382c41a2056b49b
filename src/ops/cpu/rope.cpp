#include "ops/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

std::vector<float> rope_inv_freq(double theta, int64_t rope_dim, const YarnScaling* yarn) {
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope_dim=", rope_dim);
  const int64_t half = rope_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const float base = float(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base, float(2 * i) / float(rope_dim));  // fp32 like torch
    inv[i] = 1.0f / pos_freq;
  }
  if (!yarn) return inv;
  // Correction range in float64 (Python math), as transformers does.
  auto corr_dim = [&](double rot) {
    return (double(rope_dim) * std::log(yarn->original_max_position / (rot * 2 * M_PI))) / (2 * std::log(theta));
  };
  double low = std::max(std::floor(corr_dim(yarn->beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(yarn->beta_slow)), double(rope_dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(base, float(2 * i) / float(rope_dim));
    const float extrap = 1.0f / pos_freq;
    const float interp = 1.0f / (float(yarn->factor) * pos_freq);
    float ramp = (float(i) - float(low)) / float(high - low);
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extrap_factor = 1.0f - ramp;
    inv[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  return inv;
}

void rope_apply(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* pos,
                const float* inv_freq, bool inverse) {
  DI_CHECK(rope_dim % 2 == 0 && rope_dim <= head_dim, "rope_dim=", rope_dim, " head_dim=", head_dim);
  const int64_t half = rope_dim / 2;
  constexpr int64_t kMaxHalf = 256;  // stack tables; V4 uses rope_dim 64
  DI_CHECK(half <= kMaxHalf, "rope_dim too large: ", rope_dim);
  parallel_for(0, rows, [&](int64_t r) {
    float cs[kMaxHalf], sn[kMaxHalf];
    const float p = float(pos[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = p * inv_freq[i];
      cs[i] = std::cos(ang);
      sn[i] = inverse ? -std::sin(ang) : std::sin(ang);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim + (head_dim - rope_dim);
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cs[i] - b * sn[i];
        v[2 * i + 1] = b * cs[i] + a * sn[i];
      }
    }
  }, grain_for(heads * rope_dim * 3 + rope_dim * 20));
}

}  // namespace deepinfer::ops::cpu
