// Speculative sampling on the device (ops/cuda/sampling.h kSpecDraft / kSpecVerify rows) against
// its host twins, compiled into this binary: the engine's draft picker rule (q = float of
// engine::processed_probs, engine::draw_weighted with the kSpecDraft stream) and
// engine::rejection_sample (acceptance min(1, p/q), residual norm(max(0, p - q))). Random
// non-zero logits with every processing step, odd vocabularies (not multiples of the 512-thread
// block), outputs poisoned first; then a statistical check on hand-made p and q: the drafts follow
// q, the emitted tokens follow p, acceptance is sum min(p, q) and the residual draws follow
// norm(max(0, p - q)) (chi-square over 60,000 rows).
#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include "deepinfer/error.h"
#include "engine/philox.h"
#include "engine/sampler.h"
#include "engine/spec_verify.h"
#include "ops/cuda/sampling.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

constexpr double kTieMargin = 1e-12;  // |u - CDF boundary| below this may go either way (sampling.h)

struct Row {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<int32_t> prompt, output;
  uint64_t seed = 0;
  int64_t position = 0;
  int32_t eos = 0;
};

// Row classes: temperature only, top-k, top-p + min-p, penalties + bias, everything.
Row make_row(int cls, int64_t V, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  Row r;
  r.logits = randn(size_t(V), seed, scale);
  r.seed = g();
  r.position = int64_t(g() % 100000);
  r.eos = int32_t(g() % uint64_t(V));
  for (int i = 0; i < 10; ++i) r.prompt.push_back(int32_t(g() % uint64_t(V)));
  for (int i = 0; i < 7; ++i) r.output.push_back(int32_t(g() % uint64_t(V)));
  SamplingParams& p = r.params;
  p.temperature = cls == 0 ? 1.0f : 0.7f + 0.1f * float(cls);
  if (cls == 1 || cls == 4) p.top_k = 1 + int(g() % 50);
  if (cls == 2 || cls == 4) p.top_p = 0.85f, p.min_p = 0.02f;
  if (cls == 3 || cls == 4) {
    p.repetition_penalty = 1.2f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.3f;
    p.logit_bias = {{int32_t(g() % uint64_t(V)), 2.0f}, {int32_t(g() % uint64_t(V)), -1.5f}};
  }
  return r;
}

engine::SamplingRow host_row(const Row& r) {
  return {.logits = r.logits.data(), .params = &r.params, .seed = r.seed, .sample_index = 0, .position = r.position,
          .prompt_ids = &r.prompt, .output_ids = &r.output, .allowed_mask = nullptr, .eos_token_id = r.eos};
}

// One batch on the device: rows' params and entry lists, spec fields, outputs poisoned.
struct Batch {
  int64_t B, V;
  DevArray<float> logits, lps, res_lp;
  DevArray<int32_t> bias_ids, pen_ids, pen_counts, tokens, ranks, accepted, residual, res_rank;
  DevArray<float> bias_vals;
  DevArray<oc::SamplingRowParams> rows;
  DevArray<double> ws;
  oc::SampleParams p;

  Batch(const std::vector<Row>& data, int64_t V_, int32_t mode, float* q_pool, const std::vector<int32_t>& drafts)
      : B(int64_t(data.size())), V(V_), lps(size_t(B)), res_lp(size_t(B)), tokens(size_t(B)), ranks(size_t(B)),
        accepted(size_t(B)), residual(size_t(B)), res_rank(size_t(B)), ws(size_t(B * V)) {
    std::vector<float> L;
    std::vector<int32_t> bid, pid, pcnt;
    std::vector<float> bval;
    std::vector<oc::SamplingRowParams> rp;
    for (size_t i = 0; i < data.size(); ++i) {
      const Row& d = data[i];
      const SamplingParams& s = d.params;
      L.insert(L.end(), d.logits.begin(), d.logits.end());
      oc::SamplingRowParams r{.temperature = s.temperature, .top_p = s.top_p, .min_p = s.min_p, .top_k = s.top_k,
                              .repetition_penalty = s.repetition_penalty, .presence_penalty = s.presence_penalty,
                              .frequency_penalty = s.frequency_penalty, .top_logprobs = 0, .seed = d.seed,
                              .sample_index = 0, .position = d.position, .eos_token_id = d.eos};
      r.bias_begin = int32_t(bid.size());
      for (auto [t, b] : s.logit_bias) bid.push_back(t), bval.push_back(b);
      r.bias_end = int32_t(bid.size());
      r.penalty_begin = int32_t(pid.size());
      if (s.repetition_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f)
        oc::make_penalty_entries(d.prompt, d.output, V, pid, pcnt);
      r.penalty_end = int32_t(pid.size());
      r.spec_mode = mode;
      r.spec_q = q_pool + int64_t(i) * V;
      r.spec_draft = mode == oc::kSpecVerify ? drafts[i] : -1;
      rp.push_back(r);
    }
    logits = DevArray<float>(L);
    bias_ids = DevArray<int32_t>(bid);
    bias_vals = DevArray<float>(bval);
    pen_ids = DevArray<int32_t>(pid);
    pen_counts = DevArray<int32_t>(pcnt);
    rows = DevArray<oc::SamplingRowParams>(rp);
    p = {.logits = logits.get(), .logits_stride = V, .batch = B, .vocab = V, .rows = rows.get(),
         .bias_ids = bias_ids.get(), .bias_values = bias_vals.get(), .num_bias = int64_t(bid.size()),
         .penalty_ids = pen_ids.get(), .penalty_counts = pen_counts.get(), .num_penalty = int64_t(pid.size()),
         .tokens = tokens.get(), .logprobs = lps.get(), .ranks = ranks.get(),
         .spec_accepted = accepted.get(), .spec_residual = residual.get(), .spec_residual_logprob = res_lp.get(),
         .spec_residual_rank = res_rank.get(), .workspace = ws.get(), .workspace_bytes = ws.n * sizeof(double)};
    oc::check_sampling_rows(rp, p);
    for (auto* a : {&tokens, &ranks, &accepted, &residual, &res_rank}) a->poison();
    for (auto* a : {&lps, &res_lp}) a->poison();
    ws.poison();
  }
  void run(int blocks = 0) { oc::sample(p, nullptr, blocks); }
};

// Whether host and device may disagree on an inverse-CDF draw over weights w at u (a tie).
bool near_boundary(const std::vector<double>& w, double u) {
  double total = 0;
  for (double x : w) total += x > 0 ? x : 0;
  double acc = 0;
  for (double x : w) {
    if (!(x > 0)) continue;
    acc += x;
    if (std::fabs(u * total - acc) < kTieMargin * std::max(1.0, total)) return true;
  }
  return false;
}

std::vector<double> as_double(const float* q, int64_t V) { return std::vector<double>(q, q + V); }

// Draft rows (q written, drawn from q) then verify rows (the drafts against fresh target logits)
// against the host picker and engine::rejection_sample.
// blocks: the split per row (0 = sampling_blocks_per_row(V)).
void run_twin_case(int64_t V, int64_t B, uint64_t seed, int blocks = 0) {
  std::vector<Row> draft_rows, target_rows;
  for (int64_t i = 0; i < B; ++i) {
    const int cls = int((i + int64_t(seed)) % 5);
    draft_rows.push_back(make_row(cls, V, seed * 100 + uint64_t(i), i % 3 == 0 ? 5.0f : 1.5f));
    Row t = draft_rows.back();  // same params, history and key; logits: a perturbed copy or fresh
    const std::vector<float> noise = randn(size_t(V), seed * 977 + uint64_t(i), 1.0f);
    for (int64_t v = 0; v < V; ++v)
      t.logits[size_t(v)] = i % 4 == 0 ? t.logits[size_t(v)] : t.logits[size_t(v)] + (i % 4 == 1 ? 0.3f : 2.0f) * noise[size_t(v)];
    target_rows.push_back(std::move(t));
  }
  DevArray<float> pool(static_cast<size_t>(B * V));
  pool.poison();
  Batch draft(draft_rows, V, oc::kSpecDraft, pool.get(), {});
  draft.run(blocks);
  const std::vector<float> q = pool.download();
  const std::vector<int32_t> drafts = draft.tokens.download();
  const std::vector<float> draft_lp = draft.lps.download();
  Batch verify(target_rows, V, oc::kSpecVerify, pool.get(), drafts);
  verify.run(blocks);
  const auto acc = verify.accepted.download(), res = verify.residual.download(), tok = verify.tokens.download();
  const auto res_lp = verify.res_lp.download();
  const auto res_rank = verify.res_rank.download();

  std::vector<float> q_dev, q_host, lp_dev, lp_host;
  int token_mismatch = 0, decision_mismatch = 0, ties = 0, rejected = 0;
  for (int64_t i = 0; i < B; ++i) {
    const engine::SamplingRow dr = host_row(draft_rows[size_t(i)]);
    const std::vector<double> pq = engine::processed_probs(dr, V);
    const float* qd = q.data() + i * V;
    for (int64_t v = 0; v < V; ++v) q_dev.push_back(qd[v]), q_host.push_back(float(pq[size_t(v)]));
    // The draft is the host rule's draw over the device's own q (so only the draw is compared).
    const double u = engine::philox_uniform(dr.seed, 0, dr.position, engine::DrawStream::kSpecDraft);
    const int32_t want = engine::draw_weighted(std::span<const float>(qd, size_t(V)), u);
    if (drafts[size_t(i)] != want) {
      if (near_boundary(as_double(qd, V), u)) ++ties;
      else ++token_mismatch, ADD_FAILURE() << "V=" << V << " row " << i << ": draft " << drafts[size_t(i)] << " host " << want;
    }
    lp_dev.push_back(draft_lp[size_t(i)]);
    lp_host.push_back(engine::compute_logprobs(dr.logits, V, drafts[size_t(i)], 0).logprob);
    // Verify: the host's rejection sample of the same draft, q (device) and p (host).
    const engine::SamplingRow tr = host_row(target_rows[size_t(i)]);
    const std::vector<double> p = engine::processed_probs(tr, V);
    bool host_acc = false;
    const double ua = engine::philox_uniform(tr.seed, 0, tr.position, engine::DrawStream::kSpecAccept);
    const double ur = engine::philox_uniform(tr.seed, 0, tr.position, engine::DrawStream::kSpecResidual);
    const int32_t host_tok = engine::rejection_sample(p, std::span<const float>(qd, size_t(V)), drafts[size_t(i)], ua, ur,
                                                      &host_acc);
    if (acc[size_t(i)] != int32_t(host_acc) || (!host_acc && res[size_t(i)] != host_tok)) {
      ++decision_mismatch;
      ADD_FAILURE() << "V=" << V << " row " << i << ": device accepted " << acc[size_t(i)] << " residual "
                    << res[size_t(i)] << ", host accepted " << host_acc << " token " << host_tok;
      continue;
    }
    if (!host_acc) {
      ++rejected;
      const engine::TokenLogprobs lp = engine::compute_logprobs(tr.logits, V, host_tok, 0);
      EXPECT_EQ(res_rank[size_t(i)], lp.rank) << "row " << i;
      lp_dev.push_back(res_lp[size_t(i)]);
      lp_host.push_back(lp.logprob);
    } else {
      EXPECT_EQ(res[size_t(i)], drafts[size_t(i)]) << "row " << i << ": an accepted row's residual is the draft";
    }
    EXPECT_GE(tok[size_t(i)], 0) << "row " << i << ": the verify row's own draw";
  }
  const std::string cs =
      "V=" + std::to_string(V) + " B=" + std::to_string(B) + (blocks ? " blocks=" + std::to_string(blocks) : "");
  report("spec_draft_q", cs, max_rel_err(q_dev, q_host), 1e-6);
  report("spec_draft_tokens", cs, double(token_mismatch) / double(B), 0.0);
  report("spec_verify_decisions", cs, double(decision_mismatch) / double(B), 0.0);
  report("spec_logprobs", cs, max_rel_err(lp_dev, lp_host), 1e-6);
  std::printf("spec sampling %s: %d of %lld verify rows rejected, %d near-tie drafts\n", cs.c_str(), rejected,
              (long long)B, ties);
}

TEST(CudaSpecSampling, DraftAndVerifyRowsMatchHostRules) {
  DI_REQUIRE_GPU();
  uint64_t seed = 5100;
  for (int64_t V : {int64_t(37), int64_t(1000), int64_t(129280)})
    for (int64_t B : {int64_t(1), int64_t(13), int64_t(64)}) run_twin_case(V, B, ++seed);
}

// The same rules with each row forced over 1, 3 and 8 blocks (a cluster per row), odd vocabularies.
TEST(CudaSpecSampling, DraftAndVerifyAcrossSplits) {
  DI_REQUIRE_GPU();
  uint64_t seed = 6100;
  for (int64_t V : {int64_t(37), int64_t(4097), int64_t(200003)})
    for (int blocks : {1, 3, 8}) run_twin_case(V, 13, ++seed, blocks);
}

// Chi-square of counts against probabilities (bins with expected < 5 pooled); returns
// (statistic, degrees of freedom).
std::pair<double, int> chi_square(const std::vector<int64_t>& counts, const std::vector<double>& prob, int64_t n) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int bins = 0;
  for (size_t t = 0; t < prob.size(); ++t) {
    const double e = prob[t] * double(n);
    if (e < 5) {
      pooled_e += e, pooled_o += double(counts[t]);
      EXPECT_TRUE(prob[t] > 0 || counts[t] == 0) << "token " << t << " drawn " << counts[t] << " times at probability 0";
      continue;
    }
    stat += (double(counts[t]) - e) * (double(counts[t]) - e) / e;
    ++bins;
  }
  if (pooled_e >= 5) stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++bins;
  return {stat, std::max(bins - 1, 1)};
}

// Hand-made p and q over V = 37 (a few zeros in each, where the other is not): 60,000 rows of one
// draft each, every row its own Philox position.
TEST(CudaSpecSampling, RejectionSamplingIsDistributionExact) {
  DI_REQUIRE_GPU();
  const int64_t V = 37, N = 60000;
  std::mt19937_64 g(77);
  std::uniform_real_distribution<double> U(0.05, 1.0);
  std::vector<double> p(static_cast<size_t>(V)), q(static_cast<size_t>(V));
  for (int64_t t = 0; t < V; ++t) {
    p[size_t(t)] = t % 9 == 4 ? 0.0 : U(g) * (t < 5 ? 4.0 : 1.0);
    q[size_t(t)] = t % 7 == 2 ? 0.0 : U(g) * (t > 30 ? 4.0 : 1.0);
  }
  auto normalise = [](std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    for (double& x : v) x /= s;
  };
  normalise(p);
  normalise(q);
  auto logits_of = [&](const std::vector<double>& v) {
    std::vector<float> l(static_cast<size_t>(V));
    for (int64_t t = 0; t < V; ++t) l[size_t(t)] = v[size_t(t)] > 0 ? float(std::log(v[size_t(t)])) : -INFINITY;
    return l;
  };
  std::vector<Row> qrows(static_cast<size_t>(N)), prows(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    Row& a = qrows[size_t(i)];
    a.logits = logits_of(q);
    a.params.temperature = 1.0f;
    a.seed = 12345;
    a.position = i;
    a.eos = 0;
    Row b = a;
    b.logits = logits_of(p);
    prows[size_t(i)] = std::move(b);
  }
  DevArray<float> pool(static_cast<size_t>(N * V));
  Batch draft(qrows, V, oc::kSpecDraft, pool.get(), {});
  draft.run();
  const std::vector<int32_t> drafts = draft.tokens.download();
  Batch verify(prows, V, oc::kSpecVerify, pool.get(), drafts);
  verify.run();
  const auto acc = verify.accepted.download(), res = verify.residual.download();

  std::vector<int64_t> drafted(static_cast<size_t>(V), 0), emitted(drafted), residual(drafted);
  int64_t accepted = 0;
  for (int64_t i = 0; i < N; ++i) {
    ASSERT_TRUE(acc[size_t(i)] == 0 || acc[size_t(i)] == 1) << "row " << i << " decision " << acc[size_t(i)];
    drafted[size_t(drafts[size_t(i)])]++;
    if (acc[size_t(i)] == 1) {
      ++accepted;
      emitted[size_t(drafts[size_t(i)])]++;
    } else {
      emitted[size_t(res[size_t(i)])]++;
      residual[size_t(res[size_t(i)])]++;
    }
  }
  std::vector<double> r(static_cast<size_t>(V));
  double overlap = 0;
  for (int64_t t = 0; t < V; ++t) {
    overlap += std::min(p[size_t(t)], q[size_t(t)]);
    r[size_t(t)] = std::max(0.0, p[size_t(t)] - q[size_t(t)]);
  }
  normalise(r);
  // chi-square critical values at ~1e-4 for these degrees of freedom are below 2 * df + 20.
  for (auto [name, counts, prob, n] :
       {std::tuple{"drafts ~ q", drafted, q, N}, std::tuple{"emitted ~ p", emitted, p, N},
        std::tuple{"residual ~ norm(max(0, p - q))", residual, r, N - accepted}}) {
    const auto [stat, df] = chi_square(counts, prob, n);
    std::printf("spec sampling chi-square %s: %.1f on %d degrees of freedom (%lld draws)\n", name, stat, df,
                (long long)n);
    EXPECT_LT(stat, 2.0 * df + 20) << name;
  }
  const double rate = double(accepted) / double(N), sd = std::sqrt(overlap * (1 - overlap) / double(N));
  std::printf("spec sampling acceptance %.4f, expected sum min(p, q) = %.4f (sd %.4f)\n", rate, overlap, sd);
  EXPECT_LT(std::fabs(rate - overlap), 5 * sd);
}

TEST(CudaSpecSampling, RejectsBadSpecRows) {
  oc::SampleParams p{.batch = 1, .vocab = 10, .max_top_logprobs = 0};
  auto expect = [&](oc::SamplingRowParams r, const char* what, bool with_outputs = false) {
    int32_t dummy = 0;
    p.spec_accepted = with_outputs ? &dummy : nullptr;
    p.spec_residual = with_outputs ? &dummy : nullptr;
    try {
      oc::check_sampling_rows(std::vector<oc::SamplingRowParams>{r}, p);
      ADD_FAILURE() << "accepted " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  float q[10] = {};
  oc::SamplingRowParams r;
  r.spec_mode = 7;
  expect(r, "spec_mode 7");
  r.spec_mode = oc::kSpecDraft;
  r.temperature = 0.0f;
  r.spec_q = q;
  expect(r, "greedy row");
  r.temperature = 1.0f;
  r.spec_q = nullptr;
  expect(r, "null spec_q");
  r.spec_mode = oc::kSpecVerify;
  r.spec_q = q;
  r.spec_draft = 10;
  expect(r, "spec_draft 10", true);
  r.spec_draft = 3;
  expect(r, "null spec_accepted");
}

}  // namespace
}  // namespace deepinfer::cuda
