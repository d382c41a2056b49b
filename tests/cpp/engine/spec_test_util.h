// Test drafters shared by the engine's speculative-decoding tests on real models
// (spec_model_test.cc: V4 default model; spec_v41_test.cc: V4.1 with DSpark).
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "model/causal_lm.h"
#include "deepinfer/sampling_params.h"
#include "model/drafter.h"

namespace deepinfer::engine::spec_test {

// Greedy decoding of exactly n tokens (EOS ignored), the requests the identity tests compare.
inline SamplingParams greedy(int n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

// A KV budget of `seqs` slots and exactly `blocks` paged blocks (forces eviction / preemption).
inline size_t cache_bytes(const model::CausalLM& m, int seqs, int blocks) {
  const kv::CacheGeometry g = m.plan_cache(size_t(1) << 32, seqs);
  return g.bytes_per_slot * size_t(seqs) + g.bytes_per_block * size_t(blocks);
}


// Forwards everything to `inner` but drafts with `drafter` (null: no drafter).
class DrafterSwap final : public model::CausalLM {
 public:
  DrafterSwap(std::unique_ptr<model::CausalLM> inner, std::unique_ptr<model::Drafter> d)
      : inner_(std::move(inner)), drafter_(std::move(d)) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_model_len() const override { return inner_->max_model_len(); }
  int64_t eos_token_id() const override { return inner_->eos_token_id(); }
  int64_t bos_token_id() const override { return inner_->bos_token_id(); }
  std::string describe() const override { return inner_->describe(); }
  kv::CacheGeometry plan_cache(size_t b, int64_t s) const override { return inner_->plan_cache(b, s); }
  void allocate_cache(const kv::CacheGeometry& g) override { inner_->allocate_cache(g); }
  void reset_slot(int32_t slot) override { inner_->reset_slot(slot); }
  model::ForwardOutput run(const model::ForwardBatch& b, const model::ForwardOptions& o) override {
    return inner_->run(b, o);
  }
  int64_t max_rollback() const override { return inner_->max_rollback(); }
  void rollback(int32_t slot, int64_t n, int64_t keep) override { inner_->rollback(slot, n, keep); }
  model::Drafter* drafter() override { return drafter_.get(); }

 private:
  std::unique_ptr<model::CausalLM> inner_;
  std::unique_ptr<model::Drafter> drafter_;
};

// Knows every request's plain greedy sequence (prompt + output); proposes, after the anchor at
// position p, pattern(p) tokens of it and then a token it is not (so exactly that many can be
// accepted). Which sequence a slot holds is found from the tokens fed to it.
class OracleDrafter final : public model::Drafter {
 public:
  OracleDrafter(std::vector<std::vector<int32_t>> sequences, int64_t vocab, std::function<int32_t(int64_t)> pattern,
                int64_t max_drafts)
      : seqs_(std::move(sequences)), vocab_(vocab), pattern_(std::move(pattern)), max_drafts_(max_drafts) {}
  std::string describe() const override { return "oracle"; }
  int64_t max_draft_tokens() const override { return max_drafts_; }
  std::vector<model::DraftProposal> propose(const model::DraftBatch& batch, Tensor*) override {
    std::vector<model::DraftProposal> out;
    for (const model::DraftSeq& s : batch.seqs) {
      std::vector<int32_t>& fed = fed_[s.cache_slot];
      if (s.first_position == 0) fed.clear();
      fed.resize(size_t(s.first_position));  // positions after a rollback were never fed
      fed.insert(fed.end(), s.next_tokens.begin(), s.next_tokens.end());  // tokens at positions 1..
      model::DraftProposal p;
      const std::vector<int32_t>* seq = find(fed);
      const int64_t anchor = s.first_position + s.num_positions;  // position of the anchor token
      const int32_t good = std::clamp<int32_t>(pattern_(anchor), 0, s.num_drafts);
      for (int32_t i = 0; i < s.num_drafts && seq; ++i) {
        const size_t pos = size_t(anchor + 1 + i);
        if (pos >= seq->size()) break;
        const int32_t right = (*seq)[pos];
        p.tokens.push_back(i < good ? right : int32_t((right + 1 + i) % vocab_));
        p.logprobs.push_back(i < good ? -0.1f : -3.f);
        if (i >= good) break;
      }
      out.push_back(std::move(p));
    }
    return out;
  }

 private:
  const std::vector<int32_t>* find(const std::vector<int32_t>& fed) const {
    for (const auto& s : seqs_)
      if (s.size() > fed.size() && std::equal(fed.begin(), fed.end(), s.begin() + 1)) return &s;
    return nullptr;
  }
  std::vector<std::vector<int32_t>> seqs_;
  int64_t vocab_;
  std::function<int32_t(int64_t)> pattern_;
  int64_t max_drafts_;
  std::map<int32_t, std::vector<int32_t>> fed_;
};

}  // namespace deepinfer::engine::spec_test
