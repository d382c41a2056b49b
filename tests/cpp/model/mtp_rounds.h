// Drives a DeepSeek model's MTP drafter the way the engine does, for backend/path comparisons:
// verify-shaped target steps of random tokens on a few slots (a prefill first), a random kept
// prefix of each rolled back, the drafter fed the kept positions and asked for L drafts (its ring
// writes rolled back after), with the draft logits recorded; then the same proposal again
// without logits (a device backend picks greedy drafts on the device then), whose drafts and
// logprobs are recorded too. Deterministic for a seed, so two models (paths, backends) can be
// compared round for round.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "model/deepseek/model.h"
#include "model/sequence_runner.h"

namespace deepinfer::testing {

struct MtpRounds {
  std::vector<float> logits;               // every proposal's draft logits, in order
  std::vector<int32_t> drafts;             // drafts of the proposals with logits
  std::vector<float> logprobs;             // their logprobs
  std::vector<int32_t> drafts_no_logits;   // the same proposals asked without logits
  std::vector<float> logprobs_no_logits;
};

// tiny_official (the fixture with an MTP block) and the bundled default model when present.
inline std::vector<std::string> mtp_fixture_dirs() {
  std::vector<std::string> dirs;
  if (std::filesystem::exists(golden_dir("tiny_official") + "/config.json")) dirs.push_back(golden_dir("tiny_official"));
  const std::filesystem::path root =
      std::filesystem::path(golden_dir("tiny")).parent_path().parent_path().parent_path().parent_path();
  if (std::filesystem::exists(root / "assets" / "default-model" / "config.json"))
    dirs.push_back((root / "assets" / "default-model").string());
  return dirs;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// `steps` target steps on `seqs` slots (cache allocated here), L drafts each; the model needs
// max_rollback() >= L + 1.
inline MtpRounds run_mtp_rounds(model::ds::DeepseekModel& m, int64_t L, int steps, int64_t seqs, uint32_t seed = 11) {
  m.allocate_cache_for(seqs, 512);
  const kv::CacheGeometry& g = m.cache_geometry();
  const int64_t V = m.vocab_size();
  std::mt19937 rng(seed);
  std::vector<int64_t> len(static_cast<size_t>(seqs), 0);
  MtpRounds out;
  for (int64_t s = 0; s < seqs; ++s) m.reset_slot(int32_t(s));
  for (int step = 0; step < steps; ++step) {
    model::ForwardBatch b;
    std::vector<std::vector<int32_t>> toks(static_cast<size_t>(seqs));
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t n = step == 0 ? 17 + 7 * s : 1 + int64_t(rng() % uint64_t(L + 1));
      b.seqs.push_back({.cache_slot = int32_t(s), .block_table = model::slot_block_table(g, int32_t(s)),
                        .num_computed_tokens = len[size_t(s)], .num_new_tokens = int32_t(n)});
      for (int64_t j = 0; j <= n; ++j) toks[size_t(s)].push_back(int32_t(rng() % uint64_t(V)));
      b.token_ids.insert(b.token_ids.end(), toks[size_t(s)].begin(), toks[size_t(s)].end() - 1);
    }
    for (int64_t t = 0; t < b.num_tokens(); ++t) b.hidden_indices.push_back(int32_t(t));
    const model::ForwardOutput o = m.run(b, {});
    model::DraftBatch db;
    std::vector<int64_t> keep(static_cast<size_t>(seqs));
    int64_t row = 0;
    for (int64_t s = 0; s < seqs; ++s) {
      const size_t si = size_t(s);
      const int64_t n = b.seqs[si].num_new_tokens;
      keep[si] = step == 0 ? n : 1 + int64_t(rng() % uint64_t(n));
      m.rollback(int32_t(s), len[si] + n, len[si] + keep[si]);
      db.seqs.push_back({.cache_slot = int32_t(s), .block_table = b.seqs[si].block_table, .first_position = len[si],
                         .num_positions = int32_t(keep[si]),
                         .next_tokens = std::vector<int32_t>(toks[si].begin() + 1, toks[si].begin() + 1 + keep[si]),
                         .num_drafts = int32_t(L), .first_hidden_row = row});
      row += n;
    }
    db.target_hidden = o.hidden;
    Tensor logits;
    const std::vector<model::DraftProposal> p = m.drafter()->propose(db, &logits);
    out.logits.insert(out.logits.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    // The same proposal again (it rewrites the same ring rows), without logits, from the host
    // copy of the target rows (the drafter's steps reused the device ones' memory).
    db.target_hidden.device = nullptr;
    const std::vector<model::DraftProposal> q = m.drafter()->propose(db, nullptr);
    for (int64_t s = 0; s < seqs; ++s) {
      const size_t si = size_t(s);
      out.drafts.insert(out.drafts.end(), p[si].tokens.begin(), p[si].tokens.end());
      out.logprobs.insert(out.logprobs.end(), p[si].logprobs.begin(), p[si].logprobs.end());
      out.drafts_no_logits.insert(out.drafts_no_logits.end(), q[si].tokens.begin(), q[si].tokens.end());
      out.logprobs_no_logits.insert(out.logprobs_no_logits.end(), q[si].logprobs.begin(), q[si].logprobs.end());
      // The drafter wrote its ring past the kept positions: those rows leave with the drafts.
      m.rollback(int32_t(s), len[si] + keep[si] + L, len[si] + keep[si]);
      len[si] += keep[si];
    }
  }
  return out;
}

}  // namespace deepinfer::testing
