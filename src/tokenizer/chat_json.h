// JSON text exactly as Python's json.dumps(v, ensure_ascii=False) writes it (", " and ": "
// separators, key order kept): the chat encoders render tool schemas and non-string tool
// arguments that way. Values come from parse_json_bounded, so the recursion is depth-bounded.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace deepinfer::chat {

inline void py_dump(const nlohmann::ordered_json& v, std::string& out) {
  using ojson = nlohmann::ordered_json;
  switch (v.type()) {
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        py_dump(ojson(it.key()), out);
        out += ": ";
        py_dump(it.value(), out);
      }
      out += '}';
      return;
    }
    case ojson::value_t::array:
      out += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        py_dump(v[i], out);
      }
      out += ']';
      return;
    case ojson::value_t::string:
      out += '"';
      for (unsigned char c : v.get_ref<const std::string&>()) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (c < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof(buf), "\\u%04x", c);
              out += buf;
            } else {
              out += char(c);
            }
        }
      }
      out += '"';
      return;
    default:
      out += v.dump();  // numbers, booleans, null
  }
}

inline std::string py_json(const nlohmann::ordered_json& v) {
  std::string s;
  py_dump(v, s);
  return s;
}

}  // namespace deepinfer::chat
