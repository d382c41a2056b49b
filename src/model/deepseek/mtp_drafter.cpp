#include "model/deepseek/mtp_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>

#include "core/check.h"
#include "core/parallel.h"
#include "deepinfer/error.h"
#include "model/deepseek/backend.h"
#include "model/deepseek/model.h"

namespace deepinfer::model::ds {
namespace {
// The draft (the picker's choice, else greedy: lowest id on ties) and its log-probability under
// the row's raw softmax.
std::pair<int32_t, float> choose(const float* row, int64_t V, DraftPicker* picker, size_t seq, int32_t index) {
  const float mx = *std::max_element(row, row + V);
  const int32_t tok = picker ? picker->pick(seq, index, row, V) : int32_t(std::max_element(row, row + V) - row);
  DI_CHECK(tok >= 0 && tok < V, "draft picker chose token ", tok, " of ", V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(mx));
  return {tok, float(double(row[tok]) - double(mx) - std::log(sum))};
}
}  // namespace

std::string MtpDrafter::describe() const {
  return "DeepSeek-V4 MTP (" + std::to_string(model_.num_mtp_blocks()) + " block, recursive)";
}

int64_t MtpDrafter::max_draft_tokens() const { return std::max<int64_t>(model_.max_rollback(), 1); }

std::vector<DraftProposal> MtpDrafter::propose(const DraftBatch& in, Tensor* draft_logits) {
  const int64_t V = model_.vocab_size();
  std::vector<DraftProposal> out(in.seqs.size());
  // Round 0: every committed position (ring entries), logits and output streams at each anchor.
  ForwardBatch b;
  ModelBackend::RowRanges ranges;  // each sequence's rows of the target's hidden rows
  std::vector<size_t> drafting;    // sequences whose anchor row asks for drafts, in row order
  int64_t total = 0;
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    const DraftSeq& s = in.seqs[i];
    if (s.num_positions <= 0 || int64_t(s.next_tokens.size()) != s.num_positions)
      DI_THROW(InvalidArgument, "mtp propose: sequence ", i, " has ", s.num_positions, " positions and ",
               s.next_tokens.size(), " next tokens");
    if (s.num_drafts > max_draft_tokens())
      DI_THROW(InvalidArgument, "mtp propose: ", s.num_drafts, " drafts asked, at most ", max_draft_tokens());
    b.token_ids.insert(b.token_ids.end(), s.next_tokens.begin(), s.next_tokens.end());
    b.seqs.push_back({s.cache_slot, s.block_table, s.first_position, s.num_positions});
    ranges.push_back({s.first_hidden_row, s.num_positions});
    total += s.num_positions;
    if (s.num_drafts > 0) {
      b.logits_indices.push_back(int32_t(total - 1));
      drafting.push_back(i);
    }
  }
  b.hidden_indices = b.logits_indices;
  std::vector<std::vector<std::vector<float>>> rows(in.seqs.size());  // per sequence: drafted positions' logits
  // On a device backend the picks stay there: greedy drafts by the backend's argmax, sampled ones
  // by the picker's device sampler (pick_on_device); one small copy per round instead of
  // [rows, vocab]. The output streams stay on the device.
  bool all_greedy = true;
  for (size_t i : drafting) all_greedy = all_greedy && (!in.picker || in.picker->greedy(i));
  const bool on_device = model_.supports_device_logits() && !draft_logits &&
                         (all_greedy || (in.picker && in.picker->device_picks()));
  const ForwardOptions fo{.logits_on_device = on_device, .hidden_to_host = false};
  std::vector<int32_t> picked;
  std::vector<float> picked_lp;
  std::vector<size_t> round_seqs = drafting;  // the sequences of the round being run, in row order
  auto run = [&](const ForwardBatch& batch, const HiddenRows& h, const ModelBackend::RowRanges& rr) {
    ForwardOutput res = model_.run_mtp(batch, h, 0, rr, fo);
    if (on_device) {
      const int64_t n = int64_t(batch.logits_indices.size());
      picked.resize(size_t(n));
      picked_lp.resize(size_t(n));
      if (all_greedy) {
        model_.backend().greedy_rows(n, picked.data(), picked_lp.data());
      } else if (n > 0) {
        DI_CHECK(res.device_logits.rows == n && size_t(n) == round_seqs.size(), "mtp propose: ",
                 res.device_logits.rows, " device logits rows for ", n, " drafting sequences");
        in.picker->pick_on_device(res.device_logits, round_seqs, picked.data(), picked_lp.data());
      }
    }
    return res;
  };
  ForwardOutput o = run(b, in.target_hidden, ranges);
  for (int round = 0; !drafting.empty(); ++round) {
    std::vector<size_t> next;
    ForwardBatch r;
    if (!on_device) {
      // Host picks (sampled drafts: the request's processed distribution over the whole vocabulary,
      // several passes of [vocab] each) are independent per sequence: spread over the host's
      // cores. Each sequence's pick touches only its own picker target, so the drafts do not
      // depend on the thread count.
      picked.resize(drafting.size());
      picked_lp.resize(drafting.size());
      std::vector<std::exception_ptr> errors(drafting.size());  // an exception must not leave a worker thread
      parallel_for(0, int64_t(drafting.size()), [&](int64_t j) {
        try {
          const size_t i = drafting[size_t(j)];
          const auto [tok, lp] = choose(o.logits.data<float>() + j * V, V, in.picker, i, int32_t(out[i].tokens.size()));
          picked[size_t(j)] = tok;
          picked_lp[size_t(j)] = lp;
        } catch (...) {
          errors[size_t(j)] = std::current_exception();
        }
      });
      for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
    }
    for (size_t j = 0; j < drafting.size(); ++j) {
      const size_t i = drafting[j];
      const DraftSeq& s = in.seqs[i];
      const float* row = on_device ? nullptr : o.logits.data<float>() + int64_t(j) * V;
      const int32_t tok = picked[j];
      const float lp = picked_lp[j];
      out[i].tokens.push_back(tok);
      out[i].logprobs.push_back(lp);
      if (draft_logits) rows[i].emplace_back(row, row + V);
      if (int32_t(out[i].tokens.size()) < s.num_drafts) {
        // The draft becomes the input of the next position; its hidden row is this round's output.
        const int64_t pos = s.first_position + s.num_positions + round;
        r.token_ids.push_back(tok);
        r.seqs.push_back({s.cache_slot, s.block_table, pos, 1});
        r.logits_indices.push_back(int32_t(r.token_ids.size() - 1));
        next.push_back(i);
      }
    }
    if (next.empty()) break;
    // The output streams of the sequences that go on (their rows of this round's output).
    ModelBackend::RowRanges keep;
    for (size_t j = 0, q = 0; j < drafting.size(); ++j)
      if (q < next.size() && drafting[j] == next[q]) keep.push_back({int64_t(j), 1}), ++q;
    r.hidden_indices = r.logits_indices;
    round_seqs = next;
    o = run(r, o.hidden, keep);
    drafting = std::move(next);
  }
  if (draft_logits) {
    int64_t n = 0;
    for (const auto& r : rows) n += int64_t(r.size());
    *draft_logits = Tensor::empty({n, V}, DType::kF32);
    int64_t k = 0;
    for (const auto& seq_rows : rows)
      for (const auto& row : seq_rows) std::copy_n(row.data(), V, draft_logits->data<float>() + (k++) * V);
  }
  return out;
}

}  // namespace deepinfer::model::ds
