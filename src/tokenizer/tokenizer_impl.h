// Internal state of a loaded Tokenizer (include/deepinfer/tokenizer.h). Immutable after load.
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/tokenizer.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"

namespace deepinfer {

struct Tokenizer::Impl {
  std::string source;  // file the tokenizer came from (for messages)

  tok::BpeModel bpe;
  tok::Normalizer normalizer;
  tok::PreTokenizer pretok;

  std::vector<tok::AddedToken> added;  // in file order
  tok::AddedMatcher raw_matcher;       // added tokens with normalized=false: matched on raw text
  tok::AddedMatcher norm_matcher;      // normalized=true: matched on normalized text

  // Per id ([vocab_size]): token string as in the file, raw bytes, flags.
  std::vector<std::string> tokens;
  std::vector<std::string> bytes;
  std::vector<uint8_t> flags;  // kPresent | kAdded | kSpecial
  static constexpr uint8_t kPresent = 1, kAdded = 2, kSpecial = 4;
  std::unordered_map<std::string, int32_t> token_to_id;

  // Post-processor for a single sequence: ids placed before / after the encoded text.
  std::vector<int32_t> post_prefix, post_suffix;

  std::optional<int32_t> bos, eos;
  bool add_bos = false, add_eos = false;  // tokenizer_config.json
  std::string bos_text = "<｜begin▁of▁sentence｜>", eos_text = "<｜end▁of▁sentence｜>";

  uint64_t uid = next_uid();  // keys the per-thread word caches

  static uint64_t next_uid() {
    static std::atomic<uint64_t> n{1};
    return n++;
  }
  int32_t vocab_size() const { return int32_t(tokens.size()); }
  void set_token(int32_t id, const std::string& tok, const std::string& raw, uint8_t fl);
  void finalize();  // builds matchers and maps after tokens/added are filled

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const;
  // Encodes text that holds no added tokens (normalized already).
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  std::unique_ptr<Impl> clone() const;
};

namespace tok {
// Token ids in a file must be below this: arrays are sized by the largest id, so one hostile
// id (2^31 - 1) would otherwise allocate tens of GB. Real vocabularies stay under 300k.
constexpr int64_t kMaxTokenId = int64_t(1) << 22;

std::unique_ptr<Tokenizer::Impl> load_tokenizer_json(const std::string& path);
std::unique_ptr<Tokenizer::Impl> load_gpt2(const std::string& encoder_json, const std::string& vocab_bpe);
void load_tokenizer_config(const std::string& path, Tokenizer::Impl& impl);
}  // namespace tok

}  // namespace deepinfer
