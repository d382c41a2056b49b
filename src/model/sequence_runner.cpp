#include "model/sequence_runner.h"

#include <algorithm>
#include <random>

#include "core/check.h"

namespace deepinfer::model {

std::vector<int32_t> slot_block_table(const kv::CacheGeometry& g, int32_t slot) {
  const int64_t per_slot = g.num_slots ? g.num_blocks / g.num_slots : 0;
  std::vector<int32_t> table;
  for (int64_t b = 0; b < per_slot; ++b) table.push_back(int32_t(slot * per_slot + b));
  return table;
}

Tensor run_sequence(CausalLM& model, const kv::CacheGeometry& geometry, const std::vector<int32_t>& ids,
                    const std::vector<int64_t>& chunks, int32_t slot, Tensor* hidden, const ChunkHook& after_chunk) {
  const int64_t T = int64_t(ids.size()), V = model.vocab_size();
  int64_t sum = 0;
  for (int64_t c : chunks) {
    if (c <= 0) DI_THROW(InvalidArgument, "run_sequence: chunk sizes must be positive, got ", c);
    sum += c;
  }
  if (sum != T) DI_THROW(InvalidArgument, "run_sequence: chunks sum to ", sum, " but there are ", T, " tokens");
  model.reset_slot(slot);
  SeqInBatch seq;
  seq.cache_slot = slot;
  seq.block_table = slot_block_table(geometry, slot);
  Tensor out = Tensor::empty({T, V}, DType::kF32);
  int64_t done = 0;
  for (int64_t c : chunks) {
    ForwardBatch b;
    b.token_ids.assign(ids.begin() + done, ids.begin() + done + c);
    seq.num_computed_tokens = done;
    seq.num_new_tokens = int32_t(c);
    b.seqs = {seq};
    for (int64_t i = 0; i < c; ++i) b.logits_indices.push_back(int32_t(i));
    if (hidden) b.hidden_indices = b.logits_indices;
    ForwardOutput o = model.run(b, {});
    const Tensor& l = o.logits;
    std::copy_n(l.data<float>(), c * V, out.data<float>() + done * V);
    if (hidden) {
      DI_CHECK(o.hidden.host.defined() && o.hidden.rows == c, "run_sequence: the model returned no hidden rows");
      const int64_t e = o.hidden.row_elems;
      if (!hidden->defined()) *hidden = Tensor::empty({T, e}, DType::kF32);
      std::copy_n(o.hidden.host.data<float>(), c * e, hidden->data<float>() + done * e);
    }
    if (after_chunk) after_chunk(done, c);
    done += c;
  }
  return out;
}

std::vector<int32_t> greedy_continuation(CausalLM& model, const kv::CacheGeometry& geometry,
                                         const std::vector<int32_t>& prompt, size_t n, int32_t slot) {
  if (prompt.empty()) DI_THROW(InvalidArgument, "greedy_continuation: empty prompt");
  const int64_t V = model.vocab_size();
  model.reset_slot(slot);
  SeqInBatch s;
  s.cache_slot = slot;
  s.block_table = slot_block_table(geometry, slot);
  std::vector<int32_t> toks = prompt, out;
  int64_t done = 0;
  while (out.size() < n) {
    ForwardBatch b;
    b.token_ids.assign(toks.begin() + done, toks.end());
    s.num_computed_tokens = done;
    s.num_new_tokens = int32_t(b.token_ids.size());
    b.seqs = {s};
    b.logits_indices = {int32_t(b.token_ids.size() - 1)};
    Tensor l = model.forward(b);
    done = int64_t(toks.size());
    const float* p = l.data<float>();
    out.push_back(int32_t(std::max_element(p, p + V) - p));
    toks.push_back(out.back());
  }
  return out;
}

void run_interleaved(CausalLM& model, std::vector<InterleavedSequence>& seqs, uint32_t seed, int64_t max_chunk) {
  const int64_t V = model.vocab_size();
  std::vector<int64_t> done(seqs.size(), 0);
  for (auto& s : seqs) {
    s.logits.assign(s.ids.size() * size_t(V), 0.f);
    model.reset_slot(s.seq.cache_slot);
  }
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, max_chunk);
  for (bool busy = true; busy;) {
    ForwardBatch b;
    std::vector<std::pair<size_t, int64_t>> rows;  // (sequence, position) of each logits row
    busy = false;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = std::min(int64_t(seqs[i].ids.size()) - done[i], dist(gen));
      if (n == 0) continue;
      SeqInBatch s = seqs[i].seq;
      s.num_computed_tokens = done[i];
      s.num_new_tokens = int32_t(n);
      for (int64_t j = 0; j < n; ++j) {
        b.logits_indices.push_back(int32_t(b.token_ids.size()));
        b.token_ids.push_back(seqs[i].ids[size_t(done[i] + j)]);
        rows.push_back({i, done[i] + j});
      }
      b.seqs.push_back(s);
      done[i] += n;
    }
    for (size_t i = 0; i < seqs.size(); ++i) busy |= done[i] < int64_t(seqs[i].ids.size());
    if (b.token_ids.empty()) continue;
    Tensor l = model.forward(b);
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(l.data<float>() + r * V, V, seqs[rows[r].first].logits.data() + rows[r].second * V);
  }
}

}  // namespace deepinfer::model
