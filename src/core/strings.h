// String helpers for messages that cross the API boundary. Python (nanobind) turns every
// std::string into a str and fails on invalid UTF-8, so a message quoting a user's bytes
// (a corrupt header, a grammar with a stray byte) must be made valid first.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace deepinfer {

// Offset of the first byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates and code points past U+10FFFF are invalid), or npos.
size_t first_invalid_utf8(std::string_view s);

// `s` with every byte of an invalid UTF-8 sequence written as \xNN (valid text unchanged).
std::string escape_invalid_utf8(std::string_view s);

}  // namespace deepinfer
