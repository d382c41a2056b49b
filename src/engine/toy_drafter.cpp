#include "engine/toy_drafter.h"

#include <algorithm>
#include <vector>

#include "core/check.h"

namespace deepinfer::engine {

void ToyDrafter::check_feed(const model::DraftSeq& s, const float* hidden0) const {
  auto it = next_position_.find(s.cache_slot);
  const int64_t expect = it == next_position_.end() ? 0 : it->second;
  DI_CHECK(s.first_position == 0 || s.first_position == expect || (allow_gaps_ && s.first_position > expect),
           "ToyDrafter: slot ", s.cache_slot, " fed from position ", s.first_position, " but it holds ", expect);
  DI_CHECK(s.num_positions > 0 && int32_t(s.next_tokens.size()) == s.num_positions, "ToyDrafter: ", s.num_positions,
           " positions with ", s.next_tokens.size(), " next tokens");
  // Row i + 1 must be row i's state advanced by the token fed after position i.
  std::vector<float> scratch(size_t(cfg_.vocab_size));
  for (int32_t i = 0; i + 1 < s.num_positions; ++i) {
    ToyState st = ToyModel::decode_hidden(hidden0 + int64_t(i) * ToyModel::kHiddenElems);
    ToyModel::step(cfg_, st, s.next_tokens[size_t(i)], scratch.data());
    const ToyState want = ToyModel::decode_hidden(hidden0 + int64_t(i + 1) * ToyModel::kHiddenElems);
    DI_CHECK(st.hash == want.hash && st.window == want.window, "ToyDrafter: slot ", s.cache_slot, " position ",
             s.first_position + i + 1, ": hidden row does not follow the token fed before it");
  }
}

model::DraftProposal ToyDrafter::propose_one(const model::DraftSeq& s, const float* last_hidden,
                                             model::DraftPicker* picker, size_t seq) {
  model::DraftProposal p;
  if (s.num_drafts <= 0) return p;
  const int64_t anchor_position = s.first_position + s.num_positions;
  const int32_t correct = std::clamp<int32_t>(pattern_(anchor_position), 0, s.num_drafts);
  std::vector<float> logits(size_t(cfg_.vocab_size));
  ToyState st = ToyModel::decode_hidden(last_hidden);
  int32_t next = s.next_tokens.back();  // the anchor
  for (int32_t i = 0; i < s.num_drafts; ++i) {
    ToyModel::step(cfg_, st, next, logits.data());
    int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (picker && picker_noise_ >= 0) {
      const int64_t pos = anchor_position + 1 + i;
      for (int64_t v = 0; v < cfg_.vocab_size; ++v)
        logits[size_t(v)] += picker_noise_ * float(int64_t((uint64_t(v) * 2654435761u + uint64_t(pos) * 40503u) % 1000) - 500) / 500.f;
      best = picker->pick(seq, i, logits.data(), cfg_.vocab_size);
    } else if (i >= correct) {
      best = int32_t((best + 1 + anchor_position % 5) % cfg_.vocab_size);  // not the argmax
    }
    p.tokens.push_back(best);
    p.logprobs.push_back(0.0f);
    next = best;
  }
  num_proposed_ += int64_t(p.tokens.size());
  return p;
}

std::vector<model::DraftProposal> ToyDrafter::propose(const model::DraftBatch& batch, Tensor* draft_logits) {
  DI_CHECK(!draft_logits, "ToyDrafter returns no draft logits");
  const model::HiddenRows& h = batch.target_hidden;
  DI_CHECK(h.host.defined() && h.row_elems == ToyModel::kHiddenElems, "ToyDrafter needs host hidden rows of ",
           ToyModel::kHiddenElems, " floats, got ", h.row_elems);
  const float* rows = h.host.data<float>();
  std::vector<model::DraftProposal> out;
  for (size_t k = 0; k < batch.seqs.size(); ++k) {
    const model::DraftSeq& s = batch.seqs[k];
    DI_CHECK(s.first_hidden_row >= 0 && s.first_hidden_row + s.num_positions <= h.rows, "ToyDrafter: rows [",
             s.first_hidden_row, ", +", s.num_positions, ") outside the ", h.rows, " hidden rows");
    const float* first = rows + s.first_hidden_row * ToyModel::kHiddenElems;
    check_feed(s, first);
    if (auto it = next_position_.find(s.cache_slot); it != next_position_.end() && s.first_position > it->second)
      num_skipped_ += s.first_position - it->second;
    next_position_[s.cache_slot] = s.first_position + s.num_positions;
    num_fed_ += s.num_positions;
    out.push_back(propose_one(s, first + int64_t(s.num_positions - 1) * ToyModel::kHiddenElems, batch.picker, k));
  }
  return out;
}

}  // namespace deepinfer::engine
