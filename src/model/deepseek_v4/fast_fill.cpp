#include "model/deepseek_v4/fast_fill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/numeric.h"
#include "core/parallel.h"
#include "deepinfer/error.h"
#include "io/safetensors.h"

namespace deepinfer::model::v4::fast {
namespace fs = std::filesystem;

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Four values per hash, each the sum of two 8-bit uniforms (triangular, scaled to unit variance).
// Cheap on purpose: the bench stacks only need the right scales, and a full-width layer has
// billions of expert values.
void normals(uint64_t key, uint64_t i0, int64_t n, float mean, float sd, float* out) {
  const float k = sd * (2.449489743f / 256.0f);  // sd(a + b) = 104.5 ~ 256 / sqrt(6)
  for (int64_t j = 0; j < n;) {
    const uint64_t i = i0 + uint64_t(j);
    const uint64_t h = mix64(key + (i >> 2) * 0x9e3779b97f4a7c15ull);
    for (unsigned lane = unsigned(i & 3); lane < 4 && j < n; ++lane, ++j) {
      const int a = int((h >> (16 * lane)) & 0xff), b = int((h >> (16 * lane + 8)) & 0xff);
      out[j] = mean + k * float(a + b - 255);
    }
  }
}

uint8_t e8m0_for(float amax, float qmax) {
  if (!(amax > 0)) return 127;
  int e = int(std::ceil(std::log2(double(amax) / double(qmax))));
  return uint8_t(std::clamp(e + 127, 1, 254));
}

namespace {
// Same rounding as f32_to_fp4e2m1 (nearest, ties to the even code, saturating), without branches.
inline uint8_t fp4_code(float f) {
  const float a = std::fabs(f);
  const int c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return uint8_t(c | (f < 0 ? 8 : 0));
}

// FP4 codes straight from random bytes: code = table[byte], the e2m1 rounding of (mean + sd*z) / s
// at the 256 normal quantiles z, with one e8m0 scale s = 2^floor(log2(sd/1.5)) for the whole
// tensor, so sd/s lies in [1.5, 3) and the codes use the e2m1 range.
struct Fp4Table {
  uint8_t code[256];
  uint8_t e8m0;
};
Fp4Table make_fp4_table(float mean, float sd) {
  Fp4Table t{};
  const int ex = sd > 0 ? std::clamp(int(std::floor(std::log2(double(sd) / 1.5))), -126, 127) : 0;
  const double s = std::ldexp(1.0, ex);
  t.e8m0 = uint8_t(ex + 127);
  for (int u = 0; u < 256; ++u) {
    const double p = (u + 0.5) / 256;
    double lo = -8, hi = 8;  // z with Phi(z) = p, by bisection
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
    }
    t.code[u] = fp4_code(float((mean + sd * 0.5 * (lo + hi)) / s));
  }
  return t;
}
Fp4Table fp4_table(float mean, float sd) {
  static std::mutex mu;
  static std::map<std::pair<float, float>, Fp4Table> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({mean, sd});
  if (it == cache.end()) it = cache.emplace(std::pair{mean, sd}, make_fp4_table(mean, sd)).first;
  return it->second;
}
}  // namespace

void fill_fp8(uint8_t* q, uint8_t* sc, int64_t R, int64_t C, int64_t br, int64_t bc, uint64_t key, float mean,
              float sd) {
  const int64_t sr = (R + br - 1) / br, ncb = (C + bc - 1) / bc;
  parallel_for(0, sr, [&](int64_t bi) {  // one block row per task
    const int64_t r0 = bi * br, r1 = std::min(R, r0 + br);
    std::vector<float> v(static_cast<size_t>((r1 - r0) * C));
    std::vector<float> amax(static_cast<size_t>(ncb), 0.f);
    normals(key, uint64_t(r0 * C), (r1 - r0) * C, mean, sd, v.data());
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < C; ++j)
        amax[size_t(j / bc)] = std::max(amax[size_t(j / bc)], std::fabs(v[size_t((i - r0) * C + j)]));
    std::vector<float> inv(static_cast<size_t>(ncb));
    for (int64_t bj = 0; bj < ncb; ++bj) {
      const uint8_t e = e8m0_for(amax[size_t(bj)], 448.f);
      sc[bi * ncb + bj] = e;
      inv[size_t(bj)] = 1.f / e8m0_to_f32(e);
    }
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < C; ++j) q[i * C + j] = f32_to_fp8e4m3(v[size_t((i - r0) * C + j)] * inv[size_t(j / bc)]);
  });
}

// 8 random bytes per hash -> 4 packed bytes.
void fill_fp4(uint8_t* q, uint8_t* sc, int64_t R, int64_t C, int64_t b, uint64_t key, float mean, float sd) {
  const Fp4Table t = fp4_table(mean, sd);
  std::memset(sc, t.e8m0, size_t(R * (C / b)));
  const int64_t nbytes = R * C / 2;
  constexpr int64_t kChunk = 1 << 16;  // a multiple of 4: chunk boundaries never split a hash
  parallel_for(0, (nbytes + kChunk - 1) / kChunk, [&](int64_t ch) {
    const int64_t end = std::min(nbytes, (ch + 1) * kChunk);
    for (int64_t i = ch * kChunk; i < end; i += 4) {
      uint64_t h = mix64(key + uint64_t(i / 4) * 0x9e3779b97f4a7c15ull);
      for (int64_t k = 0; k < 4 && i + k < end; ++k, h >>= 16)
        q[i + k] = uint8_t(t.code[h & 0xff] | (t.code[(h >> 8) & 0xff] << 4));
    }
  });
}

void fill_float(uint8_t* dst, int64_t n, bool f32, uint64_t key, float mean, float sd) {
  constexpr int64_t kChunk = 1 << 16;
  parallel_for(0, (n + kChunk - 1) / kChunk, [&](int64_t ch) {
    std::vector<float> v(static_cast<size_t>(kChunk));
    const int64_t i0 = ch * kChunk, m = std::min(n, i0 + kChunk) - i0;
    normals(key, uint64_t(i0), m, mean, sd, v.data());
    if (f32) {
      std::memcpy(dst + 4 * i0, v.data(), size_t(m) * 4);
    } else {
      for (int64_t i = 0; i < m; ++i) {
        const uint16_t h = f32_to_bf16(v[size_t(i)]);
        std::memcpy(dst + 2 * (i0 + i), &h, 2);
      }
    }
  });
}

void write_streamed(const std::string& dir, const std::vector<Item>& items, int num_shards, bool progress) {
  uint64_t total = 0;
  for (const Item& it : items) total += it.nbytes;
  const int n = std::max(1, num_shards);
  auto shard_name = [&](int i) {
    if (n == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
    return std::string(buf);
  };
  std::vector<std::vector<const Item*>> shard_items(static_cast<size_t>(n));
  std::map<std::string, std::string> weight_map;
  uint64_t acc = 0;
  for (const Item& it : items) {
    const int si = std::min(n - 1, int(acc * uint64_t(n) / std::max<uint64_t>(total, 1)));
    shard_items[size_t(si)].push_back(&it);
    for (const Piece& p : it.pieces) weight_map[p.name] = shard_name(si);
    acc += it.nbytes;
  }
  constexpr uint64_t kGroup = uint64_t(256) << 20;
  std::vector<uint8_t> buf[2];
  uint64_t written = 0;
  int last_pct = -1;
  for (int si = 0; si < n; ++si) {
    nlohmann::json h = nlohmann::json::object();
    h["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (const Item* it : shard_items[size_t(si)])
      for (const Piece& p : it->pieces) {
        h[p.name] = {{"dtype", p.st_dtype}, {"shape", p.shape}, {"data_offsets", {off, off + p.nbytes}}};
        off += p.nbytes;
      }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    const std::string path = (fs::path(dir) / shard_name(si)).string();
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
    if (!f) DI_THROW(CheckpointError, path, ": cannot open for writing");
    const uint64_t hn = text.size();
    bool ok = std::fwrite(&hn, 8, 1, f.get()) == 1 && std::fwrite(text.data(), 1, text.size(), f.get()) == text.size();
    std::future<bool> pending;
    int cur = 0;
    const auto& its = shard_items[size_t(si)];
    for (size_t i = 0; i < its.size() && ok;) {
      uint64_t bytes = 0;
      size_t j = i;
      while (j < its.size() && (j == i || bytes + its[j]->nbytes <= kGroup)) bytes += its[j++]->nbytes;
      std::vector<uint8_t>& b = buf[cur];
      if (b.size() < bytes) b = std::vector<uint8_t>(bytes);  // no copy of the old contents
      uint64_t o = 0;
      for (size_t k = i; k < j; ++k) {
        its[k]->fill(b.data() + o);
        o += its[k]->nbytes;
      }
      if (pending.valid()) ok = pending.get();
      pending = std::async(std::launch::async, [fp = f.get(), p = b.data(), bytes] {
        return std::fwrite(p, 1, bytes, fp) == bytes;
      });
      cur ^= 1;
      i = j;
      written += bytes;
      const int pct = int(100 * written / std::max<uint64_t>(total, 1));
      if (progress && pct != last_pct) {
        std::fprintf(stderr, "\rdeepinfer: writing random checkpoint %.2f / %.2f GiB (%d%%)", double(written) / (1 << 30),
                     double(total) / (1 << 30), pct);
        last_pct = pct;
      }
    }
    if (pending.valid()) ok = pending.get() && ok;
    if (!ok) DI_THROW(CheckpointError, path, ": write failed (disk full?)");
  }
  if (progress) std::fprintf(stderr, "\n");
  if (n > 1) io::write_index(dir, weight_map, total);
}

}  // namespace deepinfer::model::v4::fast
