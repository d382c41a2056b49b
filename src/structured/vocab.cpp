#include "structured/vocab.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "structured/compiled.h"

namespace deepinfer::structured {

std::optional<int32_t> TokenVocabulary::terminal_named(std::string_view text) const {
  for (const auto& [t, id] : terminal_texts_)
    if (t == text) return id;
  return std::nullopt;
}

bool TokenVocabulary::is_terminal(int32_t id) const {
  return std::binary_search(terminals_.begin(), terminals_.end(), id);
}

TokenVocabulary::TokenVocabulary(TokenizerInfo info) : info_(std::move(info)) {
  const int32_t n = vocab_size();
  kind_.assign(n, kNormal);
  for (int32_t i = 0; i < n; ++i)
    if (info_.token_bytes[i].empty()) kind_[i] = kNever;
  for (int32_t id : info_.special_ids) {
    if (id < 0 || id >= n) DI_THROW(InvalidArgument, "special token id ", id, " outside vocabulary of ", n);
    kind_[id] = kNever;
  }
  for (int32_t id : info_.stop_ids) {
    if (id < 0 || id >= n) DI_THROW(InvalidArgument, "stop token id ", id, " outside vocabulary of ", n);
    kind_[id] = kStop;
  }
  if (!info_.terminal_ids.empty()) {
    // 0xFF spells the terminals (grammar.h): a token holding it could spell one piece by piece.
    for (int32_t i = 0; i < n; ++i)
      if (kind_[i] == kNormal && info_.token_bytes[i].find('\xFF') != std::string::npos) kind_[i] = kNever;
    for (int32_t id : info_.terminal_ids) {
      if (id < 0 || id >= n || id > kMaxTerminalId)
        DI_THROW(InvalidArgument, "terminal token id ", id, " outside vocabulary of ", n);
      if (kind_[id] == kStop) DI_THROW(InvalidArgument, "terminal token id ", id, " is a stop token");
      kind_[id] = kNormal;
      if (!info_.token_bytes[id].empty()) terminal_texts_.emplace_back(info_.token_bytes[id], id);
      info_.token_bytes[id] = special_token_bytes(id);
    }
    terminals_ = info_.terminal_ids;
    std::sort(terminals_.begin(), terminals_.end());
    terminals_.erase(std::unique(terminals_.begin(), terminals_.end()), terminals_.end());
  }
  std::vector<int32_t> order;
  grammar_bits_.assign((n + 31) / 32, 0);
  for (int32_t i = 0; i < n; ++i)
    if (kind_[i] == kNormal) {
      order.push_back(i);
      grammar_bits_[i >> 5] |= 1u << (i & 31);
    }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return info_.token_bytes[a] < info_.token_bytes[b]; });
  node_of_.assign(n, -1);
  rank_.assign(n, -1);
  for (size_t i = 0; i < order.size(); ++i) rank_[order[i]] = static_cast<int32_t>(i);
  lcp_prev_.assign(order.size(), 0);
  for (size_t i = 1; i < order.size(); ++i) {
    const std::string& a = info_.token_bytes[order[i - 1]];
    const std::string& b = info_.token_bytes[order[i]];
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    lcp_prev_[i] = static_cast<int32_t>(l);
  }
  // Build the preorder trie from the sorted strings: keep the path of open nodes, close
  // (set end_) the ones not shared with the next string.
  byte_.push_back(0);
  depth_.push_back(0);
  end_.push_back(0);
  std::vector<int32_t> path{0};
  std::vector<std::pair<int32_t, int32_t>> node_tok;  // (node, token), node-ordered
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = info_.token_bytes[id];
    size_t l = 0;
    if (prev) while (l < prev->size() && l < s.size() && (*prev)[l] == s[l]) ++l;
    while (path.size() > l + 1) {
      end_[path.back()] = static_cast<int32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t k = l; k < s.size(); ++k) {
      byte_.push_back(static_cast<uint8_t>(s[k]));
      depth_.push_back(static_cast<int32_t>(k + 1));
      end_.push_back(0);
      path.push_back(static_cast<int32_t>(byte_.size() - 1));
    }
    node_of_[id] = path.back();
    node_tok.push_back({path.back(), id});
    prev = &s;
  }
  while (!path.empty()) {
    end_[path.back()] = static_cast<int32_t>(byte_.size());
    path.pop_back();
  }
  for (int32_t d : depth_) max_depth_ = std::max(max_depth_, d);
  // below_bytes_: children are later in preorder, so a reverse pass folds each node into its
  // parent (found through the open path per depth on a forward pass).
  std::vector<int32_t> parent(byte_.size(), -1), at_depth(static_cast<size_t>(max_depth_) + 1, 0);
  for (size_t i = 1; i < byte_.size(); ++i) {
    parent[i] = at_depth[depth_[i] - 1];
    at_depth[depth_[i]] = static_cast<int32_t>(i);
  }
  below_bytes_.assign(byte_.size(), {0, 0, 0, 0});
  utf8_below_.assign(byte_.size(), 0xFF);
  height_.assign(byte_.size(), 0);
  parent_ = parent;
  for (size_t i = byte_.size() - 1; i >= 1; --i) {
    height_[parent[i]] = std::max(height_[parent[i]], height_[i] + 1);
    auto& up = below_bytes_[parent[i]];
    for (int w = 0; w < 4; ++w) up[w] |= below_bytes_[i][w];
    up[byte_[i] >> 6] |= 1ull << (byte_[i] & 63);
    for (int s = 0; s < 8; ++s) {  // the edge into i, then everything below i
      const int t = utf8_step(s, byte_[i]);
      if (t < 0 || !(utf8_below_[i] >> t & 1)) utf8_below_[parent[i]] &= static_cast<uint8_t>(~(1u << s));
    }
  }
  after_byte_.fill(-1);
  for (size_t i = 1; i < byte_.size(); ++i) after_byte_[byte_[i]] = std::max(after_byte_[byte_[i]], height_[i]);
  // Text runs, right to left so a node's next sibling (end_[i] at the same depth) is done.
  const size_t nn = byte_.size();
  text_run_end_.assign(nn, 0);
  text_run_height_.assign(nn, 0);
  for (size_t i = nn - 1; i >= 1; --i) {
    const uint8_t b = byte_[i];
    const int s = b < 0x80 ? ((kJsonText[b >> 6] >> (b & 63) & 1) ? 0 : -1) : utf8_step(0, b);
    const auto& bb = below_bytes_[i];
    const bool text = s >= 0 && !(bb[0] & ~kJsonText[0]) && !(bb[1] & ~kJsonText[1]) && (utf8_below_[i] >> s & 1);
    text_run_end_[i] = static_cast<int32_t>(i);
    if (!text) continue;
    const size_t k = static_cast<size_t>(end_[i]);
    text_run_end_[i] = end_[i];
    text_run_height_[i] = height_[i] + 1;
    if (k < nn && depth_[k] == depth_[i] && text_run_end_[k] > static_cast<int32_t>(k)) {
      text_run_end_[i] = text_run_end_[k];
      text_run_height_[i] = std::max(text_run_height_[i], text_run_height_[k]);
    }
  }
  tok_begin_.assign(byte_.size() + 1, 0);
  for (auto [node, id] : node_tok) ++tok_begin_[node + 1];
  std::partial_sum(tok_begin_.begin(), tok_begin_.end(), tok_begin_.begin());
  tok_ids_.resize(node_tok.size());
  for (size_t i = 0; i < node_tok.size(); ++i) tok_ids_[i] = node_tok[i].second;  // already node-ordered
  // All-text tokens by character count (cumulative bit sets over ranks).
  const int32_t max_le = std::min(kMaxTextLe, max_depth_);
  const size_t words = (tok_ids_.size() + 63) / 64;
  text_le_.assign(static_cast<size_t>(max_le) + 1, std::vector<uint64_t>(words, 0));
  for (size_t k = 0; k < tok_ids_.size(); ++k) {
    int32_t chars = 0;
    int s = 0;
    for (char ch : info_.token_bytes[tok_ids_[k]]) {
      const uint8_t b = static_cast<uint8_t>(ch);
      if (s == 0) {
        ++chars;
        if (b < 0x80 && !(kJsonText[b >> 6] >> (b & 63) & 1)) s = -1;
      }
      if (s >= 0) s = utf8_step(s, b);
      if (s < 0 || chars > max_le) break;
    }
    if (s >= 0 && chars >= 1 && chars <= max_le) text_le_[chars][k >> 6] |= 1ull << (k & 63);
  }
  for (int32_t l = 1; l <= max_le; ++l)
    for (size_t w = 0; w < words; ++w) text_le_[l][w] |= text_le_[l - 1][w];
  text_le_ids_.assign((info_.token_bytes.size() + 31) / 32, 0);
  for (size_t k = 0; k < tok_ids_.size(); ++k)
    if (text_le_[max_le][k >> 6] >> (k & 63) & 1) text_le_ids_[tok_ids_[k] >> 5] |= 1u << (tok_ids_[k] & 31);
}

int32_t TokenVocabulary::key_id(const std::string& key) const {
  std::lock_guard<std::mutex> lock(key_mu_);
  auto it = key_ids_.find(key);
  if (it != key_ids_.end()) return it->second;
  if (key_ids_.size() >= kMaxKeyIds) return -1;
  const int32_t id = static_cast<int32_t>(key_ids_.size());
  key_ids_.emplace(key, id);
  return id;
}

std::shared_ptr<const TokenVocabulary> make_vocabulary(TokenizerInfo info) {
  auto v = std::make_shared<const TokenVocabulary>(std::move(info));
  precompute_common_masks(v);
  return v;
}

int32_t vocabulary_size(const TokenVocabulary& v) { return v.vocab_size(); }

std::optional<std::vector<int32_t>> greedy_tokenize(const TokenVocabulary& v, std::string_view text) {
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t node = 0, best_tok = -1;
    size_t best_len = 0;
    for (size_t k = pos; k < text.size(); ++k) {
      int32_t child = -1;
      for (int32_t j = node + 1; j < v.end_[node]; j = v.end_[j])
        if (v.byte_[j] == static_cast<uint8_t>(text[k])) { child = j; break; }
      if (child < 0) break;
      node = child;
      if (v.tok_begin_[node + 1] > v.tok_begin_[node]) {
        best_tok = v.tok_ids_[v.tok_begin_[node]];
        best_len = k + 1 - pos;
      }
    }
    if (best_tok < 0) return std::nullopt;
    out.push_back(best_tok);
    pos += best_len;
  }
  return out;
}

TokenizerInfo byte_level_tokenizer_info() {
  TokenizerInfo info;
  for (int b = 0; b < 256; ++b) info.token_bytes.push_back(std::string(1, static_cast<char>(b)));
  info.token_bytes.push_back("<eos>");
  info.stop_ids = {256};
  return info;
}

}  // namespace deepinfer::structured
