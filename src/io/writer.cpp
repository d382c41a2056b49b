#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace deepinfer::io {
using json = nlohmann::json;

void SafetensorsWriter::add_raw(const std::string& name, const std::string& st_dtype, const Shape& shape,
                                const void* data, size_t nbytes) {
  for (const auto& e : entries_) DI_CHECK(e.name != name, "SafetensorsWriter: duplicate tensor '", name, "'");
  const uint64_t begin = data_.size();
  data_.resize(begin + nbytes);
  if (nbytes) std::memcpy(data_.data() + begin, data, nbytes);
  entries_.push_back({name, st_dtype, shape, begin, begin + nbytes});
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  DI_CHECK(t.device().is_cpu(), "SafetensorsWriter::add(", name, "): tensor on ", t.device().str());
  Tensor c = t.contiguous();
  add_raw(name, std::string(dtype_to_safetensors(c.dtype())), c.shape(), c.raw_data(), c.nbytes());
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  json h = json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  for (const auto& e : entries_)
    h[e.name] = {{"dtype", e.st_dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  const uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) DI_THROW(CheckpointError, path, ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), std::streamsize(text.size()));
  out.write(data_.data(), std::streamsize(data_.size()));
  if (!out) DI_THROW(CheckpointError, path, ": write failed");
}

void write_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                 uint64_t total_size) {
  json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  const std::string path = (std::filesystem::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(path);
  if (!out) DI_THROW(CheckpointError, path, ": cannot open for writing");
  out << j.dump(2) << "\n";
}

}  // namespace deepinfer::io
