#include "model/deepseek_v41/dspark.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek_v41/dspark_weights.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/hc.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/qat.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "ops/cpu/router.h"

namespace deepinfer::model::v41 {
namespace oc = ops::cpu;

// Per slot: each stage's key ring, [stages, capacity, head_dim], position p in row p mod capacity.
// Positions [valid_lo, fed_end) are intact (a slot restored without them, or fed with a gap, drafts
// over what it has: drafts only change how much is accepted, never the output).
struct DSparkDrafter::SlotRings {
  int64_t valid_lo = 0, fed_end = 0;
  std::vector<float> kv;
};

namespace {
const float* fp(const Tensor& t) { return t.data<float>(); }

// The host stages read host f32 rows; the device stages (`device_ok`) host or device rows.
void check_taps(const HiddenRows& taps, int64_t elems, const DraftSeq& s, size_t i, bool device_ok = false) {
  const bool host = taps.host.defined() && taps.host.dtype() == DType::kF32;
  if (!host && !(device_ok && taps.device))
    DI_THROW(InvalidArgument, "dspark propose: sequence ", i,
             device_ok ? ": no tap rows (neither host f32 nor device)" : ": the CPU drafter needs host f32 tap rows");
  if (taps.row_elems != elems)
    DI_THROW(InvalidArgument, "dspark propose: tap rows of ", taps.row_elems, " floats, the drafter reads ", elems,
             " (taps x hidden)");
  if (s.first_hidden_row < 0 || s.first_hidden_row + s.num_positions > taps.rows)
    DI_THROW(InvalidArgument, "dspark propose: sequence ", i, " reads tap rows [", s.first_hidden_row, ", ",
             s.first_hidden_row + s.num_positions, ") of ", taps.rows);
}
}  // namespace

DSparkDrafter::DSparkDrafter(const DeepseekV41Config& cfg, const V41Weights& w, const DSparkOptions& o)
    : cfg_(cfg),
      w_(std::make_unique<DSparkWeights>(DSparkWeights::load(cfg, w))),
      block_size_(cfg.dspark.block_size),
      window_(cfg.sliding_window),
      max_rollback_(std::max<int64_t>(o.max_rollback, 0)),
      qat_(o.qat),
      host_taps_(o.host_taps) {
  if (!o.stages) return;
  dev_ = o.stages(cfg_, *w_, ring_capacity(), qat_);
  // The stages now hold their own copy: the host keeps only what its picker tail reads (the
  // Markov head and the confidence weights), not the stages, main_proj, embedding or lm head.
  DSparkWeights& w2 = *w_;
  w2.stages.clear();
  w2.main_proj = w2.main_norm = w2.norm = w2.embed = w2.head = Tensor();
}

DSparkDrafter::~DSparkDrafter() = default;

std::string DSparkDrafter::describe() const {
  return "DeepSeek-V4.1 DSpark (" + std::to_string(cfg_.dspark.num_stages) + " stages, block " +
         std::to_string(block_size_) + (dev_ ? ", " + dev_->describe() : std::string()) + ")";
}

DSparkDrafter::SlotRings& DSparkDrafter::slot(int32_t s) {
  DI_CHECK(s >= 0 && s < (1 << 24), "dspark: cache slot ", s);
  if (size_t(s) >= slots_.size()) slots_.resize(size_t(s) + 1);
  auto& r = slots_[size_t(s)];
  if (!r) {
    r = std::make_unique<SlotRings>();
    if (!dev_) r->kv.assign(size_t(cfg_.dspark.num_stages * ring_capacity() * cfg_.head_dim), 0.f);
  }
  return *r;
}

void DSparkDrafter::reset_slot(int32_t s) {
  SlotRings& r = slot(s);
  r.valid_lo = r.fed_end = 0;
}

void DSparkDrafter::rollback(int32_t s, int64_t keep) {
  SlotRings& r = slot(s);
  r.fed_end = std::clamp<int64_t>(keep, 0, r.fed_end);
  r.valid_lo = std::min(r.valid_lo, r.fed_end);
}

// Which positions the slot's rings hold after feeding [first, first + num); returns the first of
// the fed rows that is written (earlier ones would be overwritten by the same feed).
int64_t DSparkDrafter::advance(const DraftSeq& s) {
  const int64_t P = s.num_positions, cap = ring_capacity();
  SlotRings& r = slot(s.cache_slot);
  // Older positions stay usable when the ring still holds them (a rollback, or fed in order).
  const int64_t f = s.first_position;
  const int64_t kept_lo = f > r.fed_end ? f : std::min(f, std::max(r.valid_lo, r.fed_end - cap));
  r.valid_lo = std::max({kept_lo, f + P - cap, int64_t(0)});
  r.fed_end = s.first_position + P;
  return std::max<int64_t>(0, P - cap);
}

// Ring rows of the committed positions [first, first + num): kv_s(p) for every stage.
void DSparkDrafter::feed(const DraftSeq& s, const HiddenRows& taps, size_t index) {
  const int64_t D = cfg_.hidden_size, d = cfg_.head_dim, nt = int64_t(cfg_.dspark.target_layer_ids.size());
  const int64_t P = s.num_positions, cap = ring_capacity();
  check_taps(taps, nt * D, s, index);
  advance(s);
  SlotRings& r = slot(s.cache_slot);
  const float* tap = taps.host.data<float>() + s.first_hidden_row * nt * D;
  std::vector<float> m(static_cast<size_t>(P * D)), kv(static_cast<size_t>(P * d));
  oc::linear(tap, P, nt * D, fp(w_->main_proj), D, m.data());
  oc::rmsnorm(m.data(), D, fp(w_->main_norm), m.data(), D, P, D, float(cfg_.rms_norm_eps));
  std::vector<int64_t> pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) pos[size_t(i)] = s.first_position + i;
  for (size_t k = 0; k < w_->stages.size(); ++k) {
    const DSparkStageWeights& W = w_->stages[k];
    oc::linear(m.data(), P, D, fp(W.wkv), d, kv.data());
    oc::rmsnorm(kv.data(), d, fp(W.kv_norm), kv.data(), d, P, d, float(cfg_.rms_norm_eps));
    oc::rope_apply(kv.data(), P, 1, d, cfg_.rope_head_dim, pos.data(), w_->inv_freq.data(), false);
    if (qat_) oc::qat_round_trip(oc::QatFormat::kFp8Ue8m0Block32, kv.data(), P, d, d);
    float* ring = r.kv.data() + int64_t(k) * cap * d;
    for (int64_t i = std::max<int64_t>(0, P - cap); i < P; ++i)
      std::copy_n(kv.data() + i * d, d, ring + ((s.first_position + i) % cap) * d);
  }
}

namespace {
// One stage's attention of the block queries over [ring positions, block keys] per sequence.
struct AttnCtx {
  const DeepseekV41Config& c;
  const DSparkStageWeights& W;
  const std::vector<float>& inv_freq;
  const std::vector<int64_t>& pos;   // [T] block positions
  const std::vector<int64_t>& lo;    // [S] first ring position read
  const std::vector<int64_t>& last;  // [S] last fed position
  std::vector<const float*> ring_of;  // [S] this stage's ring of each sequence
  int64_t cap, B;
  bool qat;
};

void stage_attention(const AttnCtx& a, const float* h, int64_t T, float* y) {
  const DeepseekV41Config& c = a.c;
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank, rd = c.rope_head_dim;
  const int64_t G = c.o_groups, R = c.o_lora_rank, gw = H * d / G, S = T / a.B;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> qa(static_cast<size_t>(T * r)), q(static_cast<size_t>(T * H * d));
  std::vector<float> kv(static_cast<size_t>(T * d)), o(static_cast<size_t>(T * H * d));
  oc::linear(h, T, D, fp(a.W.wq_a), r, qa.data());
  oc::rmsnorm(qa.data(), r, fp(a.W.q_norm), qa.data(), r, T, r, eps);
  oc::linear(qa.data(), T, r, fp(a.W.wq_b), H * d, q.data());
  oc::rope_apply(q.data(), T, H, d, rd, a.pos.data(), a.inv_freq.data(), false);
  oc::linear(h, T, D, fp(a.W.wkv), d, kv.data());
  oc::rmsnorm(kv.data(), d, fp(a.W.kv_norm), kv.data(), d, T, d, eps);
  oc::rope_apply(kv.data(), T, 1, d, rd, a.pos.data(), a.inv_freq.data(), false);
  if (a.qat) oc::qat_round_trip(oc::QatFormat::kFp8Ue8m0Block32, kv.data(), T, d, d);
  // Keys of sequence s: its ring positions lo..last in order, then its B block keys.
  std::vector<float> keys;
  std::vector<int32_t> begin(static_cast<size_t>(T)), count(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t at = int64_t(keys.size()) / d, n_ring = a.last[size_t(s)] - a.lo[size_t(s)] + 1;
    for (int64_t p = a.lo[size_t(s)]; p <= a.last[size_t(s)]; ++p) {
      const float* row = a.ring_of[size_t(s)] + (p % a.cap) * d;
      keys.insert(keys.end(), row, row + d);
    }
    keys.insert(keys.end(), kv.begin() + s * a.B * d, kv.begin() + (s + 1) * a.B * d);
    for (int64_t i = 0; i < a.B; ++i) {
      begin[size_t(s * a.B + i)] = int32_t(at);
      count[size_t(s * a.B + i)] = int32_t(n_ring + a.B);
    }
  }
  oc::sparse_attention({.q = q.data(), .num_tokens = T, .num_heads = H, .head_dim = d, .win_kv = keys.data(),
                        .win_begin = begin.data(), .win_count = count.data(), .sink = fp(a.W.sink),
                        .scale = 1.0f / std::sqrt(float(d)), .out = o.data()});
  oc::rope_apply(o.data(), T, H, d, rd, a.pos.data(), a.inv_freq.data(), true);
  std::vector<float> z(static_cast<size_t>(T * G * R));
  for (int64_t g = 0; g < G; ++g)  // grouped wo_a: group g reads its H*d/G slice with rows g*R..
    oc::gemm(T, R, gw, o.data() + g * gw, H * d, fp(a.W.wo_a) + g * R * gw, gw, true, z.data() + g * R, G * R);
  oc::linear(z.data(), T, G * R, fp(a.W.wo_b), D, y);
}

void stage_moe(const DeepseekV41Config& c, const DSparkStageWeights& W, const float* h, int64_t T, float* y) {
  const int64_t D = c.hidden_size, I = c.moe_intermediate_size, E = c.dspark.n_routed_experts;
  const int64_t K = c.dspark.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(T * E)), wts(static_cast<size_t>(T * K));
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  oc::linear(h, T, D, fp(W.gate), E, logits.data());
  oc::route({.logits = logits.data(), .num_tokens = T, .num_experts = E, .topk = K, .bias = fp(W.gate_bias),
             .normalize = c.norm_topk_prob && K > 1, .routed_scale = float(c.routed_scaling_factor),
             .gate_temp = float(c.gate_temp), .out_ids = ids.data(), .out_weights = wts.data()});
  std::vector<oc::ExpertF32> ex(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    ex[size_t(e)] = {fp(W.w13[size_t(e)]), fp(W.w13[size_t(e)]) + I * D, fp(W.w2[size_t(e)])};
  std::fill(y, y + T * D, 0.f);
  oc::moe_experts(h, T, D, I, ex.data(), E, ids.data(), wts.data(), K, float(c.swiglu_limit), y);
  const oc::ExpertF32 shared{fp(W.shared13), fp(W.shared13) + I * D, fp(W.shared2)};
  oc::swiglu_mlp(h, T, D, I, shared, float(c.swiglu_limit), y, true);
}
}  // namespace

// The block of every drafting sequence through the stages: xhat [S*B, D] (collapsed, pre-norm).
void DSparkDrafter::run_block(const std::vector<const DraftSeq*>& seqs, std::vector<float>& xhat) {
  const int64_t D = cfg_.hidden_size, n = cfg_.hc_mult, B = block_size_, S = int64_t(seqs.size()), T = S * B;
  const int64_t cap = ring_capacity(), d = cfg_.head_dim;
  const oc::HcSpec spec{.n = n, .dim = D, .sinkhorn_iters = cfg_.hc_sinkhorn_iters, .rms_eps = float(cfg_.rms_norm_eps),
                        .hc_eps = float(cfg_.hc_eps)};
  std::vector<int64_t> pos(static_cast<size_t>(T)), lo(static_cast<size_t>(S)), last(static_cast<size_t>(S));
  const size_t TD = size_t(T * D), Tn = size_t(T * n);
  std::vector<float> X(TD * size_t(n)), X2(X.size()), pre(Tn), post(Tn), comb(Tn * size_t(n)), prev_pre(Tn);
  std::vector<float> u(TD), h(TD), y(TD);
  std::vector<SlotRings*> rings;
  for (int64_t s = 0; s < S; ++s) {
    const DraftSeq& q = *seqs[size_t(s)];
    SlotRings& r = slot(q.cache_slot);
    rings.push_back(&r);
    last[size_t(s)] = q.first_position + q.num_positions - 1;
    lo[size_t(s)] = ring_lo(q);
    for (int64_t i = 0; i < B; ++i) {
      const int64_t t = s * B + i;
      pos[size_t(t)] = last[size_t(s)] + 1 + i;
      const int64_t id = i == 0 ? q.next_tokens.back() : cfg_.dspark.noise_token_id;
      DI_CHECK(id >= 0 && id < cfg_.vocab_size, "dspark: block token ", id);
      for (int64_t k = 0; k < n; ++k) std::copy_n(fp(w_->embed) + id * D, D, X.data() + (t * n + k) * D);
    }
  }
  const float eps = float(cfg_.rms_norm_eps);
  for (size_t k = 0; k < w_->stages.size(); ++k) {
    const DSparkStageWeights& W = w_->stages[k];
    AttnCtx a{cfg_, W, w_->inv_freq, pos, lo, last, {}, cap, B, qat_};
    for (SlotRings* r : rings) a.ring_of.push_back(r->kv.data() + int64_t(k) * cap * d);
    oc::hc_mix(X.data(), T, spec, fp(W.hc_attn_fn), fp(W.hc_attn_base), fp(W.hc_attn_scale), pre.data(), post.data(),
               comb.data());
    oc::hc_collapse(X.data(), T, spec, k == 0 ? nullptr : prev_pre.data(), u.data());
    oc::rmsnorm(u.data(), D, fp(W.attn_norm), h.data(), D, T, D, eps);
    stage_attention(a, h.data(), T, y.data());
    oc::hc_post(X.data(), y.data(), post.data(), comb.data(), T, spec, X2.data());
    prev_pre = pre;  // the attention site's pre collapses the FFN site's input
    oc::hc_mix(X2.data(), T, spec, fp(W.hc_ffn_fn), fp(W.hc_ffn_base), fp(W.hc_ffn_scale), pre.data(), post.data(),
               comb.data());
    oc::hc_collapse(X2.data(), T, spec, prev_pre.data(), u.data());
    oc::rmsnorm(u.data(), D, fp(W.ffn_norm), h.data(), D, T, D, eps);
    stage_moe(cfg_, W, h.data(), T, y.data());
    oc::hc_post(X2.data(), y.data(), post.data(), comb.data(), T, spec, X.data());
    prev_pre = pre;  // the FFN site's pre collapses the next stage's input (and the head's)
  }
  xhat.resize(size_t(T * D));
  oc::hc_collapse(X.data(), T, spec, prev_pre.data(), xhat.data());
}

int64_t DSparkDrafter::ring_lo(const DraftSeq& q) {
  return std::max(slot(q.cache_slot).valid_lo, q.first_position + q.num_positions - window_);
}

// Draft i of sequence j: base_i + bias(prev), the pick, its raw log-softmax and the confidence
// c_i = w_c·[xhat_i; e_prev] (double sums), in draft order (each bias reads the previous draft).
void DSparkDrafter::host_tail(const DraftBatch& in, const std::vector<const DraftSeq*>& drafting,
                              const std::vector<size_t>& index, const std::vector<float>& xhat,
                              std::vector<float>& base, std::vector<DraftProposal>& out,
                              std::vector<std::vector<float>>* kept) {
  const int64_t V = cfg_.vocab_size, D = cfg_.hidden_size, Rk = cfg_.dspark.markov_rank, B = block_size_;
  std::vector<float> bias(static_cast<size_t>(V));
  for (size_t j = 0; j < drafting.size(); ++j) {
    const DraftSeq& s = *drafting[j];
    DraftProposal& p = out[index[j]];
    int32_t prev = s.next_tokens.back();
    for (int64_t i = 0; i < s.num_drafts; ++i) {
      const int64_t t = int64_t(j) * B + i;
      const float* e = fp(w_->mk_embed) + int64_t(prev) * Rk;
      oc::linear(e, 1, Rk, fp(w_->mk_head), V, bias.data());
      float* row = base.data() + t * V;
      for (int64_t v = 0; v < V; ++v) row[v] += bias[size_t(v)];
      double c = 0;
      for (int64_t k = 0; k < D; ++k) c += double(fp(w_->conf)[k]) * double(xhat[size_t(t * D + k)]);
      for (int64_t k = 0; k < Rk; ++k) c += double(fp(w_->conf)[D + k]) * double(e[k]);
      const int32_t tok = in.picker ? in.picker->pick(index[j], int32_t(i), row, V)
                                    : int32_t(std::max_element(row, row + V) - row);
      DI_CHECK(tok >= 0 && tok < V, "draft picker chose token ", tok, " of ", V);
      const float mx = *std::max_element(row, row + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(mx));
      p.tokens.push_back(tok);
      p.logprobs.push_back(float(double(row[tok]) - double(mx) - std::log(sum)));
      p.confidence.push_back(float(1.0 / (1.0 + std::exp(-c))));
      last_conf_.push_back(float(c));
      if (kept) (*kept)[index[j]].insert((*kept)[index[j]].end(), row, row + V);
      prev = tok;
    }
  }
}

// The block on the stages' device. Greedy rounds (no picker, or one whose every pick is the
// argmax) take the Markov tail there too: only ids, log-probabilities and c_i come back.
void DSparkDrafter::device_propose(const DraftBatch& in, const std::vector<const DraftSeq*>& drafting,
                                   const std::vector<size_t>& index, std::vector<DraftProposal>& out,
                                   std::vector<std::vector<float>>* kept) {
  const int64_t V = cfg_.vocab_size, B = block_size_;
  bool greedy = true;
  for (size_t j = 0; j < drafting.size() && in.picker; ++j) greedy = greedy && in.picker->greedy(index[j]);
  std::vector<DSparkBlockSeq> seqs;
  for (const DraftSeq* q : drafting) {
    const int64_t last = q->first_position + q->num_positions - 1;
    seqs.push_back({.slot = q->cache_slot, .lo = ring_lo(*q), .last = last, .anchor = q->next_tokens.back(),
                    .num_drafts = q->num_drafts});
  }
  DSparkBlockOut o;
  dev_->block(seqs, greedy, kept != nullptr, o);
  if (!greedy) return host_tail(in, drafting, index, o.xhat, o.base, out, kept);
  for (size_t j = 0; j < drafting.size(); ++j) {
    DraftProposal& p = out[index[j]];
    for (int64_t i = 0; i < drafting[j]->num_drafts; ++i) {
      const size_t t = j * size_t(B) + size_t(i);
      DI_CHECK(o.tokens[t] >= 0 && o.tokens[t] < V, "dspark device draft ", o.tokens[t], " of ", V);
      p.tokens.push_back(o.tokens[t]);
      p.logprobs.push_back(o.logprobs[t]);
      const double c = o.conf_logits[t];
      p.confidence.push_back(float(1.0 / (1.0 + std::exp(-c))));
      last_conf_.push_back(o.conf_logits[t]);
      if (kept) (*kept)[index[j]].insert((*kept)[index[j]].end(), o.logits.begin() + t * V,
                                         o.logits.begin() + (t + 1) * V);
    }
  }
}

std::vector<DraftProposal> DSparkDrafter::propose(const DraftBatch& in, Tensor* draft_logits) {
  const int64_t V = cfg_.vocab_size, D = cfg_.hidden_size, B = block_size_;
  const int64_t nt = int64_t(cfg_.dspark.target_layer_ids.size());
  std::vector<DraftProposal> out(in.seqs.size());
  // A device backend's tap rows without a host copy: fetched once for the whole batch (host
  // stages only; device stages read them where they are).
  HiddenRows fetched;
  const HiddenRows* taps = &in.target_hidden;
  if (!dev_ && !taps->host.defined() && taps->device && host_taps_ && !in.seqs.empty()) {
    fetched = *taps;
    fetched.host = host_taps_(*taps);
    taps = &fetched;
  }
  std::vector<const DraftSeq*> drafting;
  std::vector<size_t> index;
  std::vector<DSparkFeed> feeds;
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    const DraftSeq& s = in.seqs[i];
    if (s.num_positions <= 0 || int64_t(s.next_tokens.size()) != s.num_positions)
      DI_THROW(InvalidArgument, "dspark propose: sequence ", i, " has ", s.num_positions, " positions and ",
               s.next_tokens.size(), " next tokens");
    if (s.num_drafts < 0 || s.num_drafts > B)
      DI_THROW(InvalidArgument, "dspark propose: sequence ", i, " asks ", s.num_drafts, " drafts, the block holds ", B);
    if (!dev_) {
      feed(s, *taps, i);
    } else {
      check_taps(*taps, nt * D, s, i, /*device_ok=*/true);
      const int64_t from = advance(s);
      feeds.push_back({.slot = s.cache_slot, .first_position = s.first_position, .first_row = s.first_hidden_row,
                       .from = from, .num = s.num_positions});
    }
    if (s.num_drafts > 0) drafting.push_back(&s), index.push_back(i);
  }
  if (dev_ && !feeds.empty()) dev_->feed(*taps, feeds);
  std::vector<std::vector<float>> kept(in.seqs.size());
  last_conf_.clear();
  if (!drafting.empty() && dev_) {
    device_propose(in, drafting, index, out, draft_logits ? &kept : nullptr);
  } else if (!drafting.empty()) {
    const int64_t T = int64_t(drafting.size()) * B;
    std::vector<float> xhat, hn(size_t(T * D)), base(size_t(T * V));
    run_block(drafting, xhat);
    oc::rmsnorm(xhat.data(), D, fp(w_->norm), hn.data(), D, T, D, float(cfg_.rms_norm_eps));
    oc::linear(hn.data(), T, D, fp(w_->head), V, base.data());
    host_tail(in, drafting, index, xhat, base, out, draft_logits ? &kept : nullptr);
  }
  if (draft_logits) {
    int64_t rows = 0;
    for (const auto& k : kept) rows += int64_t(k.size()) / V;
    *draft_logits = Tensor::empty({rows, V}, DType::kF32);
    int64_t at = 0;
    for (const auto& k : kept) {
      std::copy(k.begin(), k.end(), draft_logits->data<float>() + at);
      at += int64_t(k.size());
    }
  }
  return out;
}

void DSparkDrafter::append_snapshot(int32_t s, int64_t n, std::vector<uint8_t>& bytes) const {
  const int64_t d = cfg_.head_dim, cap = window_ + max_rollback_, stages = cfg_.dspark.num_stages;
  const SlotRings* r = size_t(s) < slots_.size() ? slots_[size_t(s)].get() : nullptr;
  int64_t hi = r ? std::min(n, r->fed_end) : 0;
  int64_t lo = r ? std::max({r->valid_lo, hi - window_, r->fed_end - cap, int64_t(0)}) : 0;
  if (hi < lo) hi = lo;
  const size_t at = bytes.size(), row = size_t(d) * sizeof(float);
  bytes.resize(at + size_t(stages * (hi - lo)) * row + 3 * sizeof(int64_t));
  uint8_t* dst = bytes.data() + at;
  if (dev_ && hi > lo) {
    std::vector<float> rows(size_t(stages * (hi - lo) * d));  // the bytes need not be float aligned
    dev_->read_ring(s, lo, hi, rows.data());
    std::memcpy(dst, rows.data(), rows.size() * sizeof(float));
    dst += rows.size() * sizeof(float);
  } else if (!dev_) {
    for (int64_t k = 0; k < stages; ++k)
      for (int64_t p = lo; p < hi; ++p, dst += row)
        std::memcpy(dst, r->kv.data() + (k * cap + p % cap) * d, row);
  }
  const int64_t trailer[3] = {lo, hi, kSnapshotMagic};
  std::memcpy(dst, trailer, sizeof(trailer));
}

void DSparkDrafter::take_snapshot(int32_t s, std::vector<uint8_t>& bytes) {
  const int64_t d = cfg_.head_dim, cap = ring_capacity(), stages = cfg_.dspark.num_stages;
  int64_t trailer[3];
  if (bytes.size() < sizeof(trailer)) DI_THROW(InvalidArgument, "dspark: slot snapshot without the drafter's rings");
  std::memcpy(trailer, bytes.data() + bytes.size() - sizeof(trailer), sizeof(trailer));
  const int64_t lo = trailer[0], hi = trailer[1];
  const size_t row = size_t(d) * sizeof(float);
  if (trailer[2] != kSnapshotMagic || lo < 0 || hi < lo || hi - lo > cap ||
      size_t(stages * (hi - lo)) * row + sizeof(trailer) > bytes.size())
    DI_THROW(InvalidArgument, "dspark: slot snapshot with bad drafter rings (positions [", lo, ", ", hi, "))");
  SlotRings& r = slot(s);
  const size_t at = bytes.size() - sizeof(trailer) - size_t(stages * (hi - lo)) * row;
  const uint8_t* src = bytes.data() + at;
  if (dev_ && hi > lo) {
    std::vector<float> rows(size_t(stages * (hi - lo) * d));  // the bytes need not be float aligned
    std::memcpy(rows.data(), src, rows.size() * sizeof(float));
    dev_->write_ring(s, lo, hi, rows.data());
  } else if (!dev_) {
    for (int64_t k = 0; k < stages; ++k)
      for (int64_t p = lo; p < hi; ++p, src += row) std::memcpy(r.kv.data() + (k * cap + p % cap) * d, src, row);
  }
  r.valid_lo = lo;
  r.fed_end = hi;
  bytes.resize(at);
}

}  // namespace deepinfer::model::v41
