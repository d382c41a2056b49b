#include "model/deepseek_v41/config_fields.h"

#include <cmath>

#include "core/check.h"
#include "core/json.h"

namespace deepinfer::model::v41::config_detail {
using json = nlohmann::json;

Fields::Fields(const json& j, std::string origin, std::string prefix)
    : j_(j), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

bool Fields::has(const char* k) const {
  read_.insert(k);
  return j_.contains(k) && !j_[k].is_null();
}

const json& Fields::raw(const char* k) const {
  read_.insert(k);
  if (!j_.contains(k)) DI_THROW(ConfigError, origin_, ": missing required key '", key(k), "'");
  return j_[k];
}

void Fields::fail(const std::string& k, const std::string& why) const {
  DI_THROW(ConfigError, origin_, ": key '", key(k), "': ", why);
}

int64_t Fields::as_int(const json& v, const std::string& where) const {
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    fail(where, "integer " + json_snippet(v) + " is out of range");
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some writers emit 4.0 for an integer; only exactly integral floats are taken.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18) return int64_t(d);
  }
  fail(where, "expected an integer, got " + json_snippet(v));
}

double Fields::as_double(const json& v, const std::string& where) const {
  if (!v.is_number()) fail(where, "expected a number, got " + json_snippet(v));
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(where, "expected a finite number, got " + json_snippet(v));
  return d;
}

int64_t Fields::get_int(const char* k) const {
  if (!has(k)) DI_THROW(ConfigError, origin_, ": missing required key '", key(k), "'");
  return as_int(j_[k], k);
}

int64_t Fields::get_int(const char* k, int64_t dflt) const { return has(k) ? as_int(j_[k], k) : dflt; }

double Fields::get_double(const char* k, double dflt) const { return has(k) ? as_double(j_[k], k) : dflt; }

bool Fields::get_bool(const char* k, bool dflt) const {
  if (!has(k)) return dflt;
  if (!j_[k].is_boolean()) fail(k, "expected true or false, got " + json_snippet(j_[k]));
  return j_[k].get<bool>();
}

std::string Fields::get_string(const char* k, const std::string& dflt) const {
  if (!has(k)) return dflt;
  if (!j_[k].is_string()) fail(k, "expected a string, got " + json_snippet(j_[k]));
  return j_[k].get<std::string>();
}

std::vector<int64_t> Fields::get_int_list(const char* k) const {
  const json& v = raw(k);
  if (!v.is_array()) fail(k, "expected a list of integers, got " + json_snippet(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_int(v[i], detail::str_cat(k, "[", i, "]")));
  return out;
}

const json& Fields::get_object(const char* k) const {
  const json& v = raw(k);
  if (!v.is_object()) fail(k, "expected an object, got " + json_snippet(v));
  return v;
}

void Fields::refuse_unread(std::initializer_list<const char*> known_unused) const {
  std::set<std::string> ok(read_);
  for (const char* k : known_unused) ok.insert(k);
  for (auto it = j_.begin(); it != j_.end(); ++it)
    if (!ok.count(it.key()))
      DI_THROW(ConfigError, origin_, ": unknown key '", escape_invalid_utf8(key(it.key())),
               "' (not part of the DeepSeek-V4.1 config this engine implements; a newer checkpoint revision?)");
}

}  // namespace deepinfer::model::v41::config_detail
