// DecodeStream: emits text as soon as it is complete UTF-8. Invalid bytes become U+FFFD exactly
// where Tokenizer::decode puts them, so the pieces always concatenate to the full decode.
#include "core/check.h"
#include "deepinfer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

DecodeStream::DecodeStream(const Tokenizer& tok, bool skip_special_tokens) : tok_(&tok), skip_special_(skip_special_tokens) {}

void DecodeStream::reset() { pending_.clear(); }

std::string DecodeStream::finish() {
  std::string out;
  tok::append_lossy(out, pending_);
  pending_.clear();
  return out;
}

std::string DecodeStream::step(int32_t id) {
  const Tokenizer::Impl& m = tok_->impl();
  if (id < 0 || id >= m.vocab_size() || !(m.flags[id] & Tokenizer::Impl::kPresent))
    DI_THROW(InvalidArgument, "DecodeStream: id ", id, " is not a token (vocab_size ", m.vocab_size(), ")");
  if (m.flags[id] & Tokenizer::Impl::kAdded) {
    if (skip_special_ && (m.flags[id] & Tokenizer::Impl::kSpecial)) return {};
    std::string out = finish();  // decode() flushes the byte chunk before an added token too
    out += m.bytes[id];
    return out;
  }
  pending_ += m.bytes[id];
  // Emit everything except a trailing, still-valid but incomplete sequence. Invalid bytes before
  // it are final (no later byte can make them valid), so they are replaced now.
  size_t keep_from = pending_.size();
  size_t start = pending_.size() >= 3 ? pending_.size() - 3 : 0;
  for (size_t i = pending_.size(); i-- > start;) {
    unsigned char c = static_cast<unsigned char>(pending_[i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    bool incomplete;
    if (c >= 0xC0 && tok::utf8_seq_len(std::string_view(pending_).substr(i), &incomplete) == 0 && incomplete)
      keep_from = i;
    break;
  }
  std::string out;
  tok::append_lossy(out, std::string_view(pending_).substr(0, keep_from));
  pending_.erase(0, keep_from);
  return out;
}

}  // namespace deepinfer
