#include "model/deepseek/cuda/dspark_kernels.h"

#include <cmath>

#include "deepinfer/error.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {
namespace {
constexpr int kTailThreads = 512;

// Block-wide (value, id) argmax, lowest id on ties; every thread gets the winner.
__device__ void argmax_block(float& v, int64_t& id, float* sv, int64_t* si) {
  sv[threadIdx.x] = v, si[threadIdx.x] = id;
  __syncthreads();
  for (int s = kTailThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) {
      const float ov = sv[threadIdx.x + s];
      const int64_t oi = si[threadIdx.x + s];
      if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  v = sv[0], id = si[0];
  __syncthreads();
}

__device__ double sum_block(double x, double* sd) {
  sd[threadIdx.x] = x;
  __syncthreads();
  for (int s = kTailThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sd[threadIdx.x] += sd[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sd[0];
  __syncthreads();
  return r;
}

// One block per sequence; the drafts of a sequence are sequential (each bias reads the previous
// draft), the vocabulary is spread over the threads.
__global__ void dspark_tail_kernel(const __grid_constant__ DSparkTailParams p) {
  __shared__ float sv[kTailThreads];
  __shared__ int64_t si[kTailThreads];
  __shared__ double sd[kTailThreads];
  extern __shared__ float e[];  // [rank] the Markov embedding of the previous token
  const int64_t j = blockIdx.x, V = p.vocab, Rk = p.rank, D = p.dim;
  int64_t prev = p.anchor[j];
  const int n = min(p.num_drafts[j], int(p.block));  // the launcher's caller checked 0 <= n <= block
  for (int i = 0; i < n; ++i) {
    const int64_t t = j * p.block + i;
    for (int64_t k = threadIdx.x; k < Rk; k += blockDim.x) e[k] = p.mk_embed[prev * Rk + k];
    __syncthreads();
    float* row = p.logits + t * V;
    float best = -INFINITY;
    int64_t best_id = V;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float* h = p.mk_head + v * Rk;
      float b = 0.f;
      for (int64_t k = 0; k < Rk; ++k) b += h[k] * e[k];
      const float r = row[v] + b;
      row[v] = r;
      if (r > best || best_id == V) best = r, best_id = v;  // ascending v: the first max of this thread
    }
    argmax_block(best, best_id, sv, si);
    double s = 0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += exp(double(row[v]) - double(best));
    s = sum_block(s, sd);
    double c = 0;
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) c += double(p.conf[k]) * double(p.xhat[t * D + k]);
    c = sum_block(c, sd);
    double c2 = 0;
    for (int64_t k = threadIdx.x; k < Rk; k += blockDim.x) c2 += double(p.conf[D + k]) * double(e[k]);
    c2 = sum_block(c2, sd);
    if (threadIdx.x == 0) {
      p.tokens[t] = int32_t(best_id < V ? best_id : 0);
      p.logprobs[t] = float(-log(s));
      p.conf_logits[t] = float(c + c2);
    }
    prev = best_id < V ? best_id : 0;
    __syncthreads();  // e is rewritten for the next draft
  }
}

void validate(const DSparkTailParams& p) {
  if (p.seqs < 0 || p.block <= 0 || p.vocab <= 0 || p.dim <= 0 || p.rank <= 0)
    DI_THROW(InvalidArgument, "dspark_tail: bad shape seqs=", p.seqs, " block=", p.block, " vocab=", p.vocab,
             " dim=", p.dim, " rank=", p.rank);
  if (p.seqs > 65535) DI_THROW(InvalidArgument, "dspark_tail: ", p.seqs, " sequences > 65535");
  if (p.rank > 8192) DI_THROW(InvalidArgument, "dspark_tail: markov rank ", p.rank, " > 8192 (shared memory)");
  if (p.seqs > 0 && (!p.logits || !p.xhat || !p.mk_embed || !p.mk_head || !p.conf || !p.anchor || !p.num_drafts ||
                     !p.tokens || !p.logprobs || !p.conf_logits))
    DI_THROW(InvalidArgument, "dspark_tail: a null pointer among logits, xhat, mk_embed, mk_head, conf, anchor, "
             "num_drafts, tokens, logprobs, conf_logits");
}
}  // namespace

void dspark_tail(const DSparkTailParams& p, cudaStream_t stream) {
  validate(p);
  if (p.seqs == 0) return;
  dspark_tail_kernel<<<unsigned(p.seqs), kTailThreads, size_t(p.rank) * sizeof(float), stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void dspark_tail_host(const DSparkTailParams& p) {
  validate(p);
  const int64_t V = p.vocab, Rk = p.rank, D = p.dim;
  for (int64_t j = 0; j < p.seqs; ++j) {
    int64_t prev = p.anchor[j];
    if (p.num_drafts[j] < 0 || p.num_drafts[j] > p.block)
      DI_THROW(InvalidArgument, "dspark_tail_host: sequence ", j, " drafts ", p.num_drafts[j], " of a block of ", p.block);
    for (int64_t i = 0; i < p.num_drafts[j]; ++i) {
      const int64_t t = j * p.block + i;
      if (prev < 0 || prev >= V) DI_THROW(InvalidArgument, "dspark_tail_host: sequence ", j, " token ", prev);
      const float* e = p.mk_embed + prev * Rk;
      float* row = p.logits + t * V;
      int64_t best = 0;
      for (int64_t v = 0; v < V; ++v) {
        float b = 0.f;
        for (int64_t k = 0; k < Rk; ++k) b += p.mk_head[v * Rk + k] * e[k];
        row[v] += b;
        if (row[v] > row[best]) best = v;
      }
      double s = 0, c = 0, c2 = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(double(row[v]) - double(row[best]));
      for (int64_t k = 0; k < D; ++k) c += double(p.conf[k]) * double(p.xhat[t * D + k]);
      for (int64_t k = 0; k < Rk; ++k) c2 += double(p.conf[D + k]) * double(e[k]);
      p.tokens[t] = int32_t(best);
      p.logprobs[t] = float(-std::log(s));
      p.conf_logits[t] = float(c + c2);
      prev = best;
    }
  }
}

}  // namespace deepinfer::model::ds::cuda
