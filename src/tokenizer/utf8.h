// UTF-8 helpers shared by the tokenizer: validation, lossy decoding that matches Rust's
// String::from_utf8_lossy (what HF tokenizers' decoders use), and the GPT-2 byte-level alphabet.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tok {

// Byte offset of the first invalid UTF-8 sequence in `s`, or npos when valid.
size_t find_invalid_utf8(std::string_view s);

// Length of the valid UTF-8 sequence starting at s[0] (1..4), or 0 when s[0..] is not the start
// of a valid sequence. `incomplete` is set when the bytes are a valid but truncated prefix.
int utf8_seq_len(std::string_view s, bool* incomplete);

// Appends `bytes` to `out`, replacing each maximal invalid subpart by U+FFFD (Rust/WHATWG rule).
void append_lossy(std::string& out, std::string_view bytes);

void append_utf8(std::string& out, uint32_t cp);

// Decodes one code point at s[i] of valid UTF-8; advances i.
uint32_t next_cp(std::string_view s, size_t& i);

// GPT-2 byte <-> unicode alphabet: printable bytes map to themselves, the rest to U+0100+n.
struct ByteAlphabet {
  std::array<uint32_t, 256> byte_to_cp;
  std::array<int16_t, 324> cp_to_byte;  // inverse; -1 outside the alphabet (max cp is U+0143)
  ByteAlphabet();
  // Decodes a byte-level token string to raw bytes; false when a char is outside the alphabet.
  bool decode(std::string_view token, std::string& out) const;
  std::string encode(std::string_view bytes) const;
  static const ByteAlphabet& get();
};

bool is_unicode_whitespace(uint32_t cp);  // Rust char::is_whitespace (White_Space property)

}  // namespace deepinfer::tok
