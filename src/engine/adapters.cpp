#include "engine/adapters.h"

#include <exception>

#include "core/check.h"
#include "deepinfer/llm.h"

#if defined(DEEPINFER_HAVE_TOKENIZER)
#include "deepinfer/tokenizer.h"
#endif

namespace deepinfer::engine {

// ---- UTF-8 helpers ----
namespace {
// Length of the valid UTF-8 sequence starting at s[i] (1..4), 0 if invalid, -1 if truncated.
int utf8_seq_len(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n <= 1) return n;
  if (c == 0xC0 || c == 0xC1 || c > 0xF4) return 0;
  for (int k = 1; k < n; ++k) {
    if (i + size_t(k) >= s.size()) return -1;
    if ((static_cast<unsigned char>(s[i + size_t(k)]) & 0xC0) != 0x80) return 0;
  }
  return n;
}
}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int n = utf8_seq_len(s, i);
    if (n > 0) {
      out.append(s.substr(i, size_t(n)));
      i += size_t(n);
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    }
  }
  return out;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Everything except a trailing, still-completable multi-byte sequence. Invalid bytes count
  // as complete (they will print as U+FFFD) so they never block the stream.
  size_t i = 0;
  while (i < s.size()) {
    int n = utf8_seq_len(s, i);
    if (n < 0) return i;
    i += n > 0 ? size_t(n) : 1;
  }
  return s.size();
}

void GrammarMatcher::rollback(int32_t n) {
  DI_THROW(InternalError, "this grammar matcher cannot roll back (asked for ", n, " tokens)");
}

void GrammarMatcher::fill_bitmasks(std::span<const int32_t> drafts, std::vector<std::vector<uint32_t>>& rows) {
  DI_CHECK(rows.size() == drafts.size() + 1, "fill_bitmasks: ", rows.size(), " rows for ", drafts.size(), " drafts");
  DI_CHECK(drafts.empty() || supports_rollback(), "fill_bitmasks: drafts for a matcher that cannot roll back");
  int32_t accepted = 0;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    fill_bitmask(rows[i]);
    if (i == drafts.size()) break;
    if (!accept_token(drafts[i])) {
      if (accepted > 0) rollback(accepted);
      DI_THROW(InternalError, "draft ", i, " (token ", drafts[i], ") was checked against the grammar but is rejected now");
    }
    ++accepted;
  }
  if (accepted > 0) rollback(accepted);
}

namespace {
// compile_async's default: compiled (or failed) at once.
class ReadyGrammar final : public PendingGrammar {
 public:
  ReadyGrammar(GrammarCompiler& c, const StructuredOutputsParams& spec) : compiler_(c), spec_(spec) {
    try {
      first_ = c.compile(spec);
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  bool ready() const override { return true; }
  bool wait_for(double) const override { return true; }
  std::unique_ptr<GrammarMatcher> make_matcher() const override {
    if (error_) std::rethrow_exception(error_);
    if (first_) return std::move(first_);
    return compiler_.compile(spec_);  // cached: a fresh matcher over the same grammar
  }

 private:
  GrammarCompiler& compiler_;
  StructuredOutputsParams spec_;
  mutable std::unique_ptr<GrammarMatcher> first_;
  std::exception_ptr error_;
};
}  // namespace

std::shared_ptr<PendingGrammar> GrammarCompiler::compile_async(const StructuredOutputsParams& spec) {
  return std::make_shared<ReadyGrammar>(*this, spec);
}

void GrammarCompiler::fill_bitmasks(std::span<const GrammarMaskJob> jobs) {
  for (const GrammarMaskJob& j : jobs) j.matcher->fill_bitmasks(j.drafts, *j.rows);
}

std::string TextCodec::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t t : ids)
    if (!(skip_special_tokens && is_special(t))) bytes += token_bytes(t);
  return sanitize_utf8(bytes);
}

// ---- DeepSeek-V4 chat format (MODEL-DEEPSEEK-V4.md §8.2) ----
std::string v4_chat_prompt(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& o,
                           std::string_view bos, std::string_view eos) {
  std::string out(bos);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      out += m.content;
    } else if (m.role == "user") {
      out += "<｜User｜>" + m.content;
    } else if (m.role == "assistant") {
      out += "<｜Assistant｜></think>" + m.content;
      out += eos;
    } else {
      DI_THROW(InvalidArgument, "chat message ", i, ": unknown role '", m.role, "' (use system, user or assistant)");
    }
  }
  if (o.add_generation_prompt) out += o.thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>";
  return out;
}

// ---- toy codec: 0 BOS, 1 EOS, 2+b byte b, then two-letter pieces ----
namespace {
class ToyCodec final : public TextCodec {
 public:
  explicit ToyCodec(int64_t vocab) : vocab_(vocab) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids = {0};
    for (unsigned char c : text) ids.push_back(int32_t(c) + 2);
    return ids;
  }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= vocab_) DI_THROW(InvalidArgument, "token id ", id, " is outside [0, ", vocab_, ")");
    if (id == 0) return "<s>";
    if (id == 1) return "</s>";
    if (id < 258) return std::string(1, char(id - 2));
    int k = id - 258;
    return std::string{char('a' + k % 26), char('a' + (k / 26) % 26)};
  }
  bool is_special(int32_t id) const override { return id == 0 || id == 1; }
  std::string chat_prompt(const std::vector<ChatMessage>& m, const ChatTemplateOptions& o) const override {
    return v4_chat_prompt(m, o, "", "");  // encode() adds BOS
  }

 private:
  int64_t vocab_;
};

#if defined(DEEPINFER_HAVE_TOKENIZER)
class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(Tokenizer tok, ChatFormat chat) : tok_(std::move(tok)), chat_(chat) {}
  bool known(int32_t id) const { return id >= 0 && id < tok_.vocab_size(); }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids = tok_.encode(text, /*add_special_tokens=*/false);
    if (tok_.add_bos_token() && tok_.bos_id() && (ids.empty() || ids[0] != *tok_.bos_id())) ids.insert(ids.begin(), *tok_.bos_id());
    return ids;
  }
  // Checkpoints often pad the embedding past the tokenizer (V4: 129,280 rows, 128,815 tokens in
  // the V3 tokenizer.json). A sampled padding id has no text: like HF's decode, it contributes
  // nothing and counts as special, instead of failing the request.
  std::string token_bytes(int32_t id) const override { return known(id) ? tok_.token_bytes(id) : std::string(); }
  bool is_special(int32_t id) const override { return !known(id) || tok_.is_special(id); }
  std::string chat_prompt(const std::vector<ChatMessage>& msgs, const ChatTemplateOptions& o) const override {
    std::vector<Message> m;
    for (const ChatMessage& c : msgs) {
      Message x;
      x.role = c.role;
      x.content = c.content;
      m.push_back(std::move(x));
    }
    if (chat_ == ChatFormat::kV41) {
      ChatOptionsV41 co;
      co.add_generation_prompt = o.add_generation_prompt;
      co.thinking = o.thinking;
      return tok_.apply_chat_template_v41(m, co);
    }
    ChatOptions co;
    co.add_generation_prompt = o.add_generation_prompt;
    co.thinking = o.thinking;
    return tok_.apply_chat_template(m, co);
  }
  const Tokenizer* tokenizer() const override { return &tok_; }

 private:
  Tokenizer tok_;
  ChatFormat chat_;
};
#endif
}  // namespace

std::unique_ptr<TextCodec> make_toy_codec(int64_t vocab) { return std::make_unique<ToyCodec>(vocab); }

std::unique_ptr<TextCodec> load_tokenizer_codec(const std::string& path, ChatFormat chat) {
#if defined(DEEPINFER_HAVE_TOKENIZER)
  return std::make_unique<TokenizerCodec>(Tokenizer::from_file(path), chat);
#else
  (void)chat;
  DI_THROW(TokenizerError, "cannot load the tokenizer at '", path,
           "': this build has no tokenizer module (use skip_tokenizer_init and token-id prompts)");
#endif
}

}  // namespace deepinfer::engine
