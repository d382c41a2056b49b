// engram_sidecar.json -> EngramSidecar, every key checked (engram.h).
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "model/deepseek_v41/engram.h"

namespace deepinfer::model::v41 {
using json = nlohmann::json;

namespace {
constexpr int64_t kMaxIds = int64_t(1) << 22;  // tokenizer ids are < 2^22 (tokenizer/load.cpp)

int64_t int_at(const json& j, const char* k, const std::string& origin) {
  if (!j.contains(k)) DI_THROW(CheckpointError, origin, ": missing key '", k, "'");
  const json& v = j[k];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    DI_THROW(CheckpointError, origin, ": key '", k, "': expected an integer, got ", json_snippet(v));
  return v.get<int64_t>();
}
std::string str_at(const json& j, const char* k, const std::string& origin) {
  if (!j.contains(k) || j[k].is_null()) return "";
  if (!j[k].is_string()) DI_THROW(CheckpointError, origin, ": key '", k, "': expected a string");
  return j[k].get<std::string>();
}
}  // namespace

EngramSidecar EngramSidecar::from_json_string(const std::string& text, const std::string& origin) {
  const json j = parse_json_or_throw<CheckpointError>(text, origin);
  if (!j.is_object()) DI_THROW(CheckpointError, origin, ": not a JSON object");
  if (str_at(j, "format", origin) != "deepinfer.engram_sidecar" || int_at(j, "version", origin) != 1)
    DI_THROW(CheckpointError, origin, ": not a deepinfer.engram_sidecar version 1 file");
  EngramSidecar s;
  s.path = origin;
  s.source = str_at(j, "source", origin);
  s.tokenizer_sha256 = str_at(j, "tokenizer_sha256", origin);
  s.num_ids = int_at(j, "num_ids", origin);
  s.num_classes = int_at(j, "num_classes", origin);
  s.max_ngram_size = int_at(j, "max_ngram_size", origin);
  if (s.num_ids < 1 || s.num_ids > kMaxIds)
    DI_THROW(CheckpointError, origin, ": num_ids ", s.num_ids, " outside [1, 2^22]");
  const json& c = j.contains("classes") ? j["classes"] : json();
  if (!c.is_array() || int64_t(c.size()) != s.num_ids)
    DI_THROW(CheckpointError, origin, ": key 'classes': expected a list of num_ids = ", s.num_ids, " integers");
  s.classes.reserve(c.size());
  int32_t next = 0;  // classes are numbered by first appearance
  for (size_t i = 0; i < c.size(); ++i) {
    if (!c[i].is_number_integer() || c[i].get<int64_t>() < 0 || c[i].get<int64_t>() > next)
      DI_THROW(CheckpointError, origin, ": classes[", i, "] = ", json_snippet(c[i]), ": classes must be numbered by "
               "first appearance (0, then at most one more than the largest so far)");
    const int32_t v = int32_t(c[i].get<int64_t>());
    if (v == next) ++next;
    s.classes.push_back(v);
  }
  if (next != s.num_classes)
    DI_THROW(CheckpointError, origin, ": num_classes ", s.num_classes, " but the class map has ", next, " classes");
  const json& m = j.contains("multipliers") ? j["multipliers"] : json();
  if (!m.is_array()) DI_THROW(CheckpointError, origin, ": key 'multipliers': expected a list");
  for (size_t l = 0; l < m.size(); ++l) {
    const std::string where = origin + ": multipliers[" + std::to_string(l) + "]";
    if (!m[l].is_object()) DI_THROW(CheckpointError, where, ": expected {layer, values}");
    const int64_t layer = int_at(m[l], "layer", where);
    const json& v = m[l].contains("values") ? m[l]["values"] : json();
    if (!v.is_array() || int64_t(v.size()) != s.max_ngram_size)
      DI_THROW(CheckpointError, where, ": 'values' must list max_ngram_size = ", s.max_ngram_size, " integers");
    std::vector<int64_t> vals;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() || (v[i].is_number_unsigned() && v[i].get<uint64_t>() > uint64_t(INT64_MAX)))
        DI_THROW(CheckpointError, where, ": values[", i, "] is not an int64");
      vals.push_back(v[i].get<int64_t>());
    }
    s.multipliers.emplace_back(layer, std::move(vals));
  }
  return s;
}

EngramSidecar EngramSidecar::from_file(const std::string& path) {
  return from_json_string(read_regular_file_or_throw<CheckpointError>(path), path);
}

}  // namespace deepinfer::model::v41
