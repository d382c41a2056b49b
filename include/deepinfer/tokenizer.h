// Byte-level BPE tokenizer (Hugging Face `tokenizer.json` or GPT-2 encoder.json + vocab.bpe),
// incremental detokenization for streaming, and the DeepSeek-V4 chat format.
//
// Contract:
//  - ids produced by encode() equal those of Hugging Face `tokenizers` for the same file with
//    add_special_tokens=false; with add_special_tokens=true the post-processor runs and, when
//    tokenizer_config.json says add_bos_token, BOS is prepended (as transformers does).
//  - Text must be valid UTF-8; otherwise encode throws TokenizerError naming the byte offset.
//  - decode() is lossy like HF: byte sequences that are not valid UTF-8 become U+FFFD.
//  - A Tokenizer is immutable after loading and safe to use from many threads at once
//    (per-thread regex match data and word caches live inside the implementation).
//  - Loading errors (missing/malformed file, unknown model/normalizer/pre-tokenizer/decoder type,
//    a merge naming an unknown token) throw TokenizerError naming the file and JSON field.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer {

// ---- DeepSeek-V4 chat format (MODEL-DEEPSEEK-V4.md §8.2; mirrors encoding_dsv4.py) ----
struct ToolCall {
  std::string id;         // optional; orders tool results when several calls were made
  std::string name;       // function name
  std::string arguments;  // JSON object text, e.g. {"city": "Paris"}
};

struct Message {
  std::string role;                              // "system" | "developer" | "user" | "assistant" | "tool"
  std::string content;                           // text (tool: the tool's output)
  std::optional<std::string> reasoning_content;  // assistant: the thinking text, if any
  std::vector<ToolCall> tool_calls;              // assistant: DSML tool calls
  std::string tool_call_id;                      // tool: id of the call this answers
  std::string tools_json;  // system/developer: JSON array of OpenAI tools [{"type":"function","function":{...}}]
  std::string response_format_json;  // system/developer: JSON schema text the reply must follow
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with "<｜Assistant｜>" + think tag after a final user turn
  bool thinking = false;              // thinking mode ("<think>") vs chat mode ("</think>")
  std::string reasoning_effort;       // "" | "high" | "max" ("max" prepends a fixed instruction)
  bool drop_thinking = true;          // drop reasoning of turns before the last user turn (off when tools exist)
  bool add_bos = true;                // start with BOS
};

// ---- DeepSeek-V4.1 chat format (MODEL-DEEPSEEK-V41.md §8; mirrors its encoding/encoding.py) ----
// Same messages as V4 (no image blocks: a literal <｜deepseek_image｜> in text is refused).
struct ChatOptionsV41 {
  bool add_generation_prompt = true;  // end with "<｜Assistant｜>" + think tag after a final user/system turn
  bool thinking = false;              // thinking mode ("<think>") vs chat mode ("</think>")
  std::string reasoning_effort;       // "" (= "high"), "low" (50), "high" (75), "max" (100) or "1".."100"
  bool drop_thinking = true;          // drop reasoning of turns before the last user turn (off when tools exist)
  bool add_bos = true;                // start with BOS
};

class Tokenizer {
 public:
  // `path` may be: a tokenizer.json (tokenizer_config.json beside it is read when present),
  // a folder holding tokenizer.json, an encoder.json (vocab.bpe beside it), or a folder
  // holding encoder.json + vocab.bpe.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();
  Tokenizer clone() const;  // deep copy (a Tokenizer never aliases another)

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Encodes texts in parallel (num_threads <= 0: hardware concurrency). Output i is encode(texts[i]).
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts,
                                                 bool add_special_tokens = false, int num_threads = 0) const;
  // Ids outside [0, vocab_size) or without a token throw InvalidArgument naming the position.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest token id (ids without a token inside the range have empty bytes).
  int32_t vocab_size() const;
  // Token string as stored in the vocabulary (byte-level alphabet, e.g. "Ġthe"), or an added
  // token's content. nullopt when unknown.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an id without a token; throws when out of range
  // Raw bytes the token stands for (byte-level decoded; an added token's UTF-8 content).
  // Valid for the Tokenizer's lifetime; "" for an id without a token. Throws when out of range.
  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;  // added token marked special
  std::vector<int32_t> special_ids() const;  // sorted
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool add_bos_token() const;  // from tokenizer_config.json (false when absent)

  // DeepSeek-V4 prompt text for `messages` (encode it with add_special_tokens=false).
  // Throws InvalidArgument for an unknown role, bad reasoning_effort or malformed tool JSON.
  std::string apply_chat_template(std::span<const Message> messages, const ChatOptions& options = {}) const;
  // DeepSeek-V4.1 prompt text (src/tokenizer/chat_dsv41.cpp). Throws InvalidArgument for an unknown
  // role, a bad reasoning_effort, tool-call arguments that are not a JSON object, malformed tool JSON.
  std::string apply_chat_template_v41(std::span<const Message> messages, const ChatOptionsV41& options = {}) const;

  struct Impl;  // src/tokenizer/tokenizer_impl.h
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: feed ids one at a time, get text as soon as it is complete UTF-8.
// The concatenation of everything step() and finish() return equals tok.decode(all ids).
// Borrows the Tokenizer, which must outlive it.
class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tok, bool skip_special_tokens = false);
  std::string step(int32_t id);  // new text, possibly "" while a character is incomplete
  std::string finish();          // flushes an incomplete tail as U+FFFD; the stream may continue after
  void reset();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;  // bytes of a UTF-8 sequence not yet complete (< 4 bytes)
};

}  // namespace deepinfer
