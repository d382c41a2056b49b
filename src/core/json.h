// JSON from untrusted files and requests, without recursion that input depth can drive.
//
// nlohmann::json parses iteratively, but copying, comparing and dump() recurse once per level,
// so a 100,000-deep value parsed fine and then overflowed the stack when an error message
// printed it. Everything that reads a file or a request goes through here instead:
//  - parse_json_bounded: a byte pre-scan rejects nesting deeper than `max_depth` (naming the
//    limit and the byte offset) before nlohmann sees the text; then the parse itself. Errors
//    are valid UTF-8 (nlohmann quotes raw input bytes in its messages; those are escaped).
//  - json_snippet: an iterative, length-capped rendering of a value for error messages.
// Every value that passed parse_json_bounded is at most max_depth deep, so the recursive
// nlohmann operations on it (copy, ==, dump) are bounded too.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/check.h"
#include "core/strings.h"

namespace deepinfer {

// Deep enough for any real config.json, tokenizer.json, safetensors header or JSON schema
// (they nest < 30 levels), shallow enough that recursive JSON code uses < 1 MiB of stack.
inline constexpr int kMaxJsonDepth = 256;

// Byte offset of the bracket that first nests deeper than `max_depth` arrays/objects (brackets
// inside strings do not count), or npos. Exact for valid JSON; for invalid JSON the parse
// fails anyway.
size_t json_depth_exceeded_at(std::string_view text, int max_depth);

// Parses `text` into `out`. On failure returns false and sets `*error` (valid UTF-8) to the
// reason: "nested deeper than 256 levels (at byte 1234)" or nlohmann's syntax message.
bool parse_json_bounded(std::string_view text, nlohmann::json& out, std::string* error,
                        int max_depth = kMaxJsonDepth);
bool parse_json_bounded(std::string_view text, nlohmann::ordered_json& out, std::string* error,
                        int max_depth = kMaxJsonDepth);

// True when `text` holds a number nlohmann cannot represent (|x| past double's range, e.g.
// 1e999; nlohmann's out_of_range 406), with `*description` naming the field's path and byte:
// "field 'json_schema.minimum': the number 1e999 (at byte 27) is outside the range of a
// double". parse_json_bounded already reports that text for such input. Call it on text that
// passed the depth check (the scan is iterative, but bounded input keeps its stack small).
bool json_number_out_of_range(std::string_view text, std::string* description);

// parse_json_bounded that throws ErrType (a deepinfer::Error) "<origin>: <what>: <reason>".
template <typename ErrType, typename Json = nlohmann::json>
Json parse_json_or_throw(std::string_view text, std::string_view origin, std::string_view what = "not valid JSON",
                         int max_depth = kMaxJsonDepth) {
  Json j;
  std::string why;
  if (!parse_json_bounded(text, j, &why, max_depth))
    throw ErrType(detail::str_cat(escape_invalid_utf8(origin), ": ", what, ": ", why));
  return j;
}

// Compact JSON text of `v` for messages: at most about `max_chars` characters (then "..."),
// containers deeper than `max_depth` shown as [...] / {...}; iterative, never throws, always
// valid UTF-8 (invalid bytes in strings become U+FFFD).
std::string json_snippet(const nlohmann::json& v, size_t max_chars = 160, int max_depth = 8);
std::string json_snippet(const nlohmann::ordered_json& v, size_t max_chars = 160, int max_depth = 8);

}  // namespace deepinfer
