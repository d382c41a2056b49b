// Test helpers for the golden fixtures in tests/data/golden (see its README.md): locating them,
// reading float32 .npy arrays and inputs.json.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace deepinfer::testing
