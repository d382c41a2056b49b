#include "engine/toy_model.h"

#include <algorithm>

#include <cstring>

#include "core/check.h"
#include "engine/toy_drafter.h"

namespace deepinfer::engine {
namespace {
uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint64_t roll(uint64_t h, int32_t tok) { return mix(h * 0x100000001B3ull + uint64_t(tok) + 1); }
uint64_t initial_hash(const ToyModelConfig& c) { return mix(c.weights_seed); }

// window = the last (up to) 4 tokens ending at p
void fill_logits(const ToyModelConfig& c, uint64_t hash, const int32_t* window, int n_window, float* out) {
  uint64_t w = 0;
  for (int i = 0; i < n_window; ++i) w = mix(w ^ uint64_t(window[i] + 7));
  uint64_t g = mix(hash ^ (w << 17 | w >> 47));
  for (int64_t v = 0; v < c.vocab_size; ++v) {
    double u = double(mix(g + uint64_t(v)) >> 11) * (1.0 / 9007199254740992.0);
    float bonus = (v >= 2 + 32 && v < 2 + 127) ? 1.5f : 0.0f;  // mostly printable text
    if (v == 1) bonus = -1.0f;                                  // EOS: rare but reachable
    out[v] = float(4.0 * (u - 0.5)) + bonus;
  }
}
}  // namespace

std::string ToyModel::describe() const {
  return detail::str_cat("ToyModel(vocab=", cfg_.vocab_size, ", max_model_len=", cfg_.max_model_len,
                         ", max_rollback ", cfg_.max_rollback, ", cpu)");
}

kv::CacheGeometry ToyModel::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  kv::CacheGeometry g;
  g.block_tokens = cfg_.block_tokens;
  g.bytes_per_block = size_t(cfg_.block_tokens) * sizeof(int32_t);
  g.bytes_per_slot = 24;  // nominal (hash, length, flag): tests size caches with it
  g.num_slots = max_slots;
  size_t fixed = size_t(max_slots) * g.bytes_per_slot;
  g.num_blocks = budget_bytes > fixed ? int64_t((budget_bytes - fixed) / g.bytes_per_block) : 0;
  // More than every slot at max_model_len is never useful; keeps big default budgets cheap.
  g.num_blocks = std::min(g.num_blocks, max_slots * ((cfg_.max_model_len + cfg_.block_tokens - 1) / cfg_.block_tokens));
  return g;
}

void ToyModel::allocate_cache(const kv::CacheGeometry& g) {
  geometry_ = g;
  blocks_.assign(size_t(g.num_blocks * g.block_tokens), -1);
  slots_.assign(size_t(g.num_slots), Slot{});
}

void ToyModel::reset_slot(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < int32_t(slots_.size()), "slot ", slot, " out of range");
  slots_[size_t(slot)] = Slot{{}, 0, true};
}

uint64_t ToyModel::slot_hash(const Slot& s) const { return s.hashes.empty() ? initial_hash(cfg_) : s.hashes.back(); }

void ToyModel::rollback(int32_t slot, int64_t num_tokens, int64_t keep) {
  CausalLM::rollback(slot, num_tokens, keep);  // the contract's bounds
  DI_CHECK(slot >= 0 && slot < int32_t(slots_.size()), "slot ", slot, " out of range");
  Slot& s = slots_[size_t(slot)];
  DI_CHECK(s.len == num_tokens, "rollback of slot ", slot, " from ", num_tokens, " but it holds ", s.len);
  const int64_t n = num_tokens - keep;
  DI_CHECK(int64_t(s.hashes.size()) >= std::min(n + 1, num_tokens), "slot ", slot, " ring too short");
  for (int64_t i = 0; i < n; ++i) s.hashes.pop_back();
  s.len = keep;
  ++num_rollbacks_;
}

const ToyModel::Slot& ToyModel::slot_at(int32_t slot) const {
  DI_CHECK(slot >= 0 && slot < int32_t(slots_.size()), "slot ", slot, " out of range");
  return slots_[size_t(slot)];
}

bool ToyModel::can_save_slot(int32_t slot, int64_t n) const {
  const Slot& s = slot_at(slot);
  // The hash after position n-1 must still be in the ring (or n == 0: the initial hash).
  return s.reset && n >= 0 && n <= s.len && s.len - n <= cfg_.max_rollback &&
         (n == 0 || int64_t(s.hashes.size()) > s.len - n);
}

// Bytes: [n int64][count int64][count hashes uint64], the ring as it is after dropping len - n.
model::SlotSnapshot ToyModel::save_slot(int32_t slot, int64_t n) {
  DI_CHECK(can_save_slot(slot, n), "ToyModel: slot ", slot, " cannot be saved at ", n, " (holds ", slot_at(slot).len, ")");
  const Slot& s = slot_at(slot);
  std::vector<uint64_t> ring(s.hashes.begin(), s.hashes.end() - (s.len - n));
  std::vector<uint64_t> words = {uint64_t(n), uint64_t(ring.size())};
  words.insert(words.end(), ring.begin(), ring.end());
  model::SlotSnapshot snap{n, std::vector<uint8_t>(words.size() * sizeof(uint64_t))};
  std::memcpy(snap.bytes.data(), words.data(), snap.bytes.size());
  return snap;
}

void ToyModel::restore_slot(int32_t slot, const model::SlotSnapshot& snap) {
  DI_CHECK(slot >= 0 && slot < int32_t(slots_.size()), "slot ", slot, " out of range");
  DI_CHECK(snap.bytes.size() >= 16 && snap.bytes.size() % 8 == 0, "ToyModel: snapshot of ", snap.bytes.size(), " bytes");
  std::vector<uint64_t> words(snap.bytes.size() / 8);
  std::memcpy(words.data(), snap.bytes.data(), snap.bytes.size());
  DI_CHECK(int64_t(words[0]) == snap.num_tokens && words[1] + 2 == words.size(), "ToyModel: corrupt snapshot");
  Slot& s = slots_[size_t(slot)];
  s = Slot{std::deque<uint64_t>(words.begin() + 2, words.end()), snap.num_tokens, true};
  ++num_restores_;
  if (auto* d = dynamic_cast<ToyDrafter*>(drafter_.get())) d->restored(slot, snap.num_tokens);
}

void ToyModel::copy_blocks_to_host(std::span<const model::HostBlockCopy> copies) {
  const size_t n = paged_block_bytes();
  for (const model::HostBlockCopy& c : copies) {
    DI_CHECK(c.block >= 0 && c.block < geometry_.num_blocks && c.host, "ToyModel: bad block copy of ", c.block);
    std::memcpy(c.host, blocks_.data() + size_t(c.block * geometry_.block_tokens), n);
    ++num_block_copies_;
  }
}

void ToyModel::copy_blocks_from_host(std::span<const model::HostBlockCopy> copies) {
  const size_t n = paged_block_bytes();
  for (const model::HostBlockCopy& c : copies) {
    DI_CHECK(c.block >= 0 && c.block < geometry_.num_blocks && c.host, "ToyModel: bad block copy of ", c.block);
    std::memcpy(blocks_.data() + size_t(c.block * geometry_.block_tokens), c.host, n);
    ++num_block_copies_;
  }
}

void ToyModel::emit(const model::SeqInBatch& s, int64_t p, uint64_t hash, float* logits, float* hidden) const {
  const int64_t bt = geometry_.block_tokens;
  int32_t window[4];
  int n = 0;
  for (int64_t q = std::max<int64_t>(0, p - 3); q <= p; ++q) {
    int32_t v = blocks_[size_t(s.block_table[size_t(q / bt)] * bt + q % bt)];
    DI_CHECK(v >= 0, "position ", q, " read from an unwritten block");
    window[n++] = v;
  }
  if (logits) fill_logits(cfg_, hash, window, n, logits);
  if (hidden) {
    ToyState st{hash, {-1, -1, -1}};
    for (int k = 0; k < 3 && k < n; ++k) st.window[size_t(2 - k)] = window[n - 1 - k];
    encode_hidden(st, hidden);
  }
}

model::ForwardOutput ToyModel::run(const model::ForwardBatch& batch, const model::ForwardOptions& /*options*/) {
  ++num_forward_calls_;
  const int64_t bt = geometry_.block_tokens, V = cfg_.vocab_size, T = batch.num_tokens();
  auto rows_of = [T](const std::vector<int32_t>& indices, const char* field) {
    std::vector<int64_t> row(size_t(T), -1);
    for (size_t r = 0; r < indices.size(); ++r) {
      DI_CHECK(indices[r] >= 0 && indices[r] < T, field, " index ", indices[r], " outside the batch");
      row[size_t(indices[r])] = int64_t(r);
    }
    return row;
  };
  const std::vector<int64_t> logits_row = rows_of(batch.logits_indices, "logits"),
                             hidden_row = rows_of(batch.hidden_indices, "hidden");
  model::ForwardOutput out;
  out.logits = Tensor::empty({int64_t(batch.logits_indices.size()), V}, DType::kF32);
  const int64_t H = int64_t(batch.hidden_indices.size());
  if (H > 0) {
    out.hidden.host = Tensor::empty({H, 1, kHiddenElems}, DType::kF32);
    out.hidden.rows = H;
    out.hidden.row_elems = kHiddenElems;
  }
  float* L = out.logits.data<float>();
  float* Hd = H > 0 ? out.hidden.host.data<float>() : nullptr;
  size_t t = 0;
  for (const model::SeqInBatch& s : batch.seqs) {
    DI_CHECK(s.cache_slot >= 0 && s.cache_slot < int32_t(slots_.size()), "bad slot ", s.cache_slot);
    Slot& slot = slots_[size_t(s.cache_slot)];
    DI_CHECK(slot.reset, "slot ", s.cache_slot, " used without reset_slot");
    DI_CHECK(slot.len == s.num_computed_tokens, "slot ", s.cache_slot, " holds ", slot.len,
             " tokens but the batch says ", s.num_computed_tokens, " are computed");
    for (int32_t j = 0; j < s.num_new_tokens; ++j, ++t) {
      DI_CHECK(t < batch.token_ids.size(), "batch has fewer tokens than its sequences claim");
      int64_t p = s.num_computed_tokens + j;
      DI_CHECK(p / bt < int64_t(s.block_table.size()), "position ", p, " has no block");
      int32_t blk = s.block_table[size_t(p / bt)];
      DI_CHECK(blk >= 0 && blk < geometry_.num_blocks, "block id ", blk, " out of range");
      blocks_[size_t(blk * bt + p % bt)] = batch.token_ids[t];
      slot.hashes.push_back(roll(slot_hash(slot), batch.token_ids[t]));
      if (int64_t(slot.hashes.size()) > cfg_.max_rollback + 1) slot.hashes.pop_front();
      slot.len = p + 1;
      if (logits_row[t] < 0 && hidden_row[t] < 0) continue;
      emit(s, p, slot.hashes.back(), logits_row[t] < 0 ? nullptr : L + logits_row[t] * V,
           hidden_row[t] < 0 ? nullptr : Hd + hidden_row[t] * kHiddenElems);
    }
  }
  DI_CHECK(t == batch.token_ids.size(), "batch has more tokens than its sequences claim");
  return out;
}

ToyState ToyModel::initial_state(const ToyModelConfig& c) { return ToyState{initial_hash(c), {-1, -1, -1}}; }

void ToyModel::step(const ToyModelConfig& c, ToyState& s, int32_t token, float* logits) {
  s.hash = roll(s.hash, token);
  int32_t window[4];
  int n = 0;
  for (int32_t w : s.window)
    if (w >= 0) window[n++] = w;
  window[n++] = token;
  fill_logits(c, s.hash, window, n, logits);
  s.window = {s.window[1], s.window[2], token};
}

void ToyModel::encode_hidden(const ToyState& s, float* row) {
  for (int k = 0; k < 4; ++k) row[k] = float((s.hash >> (16 * k)) & 0xFFFF);  // exact in f32
  for (int k = 0; k < 3; ++k) row[4 + k] = float(s.window[size_t(k)]);
  row[7] = 0.0f;
}

ToyState ToyModel::decode_hidden(const float* row) {
  ToyState s;
  s.hash = 0;
  for (int k = 0; k < 4; ++k) s.hash |= uint64_t(row[k]) << (16 * k);
  for (int k = 0; k < 3; ++k) s.window[size_t(k)] = int32_t(row[4 + k]);
  return s;
}

std::vector<float> ToyModel::reference_logits(const ToyModelConfig& c, const std::vector<int32_t>& tokens) {
  std::vector<float> out(tokens.size() * size_t(c.vocab_size));
  ToyState s = initial_state(c);
  for (size_t p = 0; p < tokens.size(); ++p) step(c, s, tokens[p], out.data() + p * size_t(c.vocab_size));
  return out;
}

}  // namespace deepinfer::engine
