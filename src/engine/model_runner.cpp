#include "engine/model_runner.h"

#include <algorithm>

#include "core/check.h"
#include "core/parallel.h"
#include "engine/sampler.h"

namespace deepinfer::engine {

ModelRunner::ModelRunner(model::CausalLM& model, const RunnerOptions& options) : model_(model) {
  if (options.device_sampling && model_.supports_device_logits())
    device_sampler_ = DeviceSampler::create(model_.vocab_size());  // null without the CUDA backend
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
    // A fresh slot may hold another sequence's window and partials: clear them.
    model_.reset_slot(d.cache_slot);
    seqs_[d.seq_id] = std::move(s);
  }
  for (const CachedSeqData& c : out.cached_seqs) {
    SeqState& s = seqs_.at(c.seq_id);
    s.block_table.insert(s.block_table.end(), c.new_block_ids.begin(), c.new_block_ids.end());
    DI_CHECK(s.num_computed == c.num_computed_tokens, "runner and scheduler disagree on seq ", c.seq_id,
             ": ", s.num_computed, " vs ", c.num_computed_tokens);
  }
}

model::ForwardBatch ModelRunner::build_batch(const SchedulerOutput& out, std::vector<int64_t>& sample_rows,
                                             std::vector<PromptRows>& prompt_rows) {
  model::ForwardBatch b;
  b.token_ids.reserve(size_t(out.total_num_tokens));
  for (const ScheduledSeq& sch : out.scheduled) {
    SeqState& s = seqs_.at(sch.seq_id);
    int64_t start = int64_t(b.token_ids.size());
    int64_t np = int64_t(s.prompt_ids->size());
    DI_CHECK(s.num_computed + sch.num_tokens <= s.num_tokens(), "seq ", sch.seq_id, " scheduled past its tokens");
    for (int64_t p = s.num_computed; p < s.num_computed + sch.num_tokens; ++p) b.token_ids.push_back(s.token_at(p));
    b.seqs.push_back({s.slot, s.block_table, s.num_computed, sch.num_tokens});
    // Logits at position p give the logprob of prompt token p+1.
    if (s.params->prompt_logprobs) {
      int64_t lo = s.num_computed, hi = std::min(s.num_computed + sch.num_tokens, np - 1);
      if (hi > lo) {
        prompt_rows.push_back({sch.seq_id, lo + 1, int64_t(b.logits_indices.size()), hi - lo});
        for (int64_t p = lo; p < hi; ++p) b.logits_indices.push_back(int32_t(start + p - s.num_computed));
      }
    }
    if (sch.samples) {
      sample_rows.push_back(int64_t(b.logits_indices.size()));
      b.logits_indices.push_back(int32_t(start + sch.num_tokens - 1));
    } else {
      sample_rows.push_back(-1);
    }
  }
  return b;
}

std::vector<SamplingRow> ModelRunner::sampling_rows(const SchedulerOutput& out, const std::vector<int64_t>& sample_rows,
                                                   std::vector<int64_t>& row_seq) const {
  std::unordered_map<int64_t, const std::vector<uint32_t>*> masks;
  for (size_t i = 0; i < out.grammar_seq_ids.size(); ++i) masks[out.grammar_seq_ids[i]] = &out.grammar_masks[i];
  std::vector<SamplingRow> rows;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (sample_rows[i] < 0) continue;
    int64_t id = out.scheduled[i].seq_id;
    const SeqState& s = seqs_.at(id);
    SamplingRow r;
    r.params = s.params.get();
    r.seed = s.seed;
    r.sample_index = s.sample_index;
    r.position = s.num_tokens();  // absolute position of the token being drawn
    r.prompt_ids = s.prompt_ids.get();
    r.output_ids = &s.output_ids;
    auto m = masks.find(id);
    r.allowed_mask = m == masks.end() ? nullptr : m->second;
    r.eos_token_id = s.eos_token_id;
    rows.push_back(r);
    row_seq.push_back(id);
  }
  return rows;
}

// Logits stay on the device; the batch has sampling rows only, in row order (no prompt rows).
std::vector<SampleResult> ModelRunner::sample_on_device(const model::ForwardBatch& batch,
                                                        std::span<const SamplingRow> rows) {
  DI_CHECK(batch.logits_indices.size() == rows.size(), "device sampling with ", batch.logits_indices.size(),
           " logits rows for ", rows.size(), " samples");
  const model::DeviceLogits logits = model_.forward_device(batch);
  DI_CHECK(logits.rows == int64_t(rows.size()) && (rows.empty() || logits.data) &&
               logits.row_stride >= model_.vocab_size(),
           "model returned device logits of ", logits.rows, " rows (stride ", logits.row_stride, ") for ", rows.size(),
           " rows");
  stats_.device_steps++;
  return device_sampler_->sample(logits, rows);
}

std::vector<SampleResult> ModelRunner::sample_on_host(const model::ForwardBatch& batch, std::vector<SamplingRow>& rows,
                                                      const std::vector<int64_t>& sample_rows,
                                                      const std::vector<PromptRows>& prompt_rows,
                                                      ModelRunnerOutput& result) {
  Tensor logits = model_.forward(batch);  // [rows, vocab] f32 host
  const int64_t vocab = model_.vocab_size();
  DI_CHECK(logits.dim() == 2 && logits.size(0) == int64_t(batch.logits_indices.size()) && logits.size(1) == vocab &&
               logits.dtype() == DType::kF32 && logits.is_contiguous(),
           "model returned logits ", logits.str(), " for ", batch.logits_indices.size(), " rows");
  const float* L = logits.data<float>();
  size_t k = 0;
  for (int64_t row : sample_rows)
    if (row >= 0) rows[k++].logits = L + row * vocab;
  std::vector<SampleResult> drawn = engine::sample_rows(rows, vocab);
  for (const PromptRows& pr : prompt_rows) {
    const SeqState& s = seqs_.at(pr.seq_id);
    PromptLogprobsChunk c{pr.seq_id, pr.first_position, std::vector<TokenLogprobs>(size_t(pr.num_rows))};
    parallel_for(0, pr.num_rows, [&](int64_t j) {
      c.entries[size_t(j)] = compute_logprobs(L + (pr.first_row + j) * vocab, vocab,
                                              s.token_at(pr.first_position + j), *s.params->prompt_logprobs);
    });
    result.prompt_logprobs.push_back(std::move(c));
  }
  stats_.host_steps++;
  return drawn;
}

ModelRunnerOutput ModelRunner::execute(const SchedulerOutput& out) {
  apply_state_changes(out);
  ModelRunnerOutput result;
  if (out.empty()) return result;
  std::vector<int64_t> sample_rows;  // [scheduled] logits row, -1 = no sample
  std::vector<PromptRows> prompt_rows;
  model::ForwardBatch batch = build_batch(out, sample_rows, prompt_rows);
  std::vector<int64_t> row_seq;
  std::vector<SamplingRow> rows = sampling_rows(out, sample_rows, row_seq);
  bool on_device = device_sampler_ && prompt_rows.empty();
  for (const SamplingRow& r : rows) on_device = on_device && device_sampler_->supports(r);
  std::vector<SampleResult> drawn = on_device ? sample_on_device(batch, rows)
                                              : sample_on_host(batch, rows, sample_rows, prompt_rows, result);
  for (size_t i = 0; i < drawn.size(); ++i) {
    SampledToken t{row_seq[i], drawn[i].token, std::nullopt};
    if (rows[i].params->logprobs) t.logprobs = std::move(drawn[i].logprobs);
    result.sampled.push_back(std::move(t));
  }
  // Commit: advance our own copy (the scheduler does the same in update()).
  for (size_t i = 0; i < out.scheduled.size(); ++i) seqs_.at(out.scheduled[i].seq_id).num_computed += out.scheduled[i].num_tokens;
  for (const SampledToken& t : result.sampled) seqs_.at(t.seq_id).output_ids.push_back(t.token);
  last_batch_ = std::move(batch);
  return result;
}

}  // namespace deepinfer::engine
