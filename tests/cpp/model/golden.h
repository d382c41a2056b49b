// Test helpers for the golden fixtures in tests/data/golden (see its README.md): locating them,
// reading float32 .npy arrays and inputs.json.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace deepinfer::testing {

inline std::string golden_dir(const std::string& name) {
  const char* src = std::getenv("DEEPINFER_SOURCE_DIR");
  std::filesystem::path root = src ? src : DEEPINFER_TEST_SOURCE_DIR;
  return (root / "tests" / "data" / "golden" / name).string();
}

struct Npy {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Minimal reader for little-endian float32 C-order .npy (format versions 1-3).
inline Npy read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[8];
  f.read(magic, 8);
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not an npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  std::string header(hlen, ' ');
  f.read(header.data(), hlen);
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    throw std::runtime_error(path + ": expected C-order <f4, header " + header);
  Npy out;
  const size_t lp = header.find('(', header.find("'shape'")), rp = header.find(')', lp);
  std::string dims = header.substr(lp + 1, rp - lp - 1);
  size_t pos = 0;
  int64_t numel = 1;
  while (pos < dims.size()) {
    size_t comma = dims.find(',', pos);
    std::string tok = dims.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok.find_first_of("0123456789") != std::string::npos) {
      out.shape.push_back(std::stoll(tok));
      numel *= out.shape.back();
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  out.data.resize(size_t(numel));
  f.read(reinterpret_cast<char*>(out.data.data()), std::streamsize(numel * 4));
  if (!f) throw std::runtime_error(path + ": truncated data");
  return out;
}

inline std::map<std::string, std::vector<int32_t>> read_inputs(const std::string& dir) {
  std::ifstream f(dir + "/inputs.json");
  nlohmann::json j = nlohmann::json::parse(f);
  std::map<std::string, std::vector<int32_t>> out;
  for (auto& [k, v] : j.items()) out[k] = v.get<std::vector<int32_t>>();
  return out;
}

// Logits [rows, V] against a reference: largest |difference|, largest |reference| (for a
// relative figure), rows whose argmax differs, rows whose largest |difference| <= row_tol.
struct LogitsDiff {
  double max_abs = 0, max_ref = 0;
  int64_t argmax_mismatch = 0, rows = 0, rows_within = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  void add(const LogitsDiff& o) {
    max_abs = std::max(max_abs, o.max_abs);
    max_ref = std::max(max_ref, o.max_ref);
    argmax_mismatch += o.argmax_mismatch;
    rows += o.rows;
    rows_within += o.rows_within;
  }
};
inline LogitsDiff compare_logits(const float* got, const float* ref, int64_t rows, int64_t V, double row_tol = 0) {
  LogitsDiff d;
  d.rows = rows;
  for (int64_t t = 0; t < rows; ++t) {
    const float *a = got + t * V, *b = ref + t * V;
    double row = 0;
    for (int64_t v = 0; v < V; ++v) {
      row = std::max(row, double(std::abs(a[v] - b[v])));
      d.max_ref = std::max(d.max_ref, double(std::abs(b[v])));
    }
    d.max_abs = std::max(d.max_abs, row);
    d.rows_within += row <= row_tol;
    if (std::max_element(a, a + V) - a != std::max_element(b, b + V) - b) d.argmax_mismatch++;
  }
  return d;
}

// Random chunk sizes in [1, 40] covering T tokens.
inline std::vector<int64_t> random_chunks(int64_t T, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(1, 40);
  std::vector<int64_t> c;
  for (int64_t done = 0; done < T;) {
    const int64_t n = std::min(dist(gen), T - done);
    c.push_back(n);
    done += n;
  }
  return c;
}

// Chunks of `chunk` tokens covering T (the last one shorter); chunk 0 = one chunk of T.
inline std::vector<int64_t> fixed_chunks(int64_t T, int64_t chunk) {
  if (chunk <= 0) return {T};
  std::vector<int64_t> c;
  for (int64_t done = 0; done < T; done += chunk) c.push_back(std::min(chunk, T - done));
  return c;
}

// Slot `slot`'s blocks interleaved with the other slots' and in reverse order (block b*num_slots
// + slot, last first), so a batch exercises non-contiguous block tables.
inline std::vector<int32_t> scattered_block_table(const kv::CacheGeometry& g, int32_t slot) {
  std::vector<int32_t> t;
  for (int64_t b = g.num_blocks / g.num_slots - 1; b >= 0; --b) t.push_back(int32_t(b * g.num_slots + slot));
  return t;
}

}  // namespace deepinfer::testing
