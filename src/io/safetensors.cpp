#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/json.h"
#include "core/logging.h"

namespace deepinfer::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// Headers of real checkpoints are a few MB at most; refuse absurd lengths before allocating.
constexpr uint64_t kMaxHeaderBytes = uint64_t(256) << 20;

std::string base_name(const std::string& p) { return fs::path(p).filename().string(); }

struct Mapping {
  void* addr = nullptr;
  size_t len = 0;
};

Mapping map_file(const std::string& path, uint64_t* size_out) {
  // O_NONBLOCK: opening a named pipe for reading would otherwise wait for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) DI_THROW(CheckpointError, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    DI_THROW(CheckpointError, path, ": cannot stat: ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    DI_THROW(CheckpointError, path, ": is ", file_kind_name(st.st_mode), ", not a regular file");
  }
  *size_out = uint64_t(st.st_size);
  Mapping m;
  m.len = size_t(st.st_size);
  if (m.len > 0) {
    m.addr = ::mmap(nullptr, m.len, PROT_READ, MAP_SHARED, fd, 0);
    if (m.addr == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      DI_THROW(CheckpointError, path, ": mmap failed: ", std::strerror(e));
    }
  }
  ::close(fd);  // the mapping keeps the file referenced
  return m;
}
}  // namespace

std::string SafetensorsFile::file_name() const { return base_name(path_); }

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::make_shared<SafetensorsFile>();
  f->path_ = path;
  Mapping m = map_file(path, &f->file_size_);
  // The Storage owns the mapping; every Tensor view holds the Storage.
  f->mapping_ = std::make_shared<Storage>(m.addr, m.len, Device::cpu(), [len = m.len](void* p) {
    if (p) ::munmap(p, len);
  });
  const std::string name = base_name(path);
  if (f->file_size_ < 8)
    DI_THROW(CheckpointError, name, ": file is ", f->file_size_, " bytes, too short for a safetensors header");
  uint64_t n = 0;
  std::memcpy(&n, m.addr, 8);  // little-endian u64 (x86/ARM hosts are little-endian)
  if (n > kMaxHeaderBytes || n > f->file_size_ - 8)
    DI_THROW(CheckpointError, name, ": header length ", n, " runs past the end of the file (", f->file_size_,
             " bytes): truncated or not a safetensors file");
  f->data_start_ = 8 + n;
  f->parse_header(static_cast<const char*>(m.addr) + 8, size_t(n));
  return f;
}

namespace {
// dims -> element count and byte size, refusing products that overflow (a corrupt header can
// name any 64-bit dims). Zero dims are skipped in the overflow check so that strides over the
// other dims stay representable too.
bool checked_size(const Shape& shape, DType dt, int64_t* numel, uint64_t* nbytes) {
  int64_t n = 1, nonzero = 1;
  for (int64_t s : shape) {
    if (s != 0 && __builtin_mul_overflow(nonzero, s, &nonzero)) return false;
    n = s == 0 ? 0 : n * s;  // |n| <= nonzero: cannot overflow
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(uint64_t(nonzero), uint64_t(dtype_bits(dt)), &bits)) return false;
  *numel = n;
  *nbytes = n == 0 ? 0 : (uint64_t(n) * dtype_bits(dt) + 7) / 8;
  return true;
}
}  // namespace

void SafetensorsFile::parse_header(const char* text, size_t len) {
  const std::string name = file_name();
  json h;
  std::string why;
  if (!parse_json_bounded(std::string_view(text, len), h, &why))
    DI_THROW(CheckpointError, name, ": corrupt header (not valid JSON): ", why);
  if (!h.is_object()) DI_THROW(CheckpointError, name, ": corrupt header: top level is not a JSON object");
  const uint64_t data_size = file_size_ - data_start_;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) DI_THROW(CheckpointError, name, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m)
        metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>()
                                                   : m.value().dump(-1, ' ', false, json::error_handler_t::replace);
      continue;
    }
    auto bad = [&](const std::string& why) { DI_THROW(CheckpointError, name, ": tensor '", key, "': ", why); };
    if (!v.is_object()) bad("header entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing or non-string 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing or non-array 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      bad("'data_offsets' must be [begin, end]");
    const json& shape = v["shape"];
    const json& offsets = v["data_offsets"];
    TensorInfo ti;
    ti.name = key;
    ti.st_dtype = v["dtype"].get<std::string>();
    auto dt = dtype_from_safetensors(ti.st_dtype);
    if (!dt) bad("unknown dtype '" + ti.st_dtype + "'");
    ti.dtype = *dt;
    for (const json& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
        bad("shape entries must be integers in [0, 2^63), got " + json_snippet(shape));
      ti.shape.push_back(d.get<int64_t>());
    }
    for (int i = 0; i < 2; ++i)
      if (!offsets[i].is_number_unsigned()) bad("data_offsets must be non-negative integers, got " + json_snippet(offsets));
    ti.begin = offsets[0].get<uint64_t>();
    ti.end = offsets[1].get<uint64_t>();
    if (ti.end < ti.begin) bad("data_offsets " + json_snippet(offsets) + " end before begin");
    if (ti.end > data_size)
      bad(detail::str_cat("data_offsets ", json_snippet(offsets), " run past the end of the data section (",
                          data_size, " bytes): file truncated?"));
    int64_t numel = 0;
    uint64_t want = 0;
    if (!checked_size(ti.shape, ti.dtype, &numel, &want))
      bad("shape " + json_snippet(shape) + " has more elements than 64-bit sizes can hold");
    if (ti.end - ti.begin != want)
      bad(detail::str_cat("byte range ", ti.end - ti.begin, " != ", want, " for ", ti.st_dtype, shape_str(ti.shape)));
    index_[key] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }
  // Ranges must not overlap (zero-size tensors occupy nothing).
  std::vector<const TensorInfo*> by_begin;
  for (const auto& t : tensors_)
    if (t.end > t.begin) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i)
    if (by_begin[i]->begin < by_begin[i - 1]->end)
      DI_THROW(CheckpointError, name, ": tensors '", by_begin[i - 1]->name, "' [", by_begin[i - 1]->begin, ",",
               by_begin[i - 1]->end, ") and '", by_begin[i]->name, "' [", by_begin[i]->begin, ",", by_begin[i]->end,
               ") overlap");
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo* ti = find(name);
  if (!ti) DI_THROW(CheckpointError, file_name(), ": no tensor '", name, "'");
  return tensor(*ti);
}

Tensor SafetensorsFile::tensor(const TensorInfo& ti) const {
  Tensor view(mapping_, size_t(data_start_ + ti.begin), ti.shape, contiguous_strides(ti.shape), ti.dtype);
  // The format pads only the header (to 8 bytes, and not every writer does) and forbids holes
  // between tensors, so a spec-valid file can place a tensor off its element alignment (an I64
  // after 15 bytes of F8). Reading it through data<T>() would be undefined behaviour (UBSan found
  // it); such a tensor is copied once into aligned memory instead of viewed.
  const size_t align = std::max<size_t>(1, size_t(dtype_bits(ti.dtype)) / 8);
  const auto addr = reinterpret_cast<uintptr_t>(mapping_->data()) + uintptr_t(data_start_ + ti.begin);
  return addr % align == 0 || view.numel() == 0 ? view : view.clone();
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

void Checkpoint::add_file(std::shared_ptr<SafetensorsFile> f) {
  const uint32_t fi = uint32_t(files_.size());
  for (uint32_t i = 0; i < f->tensors().size(); ++i) {
    const std::string& n = f->tensors()[i].name;
    auto [it, fresh] = where_.emplace(n, Loc{fi, i});
    if (!fresh)
      DI_THROW(CheckpointError, f->file_name(), ": tensor '", n, "' is also in ",
               files_[it->second.file]->file_name());
  }
  files_.push_back(std::move(f));
}

void Checkpoint::check_index(const std::string& index_path,
                             const std::map<std::string, std::string>& weight_map) const {
  for (const auto& [tname, shard] : weight_map) {
    auto it = where_.find(tname);
    if (it == where_.end())
      DI_THROW(CheckpointError, base_name(index_path), ": tensor '", tname, "' is listed in shard ", shard,
               " but that shard does not contain it");
    const std::string& actual = files_[it->second.file]->file_name();
    if (actual != base_name(shard))
      DI_THROW(CheckpointError, base_name(index_path), ": tensor '", tname, "' is listed in ", shard,
               " but found in ", actual);
  }
}

Checkpoint Checkpoint::open(const std::string& path, bool progress) {
  Checkpoint c;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    c.dir_ = fs::path(path).parent_path().string();
    c.add_file(SafetensorsFile::open(path));
    return c;
  }
  if (!fs::is_directory(path, ec)) DI_THROW(CheckpointError, path, ": no such checkpoint folder or file");
  c.dir_ = path;
  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  std::vector<std::string> shards;
  std::map<std::string, std::string> weight_map;
  // The non-throwing filesystem calls: a name the OS refuses (too long, a bad component) is a
  // CheckpointError naming it, never a std::filesystem_error escaping the loader.
  auto exists = [](const fs::path& p, const std::string& what) {
    std::error_code err;
    const bool found = fs::exists(p, err);
    if (err && err != std::errc::no_such_file_or_directory)
      DI_THROW(CheckpointError, what, ": ", err.message());
    return found;
  };
  if (exists(index, index.string())) {
    const json j = parse_json_or_throw<CheckpointError>(read_regular_file_or_throw<CheckpointError>(index.string()),
                                                        index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      DI_THROW(CheckpointError, index.string(), ": missing object field 'weight_map'");
    std::map<std::string, std::string> first_tensor;  // shard -> one tensor it should hold (for messages)
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        DI_THROW(CheckpointError, index.string(), ": weight_map['", it.key(), "'] is not a string");
      std::string shard = it.value().get<std::string>();
      // Shards live in the checkpoint folder: a path elsewhere is a corrupt or hostile index.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        DI_THROW(CheckpointError, index.string(), ": weight_map['", it.key(), "'] = '", shard,
                 "' is not a file name in the checkpoint folder");
      weight_map[it.key()] = shard;
      if (first_tensor.emplace(shard, it.key()).second) shards.push_back(shard);
    }
    std::sort(shards.begin(), shards.end());
    for (const auto& s : shards)
      if (!exists(fs::path(path) / s, index.string() + ": shard " + s.substr(0, 200) + (s.size() > 200 ? "..." : "")))
        DI_THROW(CheckpointError, index.string(), ": shard ", s, " (holding tensor '", first_tensor[s],
                 "') does not exist in ", path);
  } else if (exists(fs::path(path) / "model.safetensors", path + "/model.safetensors")) {
    shards.push_back("model.safetensors");
  } else {
    fs::directory_iterator it(path, ec);
    if (ec) DI_THROW(CheckpointError, path, ": cannot list the folder: ", ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) DI_THROW(CheckpointError, path, ": cannot list the folder: ", ec.message());
      if (it->path().extension() == ".safetensors") shards.push_back(it->path().filename().string());
    }
    std::sort(shards.begin(), shards.end());
  }
  if (shards.empty())
    DI_THROW(CheckpointError, path, ": no model.safetensors.index.json, model.safetensors or *.safetensors found");
  for (size_t i = 0; i < shards.size(); ++i) {
    auto f = SafetensorsFile::open((fs::path(path) / shards[i]).string());
    if (progress)
      DI_INFO("loading shard ", i + 1, "/", shards.size(), ": ", shards[i], " (", f->tensors().size(), " tensors, ",
              f->file_size() / (1 << 20), " MiB)");
    c.add_file(std::move(f));
  }
  if (!weight_map.empty()) c.check_index(index.string(), weight_map);
  return c;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) DI_THROW(CheckpointError, dir_, ": no tensor '", name, "' in any shard");
  return files_[it->second.file]->tensors()[it->second.index];
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) DI_THROW(CheckpointError, dir_, ": no tensor '", name, "' in any shard");
  const auto& f = files_[it->second.file];
  return f->tensor(f->tensors()[it->second.index]);
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) DI_THROW(CheckpointError, dir_, ": no tensor '", name, "' in any shard");
  return files_[it->second.file]->file_name();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t s = 0;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) s += t.end - t.begin;
  return s;
}

}  // namespace deepinfer::io
