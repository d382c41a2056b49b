#include "model/deepseek_v41/engram_slots.h"

#include <algorithm>
#include <cstring>

#include "deepinfer/error.h"

namespace deepinfer::model::v41 {

EngramSlots::EngramSlots(const EngramHasher& hasher, int64_t max_rollback)
    : hasher_(hasher), keep_(hasher.max_ngram() - 1 + std::max<int64_t>(max_rollback, 0)) {}

EngramSlots::Tail& EngramSlots::tail(int32_t slot) {
  if (slot < 0) DI_THROW(InternalError, "engram: slot ", slot);
  if (size_t(slot) >= tails_.size()) tails_.resize(size_t(slot) + 1);
  return tails_[size_t(slot)];
}

void EngramSlots::reset(int32_t slot) { tail(slot) = {}; }

// The history before position `pos`: the classes of tokens pos-1 .. pos-(N-1) from the tail, which
// is cut to end at pos (a rolled-back sequence resumes there).
EngramHistory EngramSlots::history_at(int32_t slot, int64_t pos) {
  Tail& t = tail(slot);
  const int64_t begin = t.end - int64_t(t.tokens.size());
  const int64_t need = std::max<int64_t>(0, pos - (hasher_.max_ngram() - 1));
  if (pos > t.end || need < begin)
    DI_THROW(InternalError, "engram: slot ", slot, " resumes at position ", pos, " but its history holds positions [",
             begin, ", ", t.end, ") (rolled back further than max_rollback, or a slot restored without its snapshot)");
  t.tokens.resize(size_t(pos - begin));
  t.end = pos;
  return hasher_.history_after(t.tokens.data() + (need - begin), pos - need, nullptr);
}

std::vector<std::vector<int64_t>> EngramSlots::step(const ForwardBatch& b, const std::vector<const ds::EngramRef*>& tables) {
  std::vector<EngramHistory> hist;
  hist.reserve(b.seqs.size());
  std::vector<EngramStepSeq> seqs;
  int64_t t0 = 0;
  for (const SeqInBatch& s : b.seqs) {
    hist.push_back(history_at(s.cache_slot, s.num_computed_tokens));
    seqs.push_back({.history = &hist.back(), .tokens = b.token_ids.data() + t0, .dead = nullptr, .n = s.num_new_tokens});
    t0 += s.num_new_tokens;
  }
  std::vector<std::vector<int64_t>> ids = engram_step_ids(hasher_, tables, seqs);
  t0 = 0;
  for (const SeqInBatch& s : b.seqs) {
    Tail& t = tail(s.cache_slot);
    t.tokens.insert(t.tokens.end(), b.token_ids.begin() + t0, b.token_ids.begin() + t0 + s.num_new_tokens);
    t.end += s.num_new_tokens;
    if (int64_t(t.tokens.size()) > keep_) t.tokens.erase(t.tokens.begin(), t.tokens.end() - keep_);
    t0 += s.num_new_tokens;
  }
  return ids;
}

// Layout appended: int32 tokens [count], then int64 count, int64 end (read back from the end).
void EngramSlots::append_snapshot(int32_t slot, int64_t n, std::vector<uint8_t>& bytes) const {
  Tail t = size_t(slot) < tails_.size() ? tails_[size_t(slot)] : Tail{};
  const int64_t begin = t.end - int64_t(t.tokens.size());
  if (n > t.end || n < begin)
    DI_THROW(InvalidArgument, "engram: slot ", slot, " cannot be saved at ", n, " positions (history [", begin, ", ",
             t.end, "))");
  t.tokens.resize(size_t(n - begin));
  const int64_t trailer[2] = {int64_t(t.tokens.size()), n};
  const size_t at = bytes.size(), tok_bytes = t.tokens.size() * sizeof(int32_t);
  bytes.resize(at + tok_bytes + sizeof(trailer));
  if (tok_bytes) std::memcpy(bytes.data() + at, t.tokens.data(), tok_bytes);
  std::memcpy(bytes.data() + at + tok_bytes, trailer, sizeof(trailer));
}

void EngramSlots::take_snapshot(int32_t slot, std::vector<uint8_t>& bytes) {
  int64_t trailer[2];
  if (bytes.size() < sizeof(trailer)) DI_THROW(InvalidArgument, "engram: slot snapshot without its Engram history");
  std::memcpy(trailer, bytes.data() + bytes.size() - sizeof(trailer), sizeof(trailer));
  const int64_t count = trailer[0];
  if (count < 0 || count > keep_ || size_t(count) * sizeof(int32_t) + sizeof(trailer) > bytes.size() ||
      trailer[1] < count)
    DI_THROW(InvalidArgument, "engram: slot snapshot with a bad Engram history (", count, " tokens, end ", trailer[1], ")");
  Tail& t = tail(slot);
  const size_t at = bytes.size() - sizeof(trailer) - size_t(count) * sizeof(int32_t);
  t.tokens.resize(size_t(count));
  if (count) std::memcpy(t.tokens.data(), bytes.data() + at, size_t(count) * sizeof(int32_t));
  t.end = trailer[1];
  bytes.resize(at);
}

}  // namespace deepinfer::model::v41
