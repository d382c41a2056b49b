// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a
// counter-based generator. Output is a pure function of (key, counter), so a draw keyed by
// (request seed, sample index, position) is reproducible regardless of batch composition,
// thread count or preemption. The same function runs on the device.
#pragma once
#include <array>
#include <cstdint>

#include "core/numeric.h"  // DI_HD: host and device (the CUDA sampler draws with this same code)

namespace deepinfer::engine {

using Philox4x32 = std::array<uint32_t, 4>;

DI_HD Philox4x32 philox4x32_10(Philox4x32 ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    uint64_t p0 = uint64_t(kM0) * ctr[0];
    uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
  }
  return ctr;
}

// Purposes of a draw, so different uses at one position never share a counter: plain sampling,
// and speculative decoding's acceptance test, residual draw and the draft's own draw.
enum class DrawStream : uint32_t { kSample = 0, kSpecAccept = 1, kSpecResidual = 2, kSpecDraft = 3 };

// A uniform double in [0, 1) with 53 random bits, keyed by (seed, sample_index, position).
DI_HD double philox_uniform(uint64_t seed, uint32_t sample_index, int64_t position,
                             DrawStream stream = DrawStream::kSample) {
  Philox4x32 out = philox4x32_10({uint32_t(uint64_t(position)), uint32_t(uint64_t(position) >> 32), sample_index,
                                  uint32_t(stream)},
                                 {uint32_t(seed), uint32_t(seed >> 32)});
  uint64_t bits = (uint64_t(out[0]) << 21) ^ (uint64_t(out[1]) >> 11);  // 53 bits
  bits &= (uint64_t(1) << 53) - 1;
  return double(bits) * (1.0 / 9007199254740992.0);
}

}  // namespace deepinfer::engine
