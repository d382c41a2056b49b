#include "tokenizer/utf8.h"

namespace deepinfer::tok {

int utf8_seq_len(std::string_view s, bool* incomplete) {
  *incomplete = false;
  if (s.empty()) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned c = p[0];
  if (c < 0x80) return 1;
  int need;
  unsigned lo = 0x80, hi = 0xBF;  // bounds of the second byte (excludes overlongs and surrogates)
  if (c >= 0xC2 && c <= 0xDF) need = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < need; ++k) {
    if (size_t(k) >= s.size()) {
      *incomplete = true;
      return 0;
    }
    unsigned b = p[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return need;
}

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    bool inc;
    int n = utf8_seq_len(s.substr(i), &inc);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Length of the maximal prefix of s (starting at a lead byte) that could begin a valid
// sequence; at least 1. Each such invalid subpart becomes one U+FFFD.
static size_t maximal_invalid_subpart(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned c = p[0];
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k < size_t(need) && k < s.size(); ++k) {
    unsigned b = p[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
  }
  return k;
}

void append_lossy(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = find_invalid_utf8(s.substr(i));
    if (bad == std::string_view::npos) {
      out.append(s.substr(i));
      return;
    }
    out.append(s.substr(i, bad));
    i += bad;
    i += maximal_invalid_subpart(s.substr(i));
    out.append("\xEF\xBF\xBD");
  }
}

uint32_t next_cp(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  uint32_t c = p[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c < 0xE0) {
    c = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
  } else if (c < 0xF0) {
    c = ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
  } else {
    c = ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
    i += 4;
  }
  return c;
}

ByteAlphabet::ByteAlphabet() {
  // Printable Latin-1 bytes keep their code point; the 68 others are numbered from U+0100
  // in byte order (the GPT-2 bytes_to_unicode table).
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    byte_to_cp[b] = printable ? uint32_t(b) : next++;
  }
  cp_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_to_cp[b]] = int16_t(b);
}

const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet a;
  return a;
}

bool ByteAlphabet::decode(std::string_view token, std::string& out) const {
  size_t i = 0;
  while (i < token.size()) {
    bool inc;
    if (utf8_seq_len(token.substr(i), &inc) == 0) return false;
    uint32_t cp = next_cp(token, i);
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    out.push_back(char(cp_to_byte[cp]));
  }
  return true;
}

std::string ByteAlphabet::encode(std::string_view bytes) const {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, byte_to_cp[b]);
  return out;
}

bool is_unicode_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace deepinfer::tok
