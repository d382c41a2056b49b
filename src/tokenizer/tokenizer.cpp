// Tokenizer: loading entry points, encode (added tokens -> normalizer -> pre-tokenizer -> BPE
// with a per-thread word cache), decode, vocabulary access.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace fs = std::filesystem;
using tok::Piece;

// ---- Impl ----

void Tokenizer::Impl::set_token(int32_t id, const std::string& t, const std::string& raw, uint8_t fl) {
  if (id >= vocab_size()) {
    tokens.resize(id + 1);
    bytes.resize(id + 1);
    flags.resize(id + 1, 0);
  }
  tokens[id] = t;
  bytes[id] = raw;
  flags[id] |= fl;
  token_to_id[t] = id;
}

void Tokenizer::Impl::finalize() {
  std::vector<const tok::AddedToken*> raw, norm;
  for (const tok::AddedToken& a : added) {
    set_token(a.id, a.content, a.content, kPresent | kAdded | (a.special ? kSpecial : 0));
    (a.normalized && !normalizer.empty() ? norm : raw).push_back(&a);
  }
  raw_matcher.build(raw);
  norm_matcher.build(norm);
}

namespace {
struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
// Per-thread memo of word -> ids, for one tokenizer at a time (keyed by Impl::uid).
struct WordCache {
  static constexpr size_t kMaxWords = 1 << 17;
  static constexpr size_t kMaxWordBytes = 48;
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, SvHash, std::equal_to<>> map;
  std::vector<int32_t> pool;  // ids of all cached words back to back
  void reset(uint64_t uid) {
    owner = uid;
    map.clear();
    pool.clear();
  }
};
thread_local WordCache t_cache;
}  // namespace

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  thread_local std::vector<Piece> pieces;
  thread_local std::vector<int32_t> scratch;
  thread_local std::string word;
  pieces.clear();
  pretok.run(text, pieces);
  WordCache& cache = t_cache;
  if (cache.owner != uid || cache.map.size() > WordCache::kMaxWords) cache.reset(uid);
  for (const Piece& p : pieces) {
    std::string_view w = text.substr(p.begin, p.end - p.begin);
    if (p.prefix_space) {
      word.assign(" ");
      word.append(w);
      w = word;
    }
    if (w.size() > WordCache::kMaxWordBytes) {
      bpe.encode_word(w, out, scratch);
      continue;
    }
    auto it = cache.map.find(w);
    if (it != cache.map.end()) {
      out.insert(out.end(), cache.pool.begin() + it->second.first,
                 cache.pool.begin() + it->second.first + it->second.second);
      continue;
    }
    size_t before = out.size();
    bpe.encode_word(w, out, scratch);
    uint32_t off = uint32_t(cache.pool.size());
    cache.pool.insert(cache.pool.end(), out.begin() + before, out.end());
    cache.map.emplace(std::string(w), std::make_pair(off, uint32_t(out.size() - before)));
  }
}

void Tokenizer::Impl::encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const {
  size_t bad = tok::find_invalid_utf8(text);
  if (bad != std::string_view::npos)
    DI_THROW(TokenizerError, "encode: text is not valid UTF-8 at byte offset ", bad, " (byte 0x", std::hex,
             int(static_cast<unsigned char>(text[bad])), ")");
  if (add_special_tokens) {
    if (add_bos && bos && (post_prefix.empty() || post_prefix[0] != *bos)) out.push_back(*bos);
    out.insert(out.end(), post_prefix.begin(), post_prefix.end());
  }
  thread_local std::vector<tok::AddedMatcher::Hit> hits_raw, hits_norm;
  hits_raw.clear();
  raw_matcher.find_all(text, hits_raw);
  // Text between raw hits is normalized, then searched for normalized added tokens.
  auto encode_gap = [&](std::string_view gap) {
    if (gap.empty()) return;
    if (normalizer.empty()) return encode_plain(gap, out);
    std::string norm = normalizer.run(gap);
    std::vector<tok::AddedMatcher::Hit> hits;
    norm_matcher.find_all(norm, hits);
    uint32_t prev = 0;
    std::string_view ns(norm);
    for (const auto& h : hits) {
      if (h.begin > prev) encode_plain(ns.substr(prev, h.begin - prev), out);
      out.push_back(h.id);
      prev = h.end;
    }
    if (prev < ns.size()) encode_plain(ns.substr(prev), out);
  };
  uint32_t prev = 0;
  for (size_t k = 0; k < hits_raw.size(); ++k) {
    auto h = hits_raw[k];  // copy: encode_gap may reuse thread-local buffers
    encode_gap(text.substr(prev, h.begin - prev));
    out.push_back(h.id);
    prev = h.end;
  }
  encode_gap(text.substr(prev));
  if (add_special_tokens) {
    out.insert(out.end(), post_suffix.begin(), post_suffix.end());
    if (add_eos && eos && (post_suffix.empty() || post_suffix.back() != *eos)) out.push_back(*eos);
  }
}

std::unique_ptr<Tokenizer::Impl> Tokenizer::Impl::clone() const {
  auto c = std::make_unique<Impl>();
  c->source = source;
  c->bpe = bpe;
  c->normalizer = normalizer.clone();
  c->pretok = pretok.clone();
  c->added = added;
  c->tokens = tokens;
  c->bytes = bytes;
  c->flags = flags;
  c->token_to_id = token_to_id;
  c->post_prefix = post_prefix;
  c->post_suffix = post_suffix;
  c->bos = bos;
  c->eos = eos;
  c->add_bos = add_bos;
  c->add_eos = add_eos;
  c->bos_text = bos_text;
  c->eos_text = eos_text;
  // Matchers point into `added`: rebuild them against the copy.
  std::vector<const tok::AddedToken*> raw, norm;
  for (const tok::AddedToken& a : c->added) (a.normalized && !c->normalizer.empty() ? norm : raw).push_back(&a);
  c->raw_matcher.build(raw);
  c->norm_matcher.build(norm);
  return c;
}

// ---- public API ----

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;
Tokenizer Tokenizer::clone() const { return Tokenizer(impl_->clone()); }

Tokenizer Tokenizer::from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe) {
  return Tokenizer(tok::load_gpt2(encoder_json, vocab_bpe));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "tokenizer.json")) return from_file((p / "tokenizer.json").string());
    if (fs::exists(p / "encoder.json")) return from_file((p / "encoder.json").string());
    DI_THROW(TokenizerError, path, ": folder holds neither tokenizer.json nor encoder.json");
  }
  if (!fs::exists(p, ec)) DI_THROW(TokenizerError, "tokenizer file not found: ", path);
  if (p.filename() == "encoder.json") {
    fs::path merges = p.parent_path() / "vocab.bpe";
    if (!fs::exists(merges)) DI_THROW(TokenizerError, path, ": vocab.bpe (the merges) not found beside it");
    return from_gpt2_files(path, merges.string());
  }
  auto impl = tok::load_tokenizer_json(path);
  fs::path cfg = p.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg)) tok::load_tokenizer_config(cfg.string(), *impl);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, out);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts, bool add_special_tokens,
                                                          int num_threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  int nt = num_threads > 0 ? num_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  nt = int(std::min<size_t>(size_t(nt), texts.size()));
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < texts.size();) {
      try {
        out[i] = encode(texts[i], add_special_tokens);
      } catch (...) {
        std::lock_guard<std::mutex> g(err_mu);
        if (!err) err = std::current_exception();
      }
    }
  };
  if (nt <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < nt; ++t) pool.emplace_back(work);
    for (auto& th : pool) th.join();
  }
  if (err) std::rethrow_exception(err);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out, pending;
  const Impl& m = *impl_;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= m.vocab_size() || !(m.flags[id] & Impl::kPresent))
      DI_THROW(InvalidArgument, "decode: id ", id, " at position ", i, " is not a token (vocab_size ", m.vocab_size(), ")");
    if (m.flags[id] & Impl::kAdded) {
      if (skip_special_tokens && (m.flags[id] & Impl::kSpecial)) continue;
      // HF decodes model tokens between added tokens as one chunk, then appends the added token as is.
      tok::append_lossy(out, pending);
      pending.clear();
      out += m.bytes[id];
    } else {
      pending += m.bytes[id];
    }
  }
  tok::append_lossy(out, pending);
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_to_id.find(std::string(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

static void check_id(const Tokenizer::Impl& m, int32_t id, const char* fn) {
  if (id < 0 || id >= m.vocab_size()) DI_THROW(InvalidArgument, fn, ": id ", id, " out of range [0, ", m.vocab_size(), ")");
}

std::string Tokenizer::id_to_token(int32_t id) const {
  check_id(*impl_, id, "id_to_token");
  return impl_->tokens[id];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  check_id(*impl_, id, "token_bytes");
  return impl_->bytes[id];
}

bool Tokenizer::is_special(int32_t id) const {
  check_id(*impl_, id, "is_special");
  return impl_->flags[id] & Impl::kSpecial;
}

std::vector<int32_t> Tokenizer::special_ids() const {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < impl_->vocab_size(); ++i)
    if (impl_->flags[i] & Impl::kSpecial) ids.push_back(i);
  return ids;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos; }

}  // namespace deepinfer
