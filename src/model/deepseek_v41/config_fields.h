// Typed, key-naming access to one JSON object of a config.json, with an accounting of the keys
// read: `refuse_unread` turns every key nobody read (and nobody listed as known-but-unused) into a
// ConfigError, so a key a later checkpoint revision adds is refused by name instead of ignored.
// Messages read "<file>: key 'text_config.sliding_window': must be > 0, got 0".
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace deepinfer::model::v41::config_detail {

class Fields {
 public:
  // `prefix` names the object inside the file ("" at top level, "text_config." below it).
  Fields(const nlohmann::json& j, std::string origin, std::string prefix);

  const std::string& origin() const { return origin_; }
  std::string key(const std::string& k) const { return prefix_ + k; }
  bool has(const char* k) const;  // present and not null (marks it read)
  const nlohmann::json& raw(const char* k) const;  // throws when missing (marks it read)
  [[noreturn]] void fail(const std::string& key_in_object, const std::string& why) const;

  int64_t get_int(const char* k) const;
  int64_t get_int(const char* k, int64_t dflt) const;
  double get_double(const char* k, double dflt) const;
  bool get_bool(const char* k, bool dflt) const;
  std::string get_string(const char* k, const std::string& dflt) const;
  std::vector<int64_t> get_int_list(const char* k) const;  // a JSON array of integers
  const nlohmann::json& get_object(const char* k) const;

  // Conversions for values nested deeper (`where` is the key path inside this object).
  int64_t as_int(const nlohmann::json& v, const std::string& where) const;
  double as_double(const nlohmann::json& v, const std::string& where) const;

  // Throws for the first key neither read nor in `known_unused` (documented as ignored).
  void refuse_unread(std::initializer_list<const char*> known_unused) const;
  void mark_read(const char* k) const { read_.insert(k); }

 private:
  const nlohmann::json& j_;
  std::string origin_, prefix_;
  mutable std::set<std::string> read_;
};

}  // namespace deepinfer::model::v41::config_detail
