// Small adapters between the engine and modules built in parallel (tokenizer, grammar).
// The engine talks only to these interfaces; when a module is absent from the build, the
// factory says so with a typed error instead of breaking the build.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer {
struct ChatMessage;
struct ChatTemplateOptions;
class Tokenizer;
}  // namespace deepinfer

namespace deepinfer::engine {

// Text <-> token ids.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Prompt text to ids; adds BOS when the tokenizer's config asks for it.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Raw bytes of one token (possibly an incomplete UTF-8 sequence); "" for an id without one.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // The model's chat prompt text (encode it with encode()).
  virtual std::string chat_prompt(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const = 0;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  // The full tokenizer behind this codec (its chat formats with tools and reasoning, special
  // token ids), or null for a codec without one (the toy model's byte codec).
  virtual const Tokenizer* tokenizer() const { return nullptr; }
};

// Which chat format a tokenizer codec renders conversations in (chat_prompt): DeepSeek-V4's, or
// DeepSeek-V4.1's (Tokenizer::apply_chat_template_v41: <｜System｜>, spaced DSML tags, numeric
// reasoning effort), chosen from the model's config.json architecture.
enum class ChatFormat { kV4, kV41 };

// Loads the tokenizer from a tokenizer.json / folder. Throws TokenizerError when the
// tokenizer module is not built or the files are bad.
std::unique_ptr<TextCodec> load_tokenizer_codec(const std::string& path, ChatFormat chat = ChatFormat::kV4);
// The byte-level codec of the built-in toy model: 0 = BOS, 1 = EOS, 2 + b = byte b,
// further ids are fixed two-letter pieces.
std::unique_ptr<TextCodec> make_toy_codec(int64_t vocab_size);

// The DeepSeek-V4 chat prompt (BOS + system + <｜User｜>…<｜Assistant｜></think>), used when no
// tokenizer supplies its own.
std::string v4_chat_prompt(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options,
                           std::string_view bos, std::string_view eos);

// One request's grammar state.
class GrammarMatcher {
 public:
  virtual ~GrammarMatcher() = default;
  // Bit t of mask[t/32] set = token t allowed next. `mask` is pre-sized to ceil(vocab/32).
  virtual void fill_bitmask(std::vector<uint32_t>& mask) = 0;
  virtual bool accept_token(int32_t token) = 0;  // false = the token violates the grammar (state unchanged)
  virtual bool is_terminated() const = 0;
  // Undoes the last n accepted tokens (the scheduler accepts a step's drafts to build their
  // masks, then rolls them back). Matchers that cannot roll back keep this default: a request
  // using one is never given drafts (supports_rollback() false).
  virtual bool supports_rollback() const { return false; }
  virtual void rollback(int32_t n);
  // A sampling step's masks for speculative decoding: rows[i] (each pre-sized to ceil(vocab/32)
  // words, rows.size() == drafts.size() + 1) is the mask after accepting drafts[0, i); the state
  // is unchanged on return. The drafts were checked (Scheduler::plan_drafts): one the grammar
  // rejects now is an InternalError. The default accepts, fills and rolls back.
  virtual void fill_bitmasks(std::span<const int32_t> drafts, std::vector<std::vector<uint32_t>>& rows);
};

// One sequence's masks in a step (GrammarCompiler::fill_bitmasks).
struct GrammarMaskJob {
  GrammarMatcher* matcher = nullptr;
  std::span<const int32_t> drafts;                    // the step's drafts for it (may be empty)
  std::vector<std::vector<uint32_t>>* rows = nullptr;  // drafts.size() + 1 pre-sized rows
};

// A grammar that may still be compiling (GrammarCompiler::compile_async).
class PendingGrammar {
 public:
  virtual ~PendingGrammar() = default;
  // True once compiled or failed: make_matcher() then returns (or throws) without blocking.
  virtual bool ready() const = 0;
  // Waits up to `seconds` (0: just looks); returns ready().
  virtual bool wait_for(double seconds) const = 0;
  // A fresh matcher over the grammar, blocking until it is compiled; throws the compile's
  // GrammarError / InvalidArgument.
  virtual std::unique_ptr<GrammarMatcher> make_matcher() const = 0;
};

class GrammarCompiler {
 public:
  virtual ~GrammarCompiler() = default;
  // Throws GrammarError / InvalidArgument for a spec that does not compile.
  // Identical specs share one compiled grammar (the compiler caches by canonical so_args).
  virtual std::unique_ptr<GrammarMatcher> compile(const StructuredOutputsParams& spec) = 0;
  // Starts compiling `spec` off the caller's thread (a request waits for it while others step);
  // the same cache as compile(). The default compiles at once.
  virtual std::shared_ptr<PendingGrammar> compile_async(const StructuredOutputsParams& spec);
  // Fills every job's rows (distinct matchers), in parallel where the compiler has worker
  // threads (the calling thread works too); returns when all are filled. Default: in turn.
  virtual void fill_bitmasks(std::span<const GrammarMaskJob> jobs);
  // How many different compiled grammars compile() has handed out (observes the cache).
  virtual int64_t num_distinct_grammars() const = 0;
};
// nullptr when the grammar module is not built or `codec` is null (structured requests are
// then rejected). The vocabulary is ids [0, vocab_size) with `eos_token_id` as the stop token.
// `threads`: worker threads for compile_async and fill_bitmasks (0: half the cores, 1..8).
// `precompute_ms`: each fresh grammar's mask caches filled on a worker for up to this long
// while its prompt is prefilled (structured.h MaskPrecompute; 0: off; bench-structured).
std::unique_ptr<GrammarCompiler> make_grammar_compiler(const TextCodec* codec, int64_t vocab_size, int64_t eos_token_id,
                                                       int threads = 0, double precompute_ms = 50);

// Replaces invalid UTF-8 sequences with U+FFFD (bindings need valid UTF-8).
std::string sanitize_utf8(std::string_view bytes);
// Length of the longest prefix of `bytes` that is complete UTF-8 (an incomplete tail is held back).
size_t complete_utf8_prefix(std::string_view bytes);

}  // namespace deepinfer::engine
