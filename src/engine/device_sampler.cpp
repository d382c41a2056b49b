#include "engine/device_sampler.h"

#include "core/check.h"

#if defined(DEEPINFER_HAVE_MODEL_CUDA) && __has_include("ops/cuda/sampling.h")
#include <algorithm>
#include <cstring>

#include "ops/cuda/runtime.h"
#include "ops/cuda/sampling.h"
#define DI_DEVICE_SAMPLER 1
#endif

namespace deepinfer::engine {

#if defined(DI_DEVICE_SAMPLER)
namespace oc = ops::cuda;

namespace {
// The step's host-side lists, flattened the way ops::cuda::SampleParams reads them.
struct Flat {
  std::vector<oc::SamplingRowParams> rows;
  std::vector<int32_t> bias_ids, banned, pen_ids, pen_counts;
  std::vector<float> bias_vals;
  bool any_mask = false, any_logprobs = false, any_verify = false;
  int max_top = 0;
};

Flat flatten(std::span<const SamplingRow> rows, std::span<const SpecRow> spec, int64_t vocab) {
  Flat f;
  f.rows.reserve(rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const SamplingRow& row = rows[k];
    const SamplingParams& p = *row.params;
    oc::SamplingRowParams r{.temperature = p.temperature, .top_p = p.top_p, .min_p = p.min_p, .top_k = p.top_k,
                            .repetition_penalty = p.repetition_penalty, .presence_penalty = p.presence_penalty,
                            .frequency_penalty = p.frequency_penalty, .top_logprobs = p.logprobs.value_or(0),
                            .seed = row.seed, .sample_index = row.sample_index, .position = row.position,
                            .eos_token_id = int32_t(row.eos_token_id), .has_mask = row.allowed_mask ? 1 : 0};
    if (p.logprobs) {
      f.any_logprobs = true;
      f.max_top = std::max(f.max_top, *p.logprobs);
    }
    f.any_mask |= row.allowed_mask != nullptr;
    r.bias_begin = int32_t(f.bias_ids.size());
    for (auto [t, b] : p.logit_bias) {
      f.bias_ids.push_back(t);
      f.bias_vals.push_back(b);
    }
    r.bias_end = int32_t(f.bias_ids.size());
    // min_tokens not reached: EOS and the stop ids are banned (sampler.cpp, processed_logits).
    r.banned_begin = int32_t(f.banned.size());
    const int64_t n_out = row.output_ids ? int64_t(row.output_ids->size()) : 0;
    if (n_out < p.min_tokens) {
      if (row.eos_token_id >= 0 && row.eos_token_id < vocab) f.banned.push_back(int32_t(row.eos_token_id));
      for (int32_t t : p.stop_token_ids) f.banned.push_back(t);
    }
    r.banned_end = int32_t(f.banned.size());
    // Penalty entries only when a penalty is on: the repetition penalty covers prompt + output,
    // presence/frequency the output alone (count 0 entries get no additive penalty).
    r.penalty_begin = int32_t(f.pen_ids.size());
    const bool rep = p.repetition_penalty != 1.0f;
    const bool additive = (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && row.output_ids;
    if (rep || additive) {
      std::span<const int32_t> prompt, output;
      if (rep && row.prompt_ids) prompt = *row.prompt_ids;
      if (row.output_ids) output = *row.output_ids;
      oc::make_penalty_entries(prompt, output, vocab, f.pen_ids, f.pen_counts);
    }
    r.penalty_end = int32_t(f.pen_ids.size());
    if (!spec.empty() && spec[k].mode != SpecRow::kPlain) {
      const SpecRow& sr = spec[k];
      DI_CHECK(sr.pool && sr.q_row >= 0 && sr.q_row < sr.pool->draft_pool_rows(), "DeviceSampler: row ", k,
               " has spec mode ", int(sr.mode), " with draft pool row ", sr.q_row, " of ",
               sr.pool ? sr.pool->draft_pool_rows() : 0);
      r.spec_mode = sr.mode == SpecRow::kDraft ? oc::kSpecDraft : oc::kSpecVerify;
      r.spec_draft = sr.draft;
      r.spec_q = sr.pool->draft_row(sr.q_row);
      f.any_verify |= sr.mode == SpecRow::kVerify;
    }
    f.rows.push_back(r);
  }
  return f;
}

// Byte layout of one packed buffer: pieces at 256-byte aligned offsets.
struct Layout {
  size_t total = 0;
  size_t add(size_t bytes) {
    const size_t off = (total + 255) / 256 * 256;
    total = off + bytes;
    return off;
  }
};

template <typename T>
void put(char* base, size_t off, const std::vector<T>& v) {
  if (!v.empty()) std::memcpy(base + off, v.data(), v.size() * sizeof(T));
}

void grow(cuda::DeviceBuffer& b, size_t bytes, int device) {
  if (b.size_bytes() >= bytes) return;
  b = cuda::DeviceBuffer();
  b = cuda::DeviceBuffer(bytes + bytes / 4, device);
}
void grow(cuda::PinnedBuffer& b, size_t bytes) {
  if (b.size_bytes() >= bytes) return;
  b = cuda::PinnedBuffer();
  b = cuda::PinnedBuffer(bytes + bytes / 4);
}
}  // namespace

struct DeviceSampler::Impl {
  cuda::DeviceBuffer in_d, out_d, workspace, tokens_d, pool;
  int64_t pool_rows = 0;
  cuda::PinnedBuffer in_h, out_h;
  cuda::Event done;  // recorded after the copy back
  // What wait() needs from the enqueued step.
  bool pending = false;
  int64_t rows = 0;
  int max_top = 0;
  size_t o_tok = 0, o_lp = 0, o_rank = 0, o_tid = 0, o_tlp = 0;
  size_t o_acc = 0, o_res = 0, o_rlp = 0, o_rrank = 0;
  bool verify = false;
  std::vector<int> top_n;  // [rows] logprobs asked (-1: none)
  std::vector<uint8_t> spec_rows;  // [rows] 1: a verify row
};

std::unique_ptr<DeviceSampler> DeviceSampler::create(int64_t vocab) {
  return std::unique_ptr<DeviceSampler>(new DeviceSampler(vocab));
}

DeviceSampler::DeviceSampler(int64_t vocab) : vocab_(vocab), impl_(std::make_unique<Impl>()) {
  DI_CHECK(vocab >= 1 && vocab < INT32_MAX, "vocab ", vocab);
}

bool DeviceSampler::supports(const SamplingParams& p) const {
  return !p.logprobs || (*p.logprobs >= 0 && *p.logprobs <= oc::kSamplingMaxTopLogprobs);
}

bool DeviceSampler::supports(const SamplingRow& row) const {
  if (!supports(*row.params)) return false;
  if (row.allowed_mask && int64_t(row.allowed_mask->size()) * 32 < vocab_) return false;
  return true;
}

std::vector<SampleResult> DeviceSampler::sample(const model::DeviceLogits& logits, std::span<const SamplingRow> rows) {
  enqueue(logits, rows);
  return wait();
}

const int32_t* DeviceSampler::device_tokens() const { return impl_->tokens_d.as<const int32_t>(); }

void DeviceSampler::reserve_draft_pool(int64_t rows, int device) {
  Impl& m = *impl_;
  DI_CHECK(rows >= 0, "draft pool of ", rows, " rows");
  if (rows <= m.pool_rows) return;
  // Rows keep their contents (a sequence's drafts may wait a step unscheduled); nothing queued
  // may read the pool meanwhile (the caller's contract), so a plain synchronous copy suffices.
  const int64_t n = rows + rows / 4 + 8;
  cuda::DeviceBuffer grown(size_t(n * vocab_) * sizeof(float), device);
  if (m.pool_rows > 0)
    DI_CUDA_CHECK(cudaMemcpy(grown.data(), m.pool.data(), size_t(m.pool_rows * vocab_) * sizeof(float),
                             cudaMemcpyDeviceToDevice));
  m.pool = std::move(grown);
  m.pool_rows = n;
}

int64_t DeviceSampler::draft_pool_rows() const { return impl_->pool_rows; }

float* DeviceSampler::draft_row(int64_t row) const {
  DI_CHECK(row >= 0 && row < impl_->pool_rows, "draft pool row ", row, " of ", impl_->pool_rows);
  return impl_->pool.as<float>() + row * vocab_;
}

void DeviceSampler::copy_draft_row(int64_t row, float* dst, void* stream) const {
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  DI_CUDA_CHECK(cudaMemcpyAsync(dst, draft_row(row), size_t(vocab_) * sizeof(float), cudaMemcpyDeviceToHost, st));
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
}

void DeviceSampler::enqueue(const model::DeviceLogits& logits, std::span<const SamplingRow> rows,
                            std::span<const SpecRow> spec) {
  const int64_t B = int64_t(rows.size()), V = vocab_, words = (V + 31) / 32;
  const cudaStream_t st = static_cast<cudaStream_t>(logits.stream);
  Impl& m = *impl_;
  DI_CHECK(!m.pending, "DeviceSampler: enqueue() before the previous step's wait()");
  DI_CHECK(logits.rows == B, "device logits have ", logits.rows, " rows for ", B, " sampled rows");
  m.pending = true;
  m.rows = B;
  m.top_n.clear();
  if (B == 0) {
    m.done.record(st);
    return;
  }
  DI_CHECK(spec.empty() || spec.size() == rows.size(), "DeviceSampler: ", spec.size(), " spec rows for ", B, " rows");
  const Flat f = flatten(rows, spec, V);
  // Upload: rows, entry lists and (when any row has one) the [B, words] grammar bitmasks.
  Layout in;
  const size_t o_rows = in.add(f.rows.size() * sizeof(oc::SamplingRowParams));
  const size_t o_bid = in.add(f.bias_ids.size() * 4), o_bval = in.add(f.bias_vals.size() * 4);
  const size_t o_ban = in.add(f.banned.size() * 4);
  const size_t o_pid = in.add(f.pen_ids.size() * 4), o_pcnt = in.add(f.pen_counts.size() * 4);
  const size_t o_mask = in.add(f.any_mask ? size_t(B * words) * 4 : 0);
  grow(m.in_h, in.total);
  grow(m.in_d, in.total, logits.device);
  char* h = m.in_h.as<char>();
  put(h, o_rows, f.rows);
  put(h, o_bid, f.bias_ids);
  put(h, o_bval, f.bias_vals);
  put(h, o_ban, f.banned);
  put(h, o_pid, f.pen_ids);
  put(h, o_pcnt, f.pen_counts);
  if (f.any_mask) {
    uint32_t* mask = reinterpret_cast<uint32_t*>(h + o_mask);
    for (int64_t i = 0; i < B; ++i) {
      const std::vector<uint32_t>* src = rows[size_t(i)].allowed_mask;
      if (!src) continue;  // has_mask = 0: the row is never read
      DI_CHECK(int64_t(src->size()) >= words, "grammar bitmask too short: ", src->size(), " words for vocab ", V);
      std::memcpy(mask + i * words, src->data(), size_t(words) * 4);
    }
  }
  DI_CUDA_CHECK(cudaMemcpyAsync(m.in_d.data(), h, in.total, cudaMemcpyHostToDevice, st));
  // Outputs: ids, then (when asked) logprobs, ranks and the top-N block.
  const int max_top = f.any_logprobs ? f.max_top : 0;
  Layout out;
  const size_t o_tok = out.add(size_t(B) * 4);
  const size_t o_lp = out.add(f.any_logprobs ? size_t(B) * 4 : 0), o_rank = out.add(f.any_logprobs ? size_t(B) * 4 : 0);
  const size_t o_tid = out.add(size_t(B * max_top) * 4), o_tlp = out.add(size_t(B * max_top) * 4);
  const size_t vb = f.any_verify ? size_t(B) * 4 : 0;
  const size_t o_acc = out.add(vb), o_res = out.add(vb), o_rlp = out.add(vb), o_rrank = out.add(vb);
  grow(m.out_h, out.total);
  grow(m.out_d, out.total, logits.device);
  grow(m.workspace, oc::sampling_workspace_bytes(B, V), logits.device);
  char* d_in = m.in_d.as<char>();
  char* d_out = m.out_d.as<char>();
  auto I32 = [](char* base, size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto F32 = [](char* base, size_t off) { return reinterpret_cast<float*>(base + off); };
  oc::SampleParams p{.logits = logits.data, .logits_stride = logits.row_stride, .batch = B, .vocab = V,
                     .rows = reinterpret_cast<const oc::SamplingRowParams*>(d_in + o_rows),
                     .bias_ids = I32(d_in, o_bid), .bias_values = F32(d_in, o_bval),
                     .num_bias = int64_t(f.bias_ids.size()), .banned_ids = I32(d_in, o_ban),
                     .num_banned = int64_t(f.banned.size()), .penalty_ids = I32(d_in, o_pid),
                     .penalty_counts = I32(d_in, o_pcnt), .num_penalty = int64_t(f.pen_ids.size()),
                     .allowed_mask = f.any_mask ? reinterpret_cast<const uint32_t*>(d_in + o_mask) : nullptr,
                     .mask_stride = words, .tokens = I32(d_out, o_tok),
                     .logprobs = f.any_logprobs ? F32(d_out, o_lp) : nullptr,
                     .ranks = f.any_logprobs ? I32(d_out, o_rank) : nullptr,
                     .top_ids = max_top > 0 ? I32(d_out, o_tid) : nullptr,
                     .top_logprobs = max_top > 0 ? F32(d_out, o_tlp) : nullptr, .max_top_logprobs = max_top,
                     .spec_accepted = f.any_verify ? I32(d_out, o_acc) : nullptr,
                     .spec_residual = f.any_verify ? I32(d_out, o_res) : nullptr,
                     .spec_residual_logprob = f.any_verify ? F32(d_out, o_rlp) : nullptr,
                     .spec_residual_rank = f.any_verify ? I32(d_out, o_rrank) : nullptr,
                     .workspace = m.workspace.data(), .workspace_bytes = m.workspace.size_bytes()};
  oc::check_sampling_rows(f.rows, p);
  oc::sample(p, st);
  // The ids also go to their own buffer, which the next step's forward reads (the output buffer
  // may be regrown by the next enqueue while that forward is queued).
  if (m.tokens_d.size_bytes() < size_t(B) * 4) {
    DI_CUDA_CHECK(cudaStreamSynchronize(st));  // a queued forward may still read the old ids
    grow(m.tokens_d, size_t(B) * 4, logits.device);
  }
  DI_CUDA_CHECK(cudaMemcpyAsync(m.tokens_d.data(), d_out + o_tok, size_t(B) * 4, cudaMemcpyDeviceToDevice, st));
  DI_CUDA_CHECK(cudaMemcpyAsync(m.out_h.data(), d_out, out.total, cudaMemcpyDeviceToHost, st));
  m.done.record(st);
  m.max_top = max_top;
  m.o_tok = o_tok, m.o_lp = o_lp, m.o_rank = o_rank, m.o_tid = o_tid, m.o_tlp = o_tlp;
  m.o_acc = o_acc, m.o_res = o_res, m.o_rlp = o_rlp, m.o_rrank = o_rrank;
  m.verify = f.any_verify;
  for (const SamplingRow& row : rows) m.top_n.push_back(row.params->logprobs ? *row.params->logprobs : -1);
  m.spec_rows.assign(size_t(B), 0);
  for (size_t i = 0; i < spec.size(); ++i) m.spec_rows[i] = spec[i].mode == SpecRow::kVerify;
  stats_.steps++;
  stats_.rows += B;
  stats_.h2d_bytes += int64_t(in.total);
  stats_.d2h_bytes += int64_t(out.total);
  stats_.last_d2h_bytes = int64_t(out.total);
}

std::vector<SampleResult> DeviceSampler::wait() {
  Impl& m = *impl_;
  DI_CHECK(m.pending, "DeviceSampler: wait() without enqueue()");
  m.pending = false;
  m.done.synchronize();
  const int64_t B = m.rows;
  char* ho = m.out_h.as<char>();
  auto I32 = [](char* base, size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto F32 = [](char* base, size_t off) { return reinterpret_cast<float*>(base + off); };
  std::vector<SampleResult> res(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    SampleResult& r = res[size_t(i)];
    r.token = I32(ho, m.o_tok)[i];
    if (m.verify && m.spec_rows[size_t(i)]) {
      r.spec_accepted = I32(ho, m.o_acc)[i];
      r.spec_residual = I32(ho, m.o_res)[i];
      if ((r.spec_accepted == 0 || r.spec_accepted == 1) && m.top_n[size_t(i)] >= 0) {
        r.spec_residual_logprob = F32(ho, m.o_rlp)[i];
        r.spec_residual_rank = I32(ho, m.o_rrank)[i];
      }
    }
    const int asked = m.top_n[size_t(i)];
    if (asked < 0) continue;
    TokenLogprobs& lp = r.logprobs;
    lp.token = r.token;
    lp.logprob = F32(ho, m.o_lp)[i];
    lp.rank = I32(ho, m.o_rank)[i];
    const int n = int(std::min<int64_t>(asked, vocab_));
    for (int j = 0; j < n; ++j)
      lp.top.emplace_back(I32(ho, m.o_tid)[i * m.max_top + j], F32(ho, m.o_tlp)[i * m.max_top + j]);
  }
  return res;
}

DeviceSampler::~DeviceSampler() = default;

#else  // no CUDA backend in this build

struct DeviceSampler::Impl {};
std::unique_ptr<DeviceSampler> DeviceSampler::create(int64_t) { return nullptr; }
DeviceSampler::DeviceSampler(int64_t vocab) : vocab_(vocab) {}
DeviceSampler::~DeviceSampler() = default;
bool DeviceSampler::supports(const SamplingRow&) const { return false; }
bool DeviceSampler::supports(const SamplingParams&) const { return false; }
std::vector<SampleResult> DeviceSampler::sample(const model::DeviceLogits&, std::span<const SamplingRow>) {
  DI_THROW(InternalError, "DeviceSampler: this build has no CUDA backend");
}
void DeviceSampler::enqueue(const model::DeviceLogits&, std::span<const SamplingRow>, std::span<const SpecRow>) {
  DI_THROW(InternalError, "DeviceSampler: this build has no CUDA backend");
}
void DeviceSampler::reserve_draft_pool(int64_t, int) { DI_THROW(InternalError, "DeviceSampler: this build has no CUDA backend"); }
int64_t DeviceSampler::draft_pool_rows() const { return 0; }
float* DeviceSampler::draft_row(int64_t) const { return nullptr; }
void DeviceSampler::copy_draft_row(int64_t, float*, void*) const {
  DI_THROW(InternalError, "DeviceSampler: this build has no CUDA backend");
}
std::vector<SampleResult> DeviceSampler::wait() { DI_THROW(InternalError, "DeviceSampler: this build has no CUDA backend"); }
const int32_t* DeviceSampler::device_tokens() const { return nullptr; }

#endif

}  // namespace deepinfer::engine
