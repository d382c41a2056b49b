#include "server/chat_parser.h"

#include <algorithm>
#include <cstdio>

namespace deepinfer::server {
namespace {
constexpr size_t kMaxTagBytes = 1024;  // a tag header (invoke / parameter name) longer than this is malformed

// Longest k < p.size() such that `buf` ends with the first k bytes of `p`.
size_t partial(std::string_view buf, std::string_view p) {
  if (p.empty()) return 0;
  for (size_t k = std::min(p.size() - 1, buf.size()); k > 0; --k)
    if (buf.substr(buf.size() - k) == p.substr(0, k)) return k;
  return 0;
}
bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
std::string_view rstrip(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}
size_t skip_ws(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}
bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
// `s` is a proper prefix of `p` (more text could complete it).
bool could_become(std::string_view s, std::string_view p) { return s.size() < p.size() && starts(p, s); }
}  // namespace

std::string json_escape(std::string_view text) {
  std::string o;
  o.reserve(text.size());
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += ch;
        }
    }
  }
  return o;
}

void ChatDelta::append(ChatDelta&& d) {
  reasoning += d.reasoning;
  content += d.content;
  for (ToolCallDelta& t : d.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == t.index) {
      ToolCallDelta& b = tool_calls.back();
      if (b.id.empty()) b.id = t.id;
      if (b.name.empty()) b.name = t.name;
      b.arguments += t.arguments;
    } else {
      tool_calls.push_back(std::move(t));
    }
  }
}

ChatOutputParser::ChatOutputParser(ChatParserOptions options)
    : o_(std::move(options)), state_(o_.thinking ? State::kReasoning : State::kContent) {
  const DsmlSyntax& s = o_.syntax;
  tag_open_ = "<" + s.marker + s.calls + ">";
  calls_close_ = "</" + s.marker + s.calls + ">";
  invoke_open_ = "<" + s.marker + s.invoke + " name=\"";
  invoke_close_ = "</" + s.marker + s.invoke + ">";
  param_open_ = "<" + s.marker + s.param + " name=\"";
  param_close_ = "</" + s.marker + s.param + ">";
  if (!o_.new_call_id) o_.new_call_id = [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

size_t ChatOutputParser::cut_eos() {
  if (!o_.eos_text.empty()) {
    const size_t p = buf_.find(o_.eos_text);
    if (p != std::string::npos) {
      buf_.resize(p);  // nothing follows the end of the sentence
      final_ = true;
    }
  }
  return buf_.size();
}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  ChatDelta d;
  if (state_ == State::kDone) return d;
  buf_.append(text);
  cut_eos();
  while (step(d)) {
  }
  if (final_) state_ = State::kDone;
  ChatDelta merged;  // one entry per call index and run
  merged.append(std::move(d));
  return merged;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta d;
  if (state_ == State::kDone) return d;
  final_ = true;
  while (step(d)) {
  }
  buf_.clear();
  state_ = State::kDone;
  ChatDelta merged;
  merged.append(std::move(d));
  return merged;
}

bool ChatOutputParser::step(ChatDelta& d) {
  switch (state_) {
    case State::kReasoning: return step_reasoning(d);
    case State::kContent: return step_content(d);
    case State::kCalls: return step_calls(d);
    case State::kInvoke: return step_invoke(d);
    case State::kValue: return step_value(d);
    case State::kDone: return false;
  }
  return false;
}

bool ChatOutputParser::step_reasoning(ChatDelta& d) {
  if (at_start_) {  // a reply that repeats the prompt's <think>
    if (!final_ && could_become(buf_, o_.think_start)) return false;
    if (starts(buf_, o_.think_start)) buf_.erase(0, o_.think_start.size());
    at_start_ = false;
  }
  const size_t p = buf_.find(o_.think_end);
  if (p != std::string::npos) {
    d.reasoning += buf_.substr(0, p);
    buf_.erase(0, p + o_.think_end.size());
    state_ = State::kContent;
    return true;
  }
  const size_t hold = final_ ? 0 : std::max(partial(buf_, o_.think_end), partial(buf_, o_.eos_text));
  d.reasoning += buf_.substr(0, buf_.size() - hold);
  buf_.erase(0, buf_.size() - hold);
  return false;
}

void ChatOutputParser::emit_content(ChatDelta& d, std::string_view text) { d.content += text; }

bool ChatOutputParser::step_content(ChatDelta& d) {
  const std::string& marker = o_.syntax.marker;
  // The earliest DSML marker or think tag: the start of a calls block, or markup to remove.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string* p : std::initializer_list<const std::string*>{&marker, &o_.think_end, &o_.think_start}) {
    const size_t q = buf_.find(*p);
    if (q < best) best = q, which = p;
  }
  if (which == &marker && o_.parse_tools && best > 0 && buf_[best - 1] == '<') {
    const size_t t = best - 1;
    const std::string_view rest = std::string_view(buf_).substr(t);
    if (starts(rest, tag_open_)) {
      emit_content(d, rstrip(std::string_view(buf_).substr(0, t)));  // the "\n\n" before the block
      buf_.erase(0, t + tag_open_.size());
      state_ = State::kCalls;
      return true;
    }
    if (could_become(rest, tag_open_)) {
      if (final_) {  // the reply ended inside the opening tag
        emit_content(d, rstrip(std::string_view(buf_).substr(0, t)));
        buf_.clear();
        return false;
      }
      size_t i = t;
      while (i > 0 && is_ws(buf_[i - 1])) --i;
      emit_content(d, std::string_view(buf_).substr(0, i));
      buf_.erase(0, i);
      return false;
    }
  }
  if (which) {  // markup outside a calls block: removed (with its "<" or "</")
    size_t t = best;
    if (which == &marker) {
      malformed_ = true;
      if (t >= 2 && buf_.compare(t - 2, 2, "</") == 0) t -= 2;
      else if (t >= 1 && buf_[t - 1] == '<') t -= 1;
    }
    emit_content(d, std::string_view(buf_).substr(0, t));
    buf_.erase(0, best + which->size());
    return true;
  }
  const size_t n = buf_.size();
  size_t hold = 0;
  if (!final_) {
    for (const std::string* p : std::initializer_list<const std::string*>{&marker, &o_.think_end, &o_.think_start, &o_.eos_text})
      hold = std::max(hold, partial(buf_, *p));
    if (o_.parse_tools) {  // a possible opening tag, and the whitespace before it
      size_t i = n - partial(buf_, tag_open_);
      while (i > 0 && is_ws(buf_[i - 1])) --i;
      hold = std::max(hold, n - i);
    }
  } else if (o_.parse_tools && partial(buf_, tag_open_) >= 2) {
    buf_.resize(rstrip(std::string_view(buf_).substr(0, n - partial(buf_, tag_open_))).size());
  }
  emit_content(d, std::string_view(buf_).substr(0, buf_.size() - std::min(hold, buf_.size())));
  buf_.erase(0, buf_.size() - std::min(hold, buf_.size()));
  return false;
}

void ChatOutputParser::fail() {
  malformed_ = true;
  state_ = State::kContent;  // the rest is content (its markup removed)
}

bool ChatOutputParser::step_calls(ChatDelta& d) {
  const size_t i = skip_ws(buf_);
  const std::string_view r = std::string_view(buf_).substr(i);
  if (r.empty()) {
    buf_.clear();
    return false;
  }
  if (starts(r, calls_close_)) {
    buf_.erase(0, i + calls_close_.size());
    state_ = State::kContent;
    return true;
  }
  if (starts(r, invoke_open_)) {
    const size_t e = r.find("\">", invoke_open_.size());
    std::string_view name = r.substr(invoke_open_.size(), e == std::string::npos ? r.npos : e - invoke_open_.size());
    // Cut before its `">`: a name so far may end with the quote that starts it.
    if (e == std::string::npos && !name.empty() && name.back() == '"') name.remove_suffix(1);
    if (name.find_first_of("\"<\n") != std::string_view::npos || name.size() > kMaxTagBytes) return fail(), true;
    if (e == std::string::npos) {
      if (final_) buf_.clear();  // cut off inside the tag
      return false;
    }
    ToolCallDelta t;
    t.index = num_calls_++;
    t.id = o_.new_call_id();
    t.name = std::string(name);
    d.tool_calls.push_back(std::move(t));
    args_open_ = false;
    buf_.erase(0, i + e + 2);
    state_ = State::kInvoke;
    return true;
  }
  if (could_become(r, calls_close_) || could_become(r, invoke_open_)) {
    if (final_) buf_.clear();
    return false;
  }
  fail();
  return true;
}

bool ChatOutputParser::step_invoke(ChatDelta& d) {
  const size_t i = skip_ws(buf_);
  const std::string_view r = std::string_view(buf_).substr(i);
  auto args = [&](std::string piece) {
    ToolCallDelta t;
    t.index = num_calls_ - 1;
    t.arguments = std::move(piece);
    d.tool_calls.push_back(std::move(t));
  };
  if (r.empty()) {
    buf_.clear();
    return false;
  }
  if (starts(r, invoke_close_)) {
    args(args_open_ ? "}" : "{}");
    buf_.erase(0, i + invoke_close_.size());
    state_ = State::kCalls;
    return true;
  }
  if (starts(r, param_open_)) {
    const size_t q = r.find('"', param_open_.size());
    const std::string_view name = r.substr(param_open_.size(), q == std::string::npos ? r.npos : q - param_open_.size());
    if (name.find_first_of("<\n") != std::string_view::npos || name.size() > kMaxTagBytes) return fail(), true;
    if (q == std::string::npos) {
      if (final_) buf_.clear();
      return false;
    }
    static const std::string kTrue = "\" string=\"true\">", kFalse = "\" string=\"false\">";
    const std::string_view rest = r.substr(q);
    const bool is_true = starts(rest, kTrue), is_false = starts(rest, kFalse);
    if (!is_true && !is_false) {
      if (could_become(rest, kTrue) || could_become(rest, kFalse)) {
        if (final_) buf_.clear();
        return false;
      }
      return fail(), true;
    }
    args((args_open_ ? ", \"" : "{\"") + json_escape(name) + "\": " + (is_true ? "\"" : ""));
    args_open_ = true;
    value_is_string_ = is_true;
    buf_.erase(0, i + q + (is_true ? kTrue.size() : kFalse.size()));
    state_ = State::kValue;
    return true;
  }
  if (could_become(r, invoke_close_) || could_become(r, param_open_)) {
    if (final_) buf_.clear();
    return false;
  }
  fail();
  return true;
}

void ChatOutputParser::emit_value(ChatDelta& d, std::string_view text) {
  if (text.empty()) return;
  ToolCallDelta t;
  t.index = num_calls_ - 1;
  t.arguments = value_is_string_ ? json_escape(text) : std::string(text);
  d.tool_calls.push_back(std::move(t));
}

bool ChatOutputParser::step_value(ChatDelta& d) {
  const size_t p = buf_.find(param_close_);
  if (p != std::string::npos) {
    emit_value(d, std::string_view(buf_).substr(0, p));
    if (value_is_string_) {
      ToolCallDelta t;
      t.index = num_calls_ - 1;
      t.arguments = "\"";
      d.tool_calls.push_back(std::move(t));
    }
    buf_.erase(0, p + param_close_.size());
    state_ = State::kInvoke;
    return true;
  }
  const size_t hold = final_ ? 0 : std::max(partial(buf_, param_close_), partial(buf_, o_.eos_text));
  emit_value(d, std::string_view(buf_).substr(0, buf_.size() - hold));
  buf_.erase(0, buf_.size() - hold);
  return false;
}

}  // namespace deepinfer::server
