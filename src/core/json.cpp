#include "core/json.h"

#include <vector>

namespace deepinfer {

size_t json_depth_exceeded_at(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

namespace {
template <typename Json>
bool parse_impl(std::string_view text, Json& out, std::string* error, int max_depth) {
  const size_t at = json_depth_exceeded_at(text, max_depth);
  if (at != std::string_view::npos) {
    if (error) *error = detail::str_cat("nested deeper than ", max_depth, " levels (at byte ", at, ")");
    return false;
  }
  try {
    out = Json::parse(text.begin(), text.end());
    return true;
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the raw bytes it last read: they may be invalid UTF-8.
    if (error) *error = escape_invalid_utf8(e.what());
    return false;
  }
}

// Cuts `s` to at most `n` bytes on a UTF-8 character boundary.
void truncate_utf8(std::string& s, size_t n) {
  if (s.size() <= n) return;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
}

template <typename Json>
std::string snippet_impl(const Json& root, size_t max_chars, int max_depth) {
  constexpr auto kReplace = Json::error_handler_t::replace;
  struct Frame {
    const Json* v;
    typename Json::const_iterator it;
  };
  std::string out;
  std::vector<Frame> stack;
  // Writes a scalar or an empty/too-deep container, or opens a container (pushes a frame).
  auto visit = [&](const Json& v) {
    if (!v.is_structured()) {
      out += v.dump(-1, ' ', false, kReplace);  // a scalar: dump does not recurse
      return;
    }
    const bool obj = v.is_object();
    if (v.empty()) out += obj ? "{}" : "[]";
    else if (int(stack.size()) >= max_depth) out += obj ? "{...}" : "[...]";
    else {
      out += obj ? '{' : '[';
      stack.push_back({&v, v.cbegin()});
    }
  };
  visit(root);
  while (!stack.empty() && out.size() < max_chars) {
    Frame& f = stack.back();
    if (f.it == f.v->cend()) {
      out += f.v->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (f.it != f.v->cbegin()) out += ',';
    if (f.v->is_object()) out += Json(f.it.key()).dump(-1, ' ', false, kReplace) + ":";
    const Json& child = *f.it;
    ++f.it;  // before visit: pushing may move the frame
    visit(child);
  }
  if (out.size() > max_chars || !stack.empty()) {
    truncate_utf8(out, max_chars);
    out += "...";
  }
  return out;
}
}  // namespace

bool parse_json_bounded(std::string_view text, nlohmann::json& out, std::string* error, int max_depth) {
  return parse_impl(text, out, error, max_depth);
}
bool parse_json_bounded(std::string_view text, nlohmann::ordered_json& out, std::string* error, int max_depth) {
  return parse_impl(text, out, error, max_depth);
}

std::string json_snippet(const nlohmann::json& v, size_t max_chars, int max_depth) {
  return snippet_impl(v, max_chars, max_depth);
}
std::string json_snippet(const nlohmann::ordered_json& v, size_t max_chars, int max_depth) {
  return snippet_impl(v, max_chars, max_depth);
}

}  // namespace deepinfer
