// Safetensors files and checkpoint folders, memory-mapped.
//
// A SafetensorsFile maps one shard read-only and validates its header once at open time:
// header length vs file size, known dtypes, shape x dtype size == byte range, ranges inside
// the data section and non-overlapping. Tensors are zero-copy views whose Storage owns the
// mapping, so a view stays valid after the file and Checkpoint objects are gone.
// A Checkpoint is a folder: model.safetensors.index.json -> shards, else model.safetensors,
// else every *.safetensors in it. All errors are CheckpointError naming the file (and tensor).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace deepinfer::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::string st_dtype;      // dtype string as stored ("F8_E4M3", "I8", ...)
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range relative to the data section
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws CheckpointError naming the file (and tensor).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  std::string file_name() const;                           // basename, for messages
  uint64_t file_size() const { return file_size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;   // nullptr if absent
  // Zero-copy view in the stored dtype; throws CheckpointError if absent.
  Tensor tensor(const std::string& name) const;
  Tensor tensor(const TensorInfo& info) const;

 private:
  std::string path_;
  uint64_t file_size_ = 0, data_start_ = 0;
  std::shared_ptr<Storage> mapping_;   // whole file, munmapped when the last view dies
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  void parse_header(const char* json, size_t len);
};

class Checkpoint {
 public:
  // Opens a folder (or a single .safetensors file). `progress`: log one line per shard.
  static Checkpoint open(const std::string& path, bool progress = false);

  const std::string& dir() const { return dir_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;   // throws CheckpointError if absent
  Tensor get(const std::string& name) const;               // zero-copy view, keeps the shard mapped
  std::string file_of(const std::string& name) const;      // shard file name holding `name`
  std::vector<std::string> names() const;                  // sorted
  size_t num_tensors() const { return where_.size(); }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;                            // sum of tensor byte ranges

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  struct Loc { uint32_t file; uint32_t index; };
  std::unordered_map<std::string, Loc> where_;
  void add_file(std::shared_ptr<SafetensorsFile> f);
  void check_index(const std::string& index_path, const std::map<std::string, std::string>& weight_map) const;
};

// Builds a .safetensors file in memory and writes it. Tensors are copied at add() time.
class SafetensorsWriter {
 public:
  void add(const std::string& name, const Tensor& t);  // host tensor, any dtype (made contiguous)
  // Raw bytes with an explicit stored dtype string (e.g. "I8" for packed fp4, "F8_E8M0").
  void add_raw(const std::string& name, const std::string& st_dtype, const Shape& shape, const void* data,
               size_t nbytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  size_t data_bytes() const { return data_.size(); }
  std::vector<std::string> names() const;
  void write(const std::string& path) const;  // throws CheckpointError on I/O failure

 private:
  struct Entry { std::string name, st_dtype; Shape shape; uint64_t begin, end; };
  std::vector<Entry> entries_;
  std::vector<char> data_;
  std::map<std::string, std::string> metadata_;
};

// Writes model.safetensors.index.json for `weight_map` (tensor -> shard file name).
void write_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                 uint64_t total_size);

}  // namespace deepinfer::io
