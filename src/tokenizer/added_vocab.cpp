#include "tokenizer/added_vocab.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/utf8.h"

namespace deepinfer::tok {

int32_t AddedMatcher::child(int32_t node, unsigned char c) const {
  const auto& kids = nodes_[node].kids;
  auto it = std::lower_bound(kids.begin(), kids.end(), c, [](const auto& kv, unsigned char x) { return kv.first < x; });
  return (it != kids.end() && it->first == c) ? it->second : -1;
}

void AddedMatcher::build(const std::vector<const AddedToken*>& tokens) {
  tokens_ = tokens;
  nodes_.assign(1, Node{});
  std::memset(first_byte_, 0, sizeof(first_byte_));
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& s = tokens_[t]->content;
    if (s.empty()) continue;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    int32_t n = 0;
    for (unsigned char c : s) {
      int32_t k = child(n, c);
      if (k < 0) {
        k = int32_t(nodes_.size());
        nodes_.push_back(Node{});
        auto& kids = nodes_[n].kids;
        auto it = std::lower_bound(kids.begin(), kids.end(), c, [](const auto& kv, unsigned char x) { return kv.first < x; });
        kids.insert(it, {c, k});
      }
      n = k;
    }
    if (nodes_[n].token < 0) nodes_[n].token = int32_t(t);  // first registration wins on duplicates
  }
}

namespace {
bool is_word_cp(uint32_t cp) {
  // Approximates Rust's char::is_alphanumeric for the single_word check.
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  return !is_unicode_whitespace(cp) && cp != 0x3000;
}
uint32_t last_cp(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  size_t j = i;
  return next_cp(s, j);
}
}  // namespace

void AddedMatcher::find_all(std::string_view text, std::vector<Hit>& out) const {
  if (tokens_.empty()) return;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  uint32_t start_offset = 0;  // end of the previous hit
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[p[i]]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    int32_t n = 0, best = -1;
    size_t best_end = 0;
    for (size_t k = i; k < text.size(); ++k) {
      n = child(n, p[k]);
      if (n < 0) break;
      if (nodes_[n].token >= 0) best = nodes_[n].token, best_end = k + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = *tokens_[best];
    size_t b = i, e = best_end;
    if (t.single_word) {
      bool left_ok = b == 0 || !is_word_cp(last_cp(text.substr(0, b)));
      size_t j = e;
      bool right_ok = e == text.size() || !is_word_cp(next_cp(text, j));
      if (!left_ok || !right_ok) {
        i = best_end;  // the automaton consumed this match; resume after it
        continue;
      }
    }
    if (t.lstrip) {
      while (b > start_offset) {
        size_t k = b;
        while (k > 0 && (p[k - 1] & 0xC0) == 0x80) --k;
        --k;
        size_t j = k;
        if (!is_unicode_whitespace(next_cp(text, j))) break;
        b = k;
      }
    }
    if (t.rstrip) {
      while (e < text.size()) {
        size_t j = e;
        if (!is_unicode_whitespace(next_cp(text, j))) break;
        e = j;
      }
    }
    out.push_back({uint32_t(b), uint32_t(e), t.id});
    start_offset = uint32_t(e);
    i = e;
  }
}

}  // namespace deepinfer::tok
