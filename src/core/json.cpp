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
// SAX handler that keeps the path of the value being read ("a.b[2]") and stops at the first
// number nlohmann cannot hold (its parse_error 406), recording where.
class OverflowLocator final : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool found = false;
  size_t byte = 0;
  std::string path, token;

  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t) override { return scalar(); }
  bool number_unsigned(number_unsigned_t) override { return scalar(); }
  bool number_float(number_float_t, const string_t&) override { return scalar(); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool key(string_t& k) override {
    frames_.back().key = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& e) override {
    if (e.id == 406) {
      found = true;
      byte = position > last_token.size() ? position - last_token.size() : 0;
      token = last_token;
      path = render_path();
    }
    return false;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    size_t index = 0;  // arrays: elements completed so far
  };
  bool scalar() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool open(bool array) {
    frames_.push_back({array, {}, 0});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return scalar();
  }
  std::string render_path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.array) out += "[" + std::to_string(f.index) + "]";
      else out += (out.empty() ? "" : ".") + f.key;
    }
    return out;
  }
  std::vector<Frame> frames_;
};

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
    // nlohmann quotes the raw bytes it last read: they may be invalid UTF-8. A number past
    // double's range (406) gets the field's path instead of nlohmann's bare message.
    std::string where;
    if (error) *error = e.id == 406 && json_number_out_of_range(text, &where) ? where : escape_invalid_utf8(e.what());
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

bool json_number_out_of_range(std::string_view text, std::string* description) {
  OverflowLocator loc;
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &loc);
  } catch (const nlohmann::json::exception&) {
    return false;  // not the overflow (sax_parse reports errors through the handler)
  }
  if (!loc.found) return false;
  if (description) {
    std::string token = loc.token.size() > 40 ? loc.token.substr(0, 40) + "..." : loc.token;
    *description = detail::str_cat("field '", loc.path.empty() ? std::string("(top level)") : loc.path, "': the number ",
                                   token, " (at byte ", loc.byte, ") is outside the range of a double");
    *description = escape_invalid_utf8(*description);
  }
  return true;
}

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
