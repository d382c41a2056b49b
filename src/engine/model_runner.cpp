#include "engine/model_runner.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <deque>
#include <optional>

#include "core/check.h"
#include "core/parallel.h"
#include "engine/philox.h"
#include "engine/sampler.h"
#include "engine/spec_verify.h"

namespace deepinfer::engine {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The runner's DraftPicker: each sequence drafts as it samples. A sampled draft is drawn from the
// request's processed distribution over the drafter's logits (history = output + earlier drafts,
// Philox stream kSpecDraft at the draft's position) and that distribution is recorded for
// rejection sampling; every other draft is the drafter's argmax (one-hot q, nothing recorded).
class RequestDraftPicker final : public model::DraftPicker {
 public:
  struct Target {
    SamplingRow base;                              // params, seed, histories, eos; position = first draft's
    bool sampled = false;
    std::vector<int32_t>* drafts = nullptr;        // filled in draft order
    std::vector<std::vector<float>>* q = nullptr;  // [drafts] weights, empty entries for greedy drafts
    std::vector<int64_t>* q_rows = nullptr;        // [drafts] device pool rows of q (device picks; -1 greedy)
    int64_t pool_base = 0;                         // device picks: draft i's q goes to pool row pool_base + i
    SamplingParams device_params;                  // device picks: the request's, without top-N logprobs
  };
  // `device`: the sampler that draws device picks (null: host picks only).
  RequestDraftPicker(std::vector<Target> targets, DeviceSampler* device)
      : targets_(std::move(targets)), device_(device) {
    greedy_params_.temperature = 0.0f;
    greedy_params_.logprobs = 0;
  }

  int32_t pick(size_t seq, int32_t index, const float* logits, int64_t vocab) override {
    DI_CHECK(seq < targets_.size(), "draft picker: sequence ", seq, " of ", targets_.size());
    Target& t = targets_[seq];
    DI_CHECK(int32_t(t.drafts->size()) == index, "draft picker: draft ", index, " asked after ", t.drafts->size());
    int32_t tok;
    if (!t.sampled) {
      tok = int32_t(std::max_element(logits, logits + vocab) - logits);
      t.q->emplace_back();
    } else {
      SamplingRow r = t.base;
      r.logits = logits;
      r.position = t.base.position + index;
      std::vector<int32_t> history = *t.base.output_ids;
      history.insert(history.end(), t.drafts->begin(), t.drafts->end());
      r.output_ids = &history;
      const std::vector<double> p = processed_probs(r, vocab);
      std::vector<float> q(p.begin(), p.end());
      bool any = false;
      for (float x : q) any = any || x > 0;
      if (!any) q.assign(size_t(vocab), 0.f), q[size_t(std::max<int64_t>(r.eos_token_id, 0))] = 1.f;
      tok = draw_weighted(q, philox_uniform(r.seed, r.sample_index, r.position, DrawStream::kSpecDraft));
      t.q->push_back(std::move(q));
    }
    t.drafts->push_back(tok);
    t.q_rows->push_back(-1);
    return tok;
  }
  // Greedy targets draft the argmax: a device drafter may pick it there (no logits copy); the
  // runner then takes the proposal as one-hot drafts (propose_drafts).
  bool greedy(size_t seq) const override { return seq < targets_.size() && !targets_[seq].sampled; }
  bool device_picks() const override { return device_ != nullptr; }

  // pick()'s rule on the device: a sampled target's row is a kDraft row (its processed q written
  // to its pool row, the draw over q with the kSpecDraft stream), a greedy one's the raw argmax.
  void pick_on_device(const model::DeviceLogits& logits, std::span<const size_t> seqs, int32_t* tokens,
                      float* logprobs) override {
    DI_CHECK(device_, "draft picker: device picks without a device sampler");
    std::vector<SamplingRow> rows;
    std::vector<SpecRow> spec;
    std::deque<std::vector<int32_t>> histories;
    for (size_t seq : seqs) {
      DI_CHECK(seq < targets_.size(), "draft picker: sequence ", seq, " of ", targets_.size());
      const Target& t = targets_[seq];
      const int64_t index = int64_t(t.drafts->size());
      SamplingRow r = t.base;
      r.position = t.base.position + index;
      r.allowed_mask = nullptr;
      if (t.sampled) {
        std::vector<int32_t>& h = histories.emplace_back(*t.base.output_ids);
        h.insert(h.end(), t.drafts->begin(), t.drafts->end());
        r.output_ids = &h;
        r.params = &t.device_params;
        spec.push_back({SpecRow::kDraft, -1, t.pool_base + index, device_});
      } else {
        r.params = &greedy_params_;
        spec.push_back({});
      }
      rows.push_back(r);
    }
    device_->enqueue(logits, rows, spec);
    const std::vector<SampleResult> res = device_->wait();
    for (size_t j = 0; j < seqs.size(); ++j) {
      Target& t = targets_[seqs[j]];
      tokens[j] = res[j].token;
      logprobs[j] = res[j].logprobs.logprob;
      t.q_rows->push_back(spec[j].mode == SpecRow::kDraft ? spec[j].q_row : -1);
      t.q->emplace_back();
      t.drafts->push_back(res[j].token);
    }
  }

 private:
  std::vector<Target> targets_;
  DeviceSampler* device_ = nullptr;
  SamplingParams greedy_params_;
};
}  // namespace

ModelRunner::ModelRunner(model::CausalLM& model, const RunnerOptions& options) : model_(model), options_(options) {
  if (options.device_sampling && model_.supports_device_logits())
    device_sampler_ = DeviceSampler::create(model_.vocab_size());  // null without the CUDA backend
  if (options.num_speculative_tokens > 0) {
    drafter_ = model_.drafter();
    if (device_sampler_ && options.sampled_drafts && options.device_draft_sampling)
      draft_sampler_ = DeviceSampler::create(model_.vocab_size());
    DI_CHECK(drafter_, model_.describe(), ": ", options.num_speculative_tokens, " speculative tokens without a drafter");
    DI_CHECK(model_.max_rollback() >= options.num_speculative_tokens, model_.describe(), " rolls back ",
             model_.max_rollback(), " positions, fewer than ", options.num_speculative_tokens, " drafts");
  }
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::apply_state_changes(const SchedulerOutput& out) {
  for (int64_t id : out.finished_seq_ids) seqs_.erase(id);
  for (int64_t id : out.preempted_seq_ids) seqs_.erase(id);
  for (const NewSeqData& d : out.new_seqs) {
    SeqState s;
    s.prompt_ids = d.prompt_ids;
    s.output_ids = d.output_ids;
    s.params = d.params;
    s.seed = d.seed;
    s.sample_index = d.sample_index;
    s.eos_token_id = d.eos_token_id;
    s.slot = d.cache_slot;
    s.block_table = d.block_ids;
    s.num_computed = d.num_computed_tokens;
    // A fresh slot may hold another sequence's window and partials: clear them, or load the
    // state a prefix hit starts from.
    if (d.restore) {
      DI_CHECK(d.restore->num_tokens == d.num_computed_tokens, "seq ", d.seq_id, " restores a checkpoint at ",
               d.restore->num_tokens, " positions but starts at ", d.num_computed_tokens);
      model_.restore_slot(d.cache_slot, *d.restore);
      stats_.restores++;
    } else {
      model_.reset_slot(d.cache_slot);
    }
    seqs_[d.seq_id] = std::move(s);
  }
  for (const CachedSeqData& c : out.cached_seqs) {
    SeqState& s = seqs_.at(c.seq_id);
    DI_CHECK(c.num_kept_blocks >= 0 && size_t(c.num_kept_blocks) <= s.block_table.size(), "seq ", c.seq_id, " keeps ",
             c.num_kept_blocks, " of its ", s.block_table.size(), " blocks");
    s.block_table.resize(size_t(c.num_kept_blocks));
    s.block_table.insert(s.block_table.end(), c.new_block_ids.begin(), c.new_block_ids.end());
    DI_CHECK(s.num_computed == c.num_computed_tokens, "runner and scheduler disagree on seq ", c.seq_id,
             ": ", s.num_computed, " vs ", c.num_computed_tokens);
  }
}

int32_t ModelRunner::input_token(const SeqState& s, int64_t p, model::ForwardBatch& b, int64_t i) const {
  if (p < s.known_tokens()) return s.token_at(p);
  // The token the previous (launched, sampled, not yet collected) step draws for it.
  DI_CHECK(s.pending_samples == 1 && p == s.known_tokens() && !steps_.empty() &&
               steps_.back().out->step_id == s.pending_step && steps_.back().sampled,
           "input position ", p, " of a sequence with ", s.known_tokens(), " known tokens: its step ", s.pending_step,
           " was not sampled");
  const Step& prev = steps_.back();
  if (!prev.on_device) return prev.drawn[size_t(s.pending_row)].token;
  b.device_inputs.push_back({int32_t(i), int32_t(s.pending_row)});
  return 0;
}

model::ForwardBatch ModelRunner::build_batch(const SchedulerOutput& out, Step& step) {
  model::ForwardBatch b;
  b.token_ids.reserve(size_t(out.total_num_tokens));
  for (const ScheduledSeq& sch : out.scheduled) {
    SeqState& s = seqs_.at(sch.seq_id);
    const int64_t start = int64_t(b.token_ids.size()), np = int64_t(s.prompt_ids->size());
    const int64_t num_drafts = int64_t(sch.draft_tokens.size()), committed = sch.num_tokens - num_drafts;
    DI_CHECK(committed > 0 && s.num_computed + committed <= s.num_tokens(), "seq ", sch.seq_id, " scheduled past its tokens");
    DI_CHECK(num_drafts == 0 || (sch.samples && s.num_computed + committed == s.num_tokens()), "seq ", sch.seq_id,
             ": drafts scheduled on a chunk that does not sample");
    DI_CHECK(!sch.samples || s.num_computed + committed == s.num_tokens(), "seq ", sch.seq_id,
             " samples before its last token");
    for (int64_t p = s.num_computed; p < s.num_computed + committed; ++p)
      b.token_ids.push_back(input_token(s, p, b, int64_t(b.token_ids.size())));
    b.token_ids.insert(b.token_ids.end(), sch.draft_tokens.begin(), sch.draft_tokens.end());
    // Bounded replay: the later layers run over the prompt's last replay_keep() positions only,
    // unless prompt logprobs need every position's logits (full prefill then).
    const int64_t keep = model_.replay_keep();
    const int64_t decoder_from = keep > 0 && !s.params->prompt_logprobs ? std::max<int64_t>(0, np - keep) : 0;
    b.seqs.push_back({s.slot, s.block_table, s.num_computed, sch.num_tokens, decoder_from});
    // Logits at position p give the logprob of prompt token p+1.
    if (s.params->prompt_logprobs) {
      int64_t lo = s.num_computed, hi = std::min(s.num_computed + committed, np - 1);
      if (hi > lo) {
        step.prompt_rows.push_back({sch.seq_id, lo + 1, int64_t(b.logits_indices.size()), hi - lo});
        for (int64_t p = lo; p < hi; ++p) b.logits_indices.push_back(int32_t(start + p - s.num_computed));
      }
    }
    SeqSlice slice{&sch, start, s.num_computed, -1};
    if (sch.samples) {
      slice.first_sample = int64_t(step.sample_logits_rows.size());
      for (int64_t i = 0; i <= num_drafts; ++i) {
        step.sample_logits_rows.push_back(int64_t(b.logits_indices.size()));
        b.logits_indices.push_back(int32_t(start + committed - 1 + i));
      }
      s.pending_samples++;
      s.pending_step = out.step_id;
      s.pending_row = slice.first_sample;
    }
    s.num_computed += sch.num_tokens;  // rejected drafts are rolled back when collected
    step.slices.push_back(slice);
  }
  if (drafter_ && out.feeds_drafter) {  // the drafter reads the final streams of every position the step commits
    b.hidden_indices.resize(b.token_ids.size());
    for (size_t i = 0; i < b.token_ids.size(); ++i) b.hidden_indices[i] = int32_t(i);
  }
  if (!b.device_inputs.empty()) b.sampled_ids = device_sampler_->device_tokens();
  return b;
}

ModelRunner::SampleSet ModelRunner::sampling_rows(const SchedulerOutput& out, std::vector<SeqSlice>& slices,
                                                  const std::vector<int64_t>& sample_logits_rows) const {
  std::unordered_map<int64_t, const SeqGrammarMasks*> masks;
  for (const SeqGrammarMasks& m : out.grammar_masks) masks[m.seq_id] = &m;
  SampleSet set;
  set.logits_rows = sample_logits_rows;
  for (const SeqSlice& slice : slices) {
    if (slice.first_sample < 0) continue;
    const ScheduledSeq& sch = *slice.sched;
    const SeqState& s = seqs_.at(sch.seq_id);
    auto m = masks.find(sch.seq_id);
    const SeqGrammarMasks* gm = m == masks.end() ? nullptr : m->second;
    DI_CHECK(!gm || int32_t(gm->rows.size()) == sch.num_sample_rows(), "seq ", sch.seq_id, " has ",
             gm ? gm->rows.size() : 0, " grammar masks for ", sch.num_sample_rows(), " sampling rows");
    for (int32_t i = 0; i < sch.num_sample_rows(); ++i) {
      SamplingRow r;
      r.params = s.params.get();
      r.seed = s.seed;
      r.sample_index = s.sample_index;
      r.position = s.known_tokens() + i;  // absolute position of the token being drawn
      r.prompt_ids = s.prompt_ids.get();
      r.output_ids = &s.output_ids;
      if (i > 0) {  // as if drafts[0, i) were committed: penalties and min_tokens see them
        std::vector<int32_t>& h = set.histories.emplace_back(s.output_ids);
        h.insert(h.end(), sch.draft_tokens.begin(), sch.draft_tokens.begin() + i);
        r.output_ids = &h;
      }
      r.allowed_mask = gm ? &gm->rows[size_t(i)] : nullptr;
      r.eos_token_id = s.eos_token_id;
      set.rows.push_back(r);
    }
  }
  DI_CHECK(set.rows.size() == set.logits_rows.size(), "sampling rows and logits rows disagree");
  return set;
}

void ModelRunner::sample_on_host(Step& step) {
  // [rows, vocab] f32 host, kept with the step until it is collected: commit() reads the rows
  // again (rejection sampling, resampled logprobs).
  const Tensor& logits = step.forward.logits;
  const int64_t vocab = model_.vocab_size();
  DI_CHECK(logits.dim() == 2 && logits.size(0) == step.num_logits_rows && logits.size(1) == vocab &&
               logits.dtype() == DType::kF32 && logits.is_contiguous(),
           "model returned logits ", logits.str(), " for ", step.num_logits_rows, " rows");
  const float* L = logits.data<float>();
  SampleSet& set = step.set;
  for (size_t k = 0; k < set.rows.size(); ++k) set.rows[k].logits = L + set.logits_rows[k] * vocab;
  step.drawn = engine::sample_rows(set.rows, vocab);
  for (const PromptRows& pr : step.prompt_rows) {
    const SeqState& s = seqs_.at(pr.seq_id);
    PromptLogprobsChunk c{pr.seq_id, pr.first_position, std::vector<TokenLogprobs>(size_t(pr.num_rows))};
    parallel_for(0, pr.num_rows, [&](int64_t j) {
      c.entries[size_t(j)] = compute_logprobs(L + (pr.first_row + j) * vocab, vocab,
                                              s.token_at(pr.first_position + j), *s.params->prompt_logprobs);
    });
    step.result.prompt_logprobs.push_back(std::move(c));
  }
  stats_.host_steps++;
}

bool ModelRunner::has_sampled_drafts(const ScheduledSeq& sch) const {
  if (sch.draft_tokens.empty()) return false;
  const SeqState& s = seqs_.at(sch.seq_id);
  for (size_t i = 0; i < sch.draft_tokens.size() && i < s.pending_q.size(); ++i)
    if (!s.pending_q[i].empty()) return true;
  for (size_t i = 0; i < sch.draft_tokens.size() && i < s.pending_q_row.size(); ++i)
    if (s.pending_q_row[i] >= 0) return true;
  return false;
}

bool ModelRunner::drafts_on_device(const ScheduledSeq& sch) const {
  if (!draft_sampler_ || sch.draft_tokens.empty()) return false;
  const SeqState& s = seqs_.at(sch.seq_id);
  const size_t L = sch.draft_tokens.size();
  if (s.pending_q_row.size() < L || s.pending_q.size() < L) return false;
  bool any = false;
  for (size_t i = 0; i < L; ++i) {
    if (!s.pending_q[i].empty()) return false;  // a host q: the host verifies
    any = any || s.pending_q_row[i] >= 0;
  }
  return any;
}

void ModelRunner::download_draft_q(const ScheduledSeq& sch) {
  SeqState& s = seqs_.at(sch.seq_id);
  const int64_t V = model_.vocab_size();
  for (size_t i = 0; i < sch.draft_tokens.size() && i < s.pending_q_row.size(); ++i) {
    if (s.pending_q_row[i] < 0) continue;
    s.pending_q[i].resize(size_t(V));
    draft_sampler_->copy_draft_row(s.pending_q_row[i], s.pending_q[i].data(), nullptr);
    s.pending_q_row[i] = -1;
  }
}

std::vector<SpecRow> ModelRunner::verify_rows(const std::vector<SeqSlice>& slices, size_t rows) const {
  std::vector<SpecRow> spec;
  for (const SeqSlice& slice : slices) {
    if (slice.first_sample < 0 || !drafts_on_device(*slice.sched)) continue;
    const SeqState& s = seqs_.at(slice.sched->seq_id);
    if (spec.empty()) spec.resize(rows);
    for (size_t i = 0; i < slice.sched->draft_tokens.size(); ++i)
      if (s.pending_q_row[i] >= 0)
        spec[size_t(slice.first_sample) + i] = {SpecRow::kVerify, slice.sched->draft_tokens[i], s.pending_q_row[i],
                                                draft_sampler_.get()};
  }
  return spec;
}

void ModelRunner::commit(const std::vector<SeqSlice>& slices, const SampleSet& set, std::vector<SampleResult>& drawn,
                         ModelRunnerOutput& result) {
  DI_CHECK(drawn.size() == set.rows.size(), "sampler returned ", drawn.size(), " results for ", set.rows.size(), " rows");
  const int64_t vocab = model_.vocab_size();
  // Rejection sampling reads each verified row's processed distribution (a few [vocab] passes per
  // row on the host): the sequences with sampled drafts are verified in parallel first (each reads
  // only its own rows and state), then committed in order below.
  std::vector<std::optional<VerifyResult>> early(slices.size());
  std::vector<size_t> heavy;
  for (size_t k = 0; k < slices.size(); ++k) {
    const ScheduledSeq& sch = *slices[k].sched;
    if (slices[k].first_sample < 0 || !seqs_.count(sch.seq_id) || !has_sampled_drafts(sch)) continue;
    const SeqState& s = seqs_.at(sch.seq_id);
    const size_t L = sch.draft_tokens.size();
    const SamplingRow* rows = set.rows.data() + slices[k].first_sample;
    bool ok = L <= s.pending_drafts.size() && s.pending_q.size() >= L &&
              std::equal(sch.draft_tokens.begin(), sch.draft_tokens.end(), s.pending_drafts.begin());
    for (int32_t i = 0; ok && i < sch.num_sample_rows(); ++i) ok = rows[i].logits != nullptr;
    if (ok) heavy.push_back(k);  // anything odd: the serial path below checks it and says what
  }
  if (heavy.size() > 1) {
    parallel_for(0, int64_t(heavy.size()), [&](int64_t h) {
      const size_t k = heavy[size_t(h)];
      const ScheduledSeq& sch = *slices[k].sched;
      const SeqState& s = seqs_.at(sch.seq_id);
      std::vector<int32_t> d;
      for (int32_t i = 0; i < sch.num_sample_rows(); ++i) d.push_back(drawn[size_t(slices[k].first_sample + i)].token);
      const SamplingRow* rows = set.rows.data() + slices[k].first_sample;
      const TargetProbs p = [&](int32_t i) { return processed_probs(rows[i], vocab); };
      try {
        early[k] = verify_drafts(sch.draft_tokens, d,
                                 std::span<const std::vector<float>>(s.pending_q.data(), sch.draft_tokens.size()), p,
                                 {s.seed, s.sample_index, s.known_tokens()});
      } catch (...) {
        early[k].reset();  // verified again below, where the error surfaces
      }
    });
  }
  std::vector<int32_t> draws;
  for (size_t k = 0; k < slices.size(); ++k) {
    const SeqSlice& slice = slices[k];
    const ScheduledSeq& sch = *slice.sched;
    auto it = seqs_.find(sch.seq_id);
    if (it == seqs_.end()) continue;  // dropped after this step was launched: nothing to report
    SeqState& s = it->second;
    if (slice.first_sample < 0) continue;
    DI_CHECK(s.pending_samples >= 1, "seq ", sch.seq_id, " collects a draw with none pending");
    if (--s.pending_samples == 0) s.pending_step = s.pending_row = -1;
    draws.clear();
    for (int32_t i = 0; i < sch.num_sample_rows(); ++i) draws.push_back(drawn[size_t(slice.first_sample + i)].token);
    const size_t L = sch.draft_tokens.size();
    std::span<const std::vector<float>> q;
    if (L > 0) {
      DI_CHECK(L <= s.pending_drafts.size() && std::equal(sch.draft_tokens.begin(), sch.draft_tokens.end(),
                                                          s.pending_drafts.begin()),
               "seq ", sch.seq_id, ": scheduled drafts are not a prefix of the drafter's proposal");
      if (s.pending_q.size() >= L) q = std::span<const std::vector<float>>(s.pending_q.data(), L);
    }
    const SamplingRow* rows = set.rows.data() + slice.first_sample;
    const TargetProbs p = [&](int32_t i) {
      DI_CHECK(rows[i].logits, "seq ", sch.seq_id, ": rejection sampling without host logits");
      return processed_probs(rows[i], vocab);
    };
    // Sampled drafts whose q stayed on the device were decided there (the sampler's verify rows;
    // a host-sampled step took the q rows to the host at launch).
    bool decided = false;
    for (size_t i = 0; L > 0 && s.pending_q_row.size() >= L && i < L; ++i)
      if (s.pending_q_row[i] >= 0) {
        DI_CHECK(drawn[size_t(slice.first_sample) + i].spec_accepted != -1, "seq ", sch.seq_id, ": draft ", i,
                 " has its q on the device but no device decision");
        decided = true;
      }
    VerifyResult v;
    if (decided) {
      std::vector<int32_t> acc(L), res(L);
      for (size_t i = 0; i < L; ++i) {
        const SampleResult& d = drawn[size_t(slice.first_sample) + i];
        acc[i] = s.pending_q_row[i] >= 0 ? d.spec_accepted : -1;
        res[i] = d.spec_residual;
      }
      v = verify_decided(sch.draft_tokens, draws, acc, res);
    } else {
      v = early[k] ? std::move(*early[k])
                   : verify_drafts(sch.draft_tokens, draws, q, p, {s.seed, s.sample_index, s.known_tokens()});
    }
    SampledSeq out{sch.seq_id, v.tokens, {}, int32_t(L)};
    if (s.params->logprobs)
      for (size_t j = 0; j < v.tokens.size(); ++j) {
        SampleResult& d = drawn[size_t(slice.first_sample) + j];
        if (d.token == v.tokens[j]) {
          out.logprobs.push_back(std::move(d.logprobs));
        } else if (decided && d.spec_accepted >= 0 && d.spec_residual == v.tokens[j]) {
          // Decided on the device: the accepted draft or the residual draw, its logprob from there.
          TokenLogprobs lp = std::move(d.logprobs);
          lp.token = d.spec_residual;
          lp.logprob = d.spec_residual_logprob;
          lp.rank = d.spec_residual_rank;
          out.logprobs.push_back(std::move(lp));
        } else {  // a rejection-sampled token: logprobs of the row's raw logits for it
          DI_CHECK(rows[j].logits, "seq ", sch.seq_id, ": logprobs of a resampled token without host logits");
          out.logprobs.push_back(compute_logprobs(rows[j].logits, vocab, v.tokens[j], *s.params->logprobs));
        }
      }
    s.pending_drafts.clear();
    s.pending_q.clear();
    s.pending_q_row.clear();
    // The rejected drafts' positions leave the cache: the next step starts after the accepted run.
    const int64_t rejected = int64_t(L) - v.num_accepted;
    if (rejected > 0) {
      model_.rollback(s.slot, s.num_computed, s.num_computed - rejected);
      s.num_computed -= rejected;
      stats_.rollbacks++;
    }
    s.output_ids.insert(s.output_ids.end(), v.tokens.begin(), v.tokens.end());
    result.sampled.push_back(std::move(out));
  }
}

void ModelRunner::propose_drafts(const std::vector<SeqSlice>& slices, const model::HiddenRows& hidden,
                                 ModelRunnerOutput& result) {
  model::DraftBatch db;
  db.target_hidden = hidden;
  std::vector<RequestDraftPicker::Target> targets;
  int64_t pool_rows = 0;
  for (const SeqSlice& slice : slices) {
    SeqState& s = seqs_.at(slice.sched->seq_id);  // drafting: collected before the next launch, nothing dropped
    model::DraftSeq d;
    d.cache_slot = s.slot;
    d.block_table = s.block_table;
    d.first_position = slice.first_position;
    d.num_positions = int32_t(s.num_computed - slice.first_position);  // committed positions of this step
    for (int64_t i = 0; i < d.num_positions; ++i) d.next_tokens.push_back(s.token_at(d.first_position + i + 1));
    d.num_drafts = slice.first_sample >= 0 ? options_.num_speculative_tokens : 0;
    if (slice.sched->num_drafts_next >= 0) d.num_drafts = std::min(d.num_drafts, slice.sched->num_drafts_next);
    // The drafter writes its own rows at the positions of drafts 1.. (anchor + 1 + round); they
    // must lie inside the blocks this step holds (the next verify allocates for the drafts it
    // schedules), so at a block boundary a sequence drafts fewer.
    if (options_.block_tokens > 0) {
      const int64_t room = int64_t(s.block_table.size()) * options_.block_tokens - s.num_computed + 1;
      d.num_drafts = int32_t(std::clamp<int64_t>(room, 0, d.num_drafts));
    }
    d.first_hidden_row = slice.first_token;
    const int32_t asked = d.num_drafts;
    db.seqs.push_back(std::move(d));
    s.pending_drafts.clear();
    s.pending_q.clear();
    s.pending_q_row.clear();
    RequestDraftPicker::Target t;
    t.base = {.params = s.params.get(), .seed = s.seed, .sample_index = s.sample_index, .position = s.known_tokens(),
              .prompt_ids = s.prompt_ids.get(), .output_ids = &s.output_ids, .eos_token_id = s.eos_token_id};
    t.sampled = options_.sampled_drafts && !s.params->greedy() && !s.params->structured_outputs;
    t.drafts = &s.pending_drafts;
    t.q = &s.pending_q;
    t.q_rows = &s.pending_q_row;
    if (draft_sampler_ && t.sampled) {
      // Each sequence's q rows are its slot's (stable until its next proposal, whatever is
      // scheduled meanwhile).
      t.pool_base = int64_t(s.slot) * options_.num_speculative_tokens;
      pool_rows = std::max(pool_rows, t.pool_base + std::max(asked, 0));
      t.device_params = *s.params;
      t.device_params.logprobs = 0;
    }
    targets.push_back(std::move(t));
  }
  DI_CHECK(hidden.rows == last_batch_.num_tokens(), "model returned ", hidden.rows, " hidden rows for ",
           last_batch_.num_tokens(), " asked");
  // Growing the pool keeps its rows (nothing queued reads it: the last verify step was collected).
  if (pool_rows > 0) draft_sampler_->reserve_draft_pool(pool_rows, hidden.device_index);
  RequestDraftPicker picker(std::move(targets), draft_sampler_.get());
  db.picker = &picker;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<model::DraftProposal> proposals = drafter_->propose(db);
  stats_.draft_time_s += seconds_since(t0);
  stats_.draft_calls++;
  DI_CHECK(proposals.size() == db.seqs.size(), drafter_->describe(), " returned ", proposals.size(), " proposals for ",
           db.seqs.size(), " sequences");
  const int64_t vocab = model_.vocab_size();
  for (size_t i = 0; i < slices.size(); ++i) {
    const std::vector<int32_t>& t = proposals[i].tokens;
    SeqState& s = seqs_.at(slices[i].sched->seq_id);
    DI_CHECK(int32_t(t.size()) <= db.seqs[i].num_drafts, drafter_->describe(), " proposed ", t.size(), " drafts, ",
             db.seqs[i].num_drafts, " asked");
    for (int32_t tok : t) DI_CHECK(tok >= 0 && tok < vocab, drafter_->describe(), " proposed token ", tok);
    // A drafter that ignores the picker drafts greedily: its drafts count as one-hot.
    if (s.pending_drafts != t || s.pending_q.size() != t.size() || s.pending_q_row.size() != t.size()) {
      s.pending_drafts = t;
      s.pending_q.assign(t.size(), {});
      s.pending_q_row.assign(t.size(), -1);
    }
    if (t.empty()) continue;
    // What varlen reads as each draft's acceptance estimate (log): the drafter's confidence when it
    // has one (V4.1 DSpark: sigma(c_i)), else its raw probability of the draft (V4 MTP).
    std::vector<float> estimate = proposals[i].logprobs;
    if (proposals[i].confidence.size() == t.size())
      for (size_t j = 0; j < t.size(); ++j) estimate[j] = std::log(std::max(proposals[i].confidence[j], 1e-30f));
    result.drafts.push_back({slices[i].sched->seq_id, t, std::move(estimate)});
  }
}

void ModelRunner::copy_host_tier(const SchedulerOutput& out) {
  if (out.block_spills.empty() && out.block_loads.empty()) return;
  const size_t bb = model_.paged_block_bytes();
  DI_CHECK(bb > 0 && options_.host_blocks > 0, model_.describe(), ": host-tier copies without a host tier");
  if (!host_pool_) host_pool_ = model_.allocate_host_memory(bb * size_t(options_.host_blocks));
  auto copies = [&](const std::vector<BlockCopy>& v) {
    std::vector<model::HostBlockCopy> c;
    for (const BlockCopy& b : v) {
      DI_CHECK(b.host_slot >= 0 && b.host_slot < options_.host_blocks, "host slot ", b.host_slot, " of ",
               options_.host_blocks);
      c.push_back({b.block, host_pool_.get() + size_t(b.host_slot) * bb});
    }
    return c;
  };
  if (!out.block_spills.empty()) model_.copy_blocks_to_host(copies(out.block_spills));
  if (!out.block_loads.empty()) model_.copy_blocks_from_host(copies(out.block_loads));
  stats_.blocks_to_host += int64_t(out.block_spills.size());
  stats_.blocks_from_host += int64_t(out.block_loads.size());
}

ModelRunner::Step& ModelRunner::find_step(const SchedulerOutput& out) {
  for (Step& st : steps_)
    if (st.out == &out) return st;
  DI_THROW(InternalError, "model runner: step ", out.step_id, " was not launched");
}

void ModelRunner::launch(const SchedulerOutput& out) {
  DI_CHECK(steps_.size() < 2 && (steps_.empty() || steps_.back().sampled), "model runner: step ", out.step_id,
           " launched with ", steps_.size(), " steps not collected (the last one sampled: ",
           !steps_.empty() && steps_.back().sampled, ")");
  // A plain step (no drafter) may overlap the next one, as without drafting.
  DI_CHECK(!drafter_ || steps_.empty() || !steps_.back().out->feeds_drafter, "model runner: step ", out.step_id,
           " launched while a drafting step is in flight (a drafting step is collected before the next is launched)");
  if (!steps_.empty() && !steps_.back().checkpoints_saved) {
    // The step in flight's slot checkpoints, before this step changes or writes any slot.
    Step& prev = steps_.back();
    save_checkpoints(*prev.out, prev, prev.result);
    prev.checkpoints_saved = true;
  }
  // Before anything of this step writes the blocks. A step in flight uses neither kind: spilled
  // blocks were free, loaded ones are fresh (and the copies are ordered after it on the device).
  copy_host_tier(out);
  apply_state_changes(out);
  stats_.overlapped_launches += steps_.empty() ? 0 : 1;
  Step step;
  step.out = &out;
  step.launched_at = std::chrono::steady_clock::now();
  if (out.empty()) {
    // Expert-parallel peers wait for this rank's all-to-alls: an empty forward joins them.
    if (model_.joins_collectives()) model_.run(model::ForwardBatch{}, {});
  } else {
    model::ForwardBatch batch = build_batch(out, step);
    bool on_device = device_sampler_ && step.prompt_rows.empty();
    for (const ScheduledSeq& sch : out.scheduled) {
      on_device = on_device && (!sch.samples || device_sampler_->supports(*seqs_.at(sch.seq_id).params));
      step.verifies = step.verifies || !sch.draft_tokens.empty();
      // Rejection sampling reads host probabilities, unless q stayed on the device (draft pool).
      on_device = on_device && (!has_sampled_drafts(sch) || drafts_on_device(sch));
    }
    if (!on_device && draft_sampler_)
      for (const ScheduledSeq& sch : out.scheduled) download_draft_q(sch);
    // A host-sampled step (prompt logprobs, drafts to reject, params the device sampler lacks)
    // may still take its inputs from the previous device-sampled step: the gather runs on the
    // device before this forward, and the host sampling of this step runs after the previous
    // step is collected (sample()), so its history is complete.
    step.on_device = on_device;
    step.num_logits_rows = int64_t(batch.logits_indices.size());
    step.forward = model_.run(batch, {.logits_on_device = on_device, .hidden_to_host = !on_device});
    last_batch_ = std::move(batch);
  }
  steps_.push_back(std::move(step));
}

void ModelRunner::sample(const SchedulerOutput& out) {
  Step& step = find_step(out);
  DI_CHECK(!step.sampled && &step == &steps_.back(), "model runner: step ", out.step_id, " sampled twice or out of order");
  DI_CHECK(steps_.size() == 1, "model runner: step ", out.step_id, " sampled before the previous step was collected");
  step.sampled = true;
  if (out.empty()) return;
  step.set = sampling_rows(out, step.slices, step.sample_logits_rows);
  if (!step.on_device) {
    sample_on_host(step);
    model_.mark_step_end();
    return;
  }
  const model::DeviceLogits& logits = step.forward.device_logits;
  DI_CHECK(logits.rows == int64_t(step.set.rows.size()) && (step.set.rows.empty() || logits.data) &&
               logits.row_stride >= model_.vocab_size(),
           "model returned device logits of ", logits.rows, " rows (stride ", logits.row_stride, ") for ",
           step.set.rows.size(), " rows");
  device_sampler_->enqueue(logits, step.set.rows, verify_rows(step.slices, step.set.rows.size()));
  model_.mark_step_end();
  stats_.device_steps++;
}

ModelRunnerOutput ModelRunner::collect(const SchedulerOutput& out) {
  DI_CHECK(!steps_.empty() && steps_.front().out == &out && steps_.front().sampled, "model runner: step ", out.step_id,
           " collected out of order or before it was sampled");
  Step step = std::move(steps_.front());
  steps_.pop_front();
  ModelRunnerOutput result = std::move(step.result);
  result.step_id = out.step_id;
  if (out.empty()) return result;
  if (step.on_device) step.drawn = device_sampler_->wait();
  take_checkpoints(step, result);  // queued at the next launch, after these draws on the stream
  commit(step.slices, step.set, step.drawn, result);
  if (step.verifies) {
    stats_.verify_steps++;
    stats_.verify_time_s += seconds_since(step.launched_at);
  }
  if (drafter_ && out.feeds_drafter) propose_drafts(step.slices, step.forward.hidden, result);
  if (!step.checkpoints_saved) {
    save_checkpoints(out, step, result);
    take_checkpoints(step, result);
  }
  return result;
}

ModelRunnerOutput ModelRunner::execute(const SchedulerOutput& out) {
  launch(out);
  sample(out);
  return collect(out);
}

// After the step (and its drafting, whose ring writes count against the rollback slack).
void ModelRunner::save_checkpoints(const SchedulerOutput& out, Step& step, ModelRunnerOutput& result) {
  std::vector<model::SlotSave> saves;
  for (const CheckpointRequest& c : out.checkpoints) {
    const SeqState& s = seqs_.at(c.seq_id);
    if (c.num_tokens > s.num_computed) continue;  // a boundary inside rejected drafts
    if (!model_.can_save_slot(s.slot, c.num_tokens)) {
      result.num_unsaveable_checkpoints++;
      continue;
    }
    if (options_.async_checkpoints) {
      saves.push_back({s.slot, c.num_tokens});
      step.saving.push_back(&c);
      continue;
    }
    result.checkpoints.push_back({c.key, std::make_shared<const model::SlotSnapshot>(model_.save_slot(s.slot, c.num_tokens)),
                                  c.seq_id, c.num_tokens, c.deferred});
    stats_.checkpoints_saved++;
  }
  if (!saves.empty()) step.pending_saves = model_.queue_save_slots(saves);
}

void ModelRunner::take_checkpoints(Step& step, ModelRunnerOutput& result) {
  if (!step.pending_saves) return;
  std::vector<model::SlotSnapshot> snaps = step.pending_saves->wait();
  step.pending_saves.reset();
  DI_CHECK(snaps.size() == step.saving.size(), model_.describe(), ": ", snaps.size(), " slot snapshots for ",
           step.saving.size(), " queued saves");
  for (size_t i = 0; i < snaps.size(); ++i) {
    const CheckpointRequest& c = *step.saving[i];
    result.checkpoints.push_back({c.key, std::make_shared<const model::SlotSnapshot>(std::move(snaps[i])), c.seq_id,
                                  c.num_tokens, c.deferred});
    stats_.checkpoints_saved++;
  }
  step.saving.clear();
}

}  // namespace deepinfer::engine
