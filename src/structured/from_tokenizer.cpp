// TokenizerInfo from the tokenizer module (built only when di_tokenizer exists).
#include <algorithm>

#include "deepinfer/structured.h"
#include "deepinfer/tokenizer.h"

namespace deepinfer::structured {

TokenizerInfo tokenizer_info_from(const Tokenizer& tok) {
  TokenizerInfo info;
  const int32_t n = tok.vocab_size();
  info.token_bytes.resize(n);
  for (int32_t i = 0; i < n; ++i) info.token_bytes[i] = tok.token_bytes(i);
  if (auto eos = tok.eos_id()) info.stop_ids.push_back(*eos);
  for (int32_t id : tok.special_ids())
    if (std::find(info.stop_ids.begin(), info.stop_ids.end(), id) == info.stop_ids.end()) info.special_ids.push_back(id);
  return info;
}

}  // namespace deepinfer::structured
