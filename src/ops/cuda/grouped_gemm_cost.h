// What one pass of the grouped expert GEMM (grouped_gemm.h) costs on the H200, for schedulers
// that choose how long a prefill chunk should be (CudaBackend::prefill_weight_pass_tokens).
//
// A grouped GEMM over E experts costs about  pass + flops / rate:  a fixed part per launch that does
// not shrink with fewer rows (every expert's weights are read and dequantised into shared memory
// once per 64 x 256 tile column, whatever the rows), and a per-row part at close to the tensor
// cores' rate. Fitted to the kernel timings of docs/PERFORMANCE.md ("Round two", session 13: V4-
// Flash up N 4096 K 4096 / down N 4096 K 2048, 256 experts, top-6, at 64, 512 and 4,096 tokens):
// FP4 up 1.98 / 2.68 / 3.33 ms, down 1.04 / 1.43 / 1.76 ms: the fixed part is the weight bytes
// (scales included) at ~1.15 TB/s, not the 4.3 TB/s a copy reaches, because the dequantisation,
// not the memory, bounds it; FP8 (table decode) 2.77 / - / 4.33 ms up: ~1.55 TB/s. bf16 weights are
// read as they are: the copy rate. Replace these when the kernel changes (they are measurements of
// one kernel, not properties of the format).
#pragma once

#include "ops/cuda/grouped_gemm.h"

namespace deepinfer::ops::cuda {

// Bytes per second at which one grouped-GEMM pass streams experts stored in `f` (its fixed part).
constexpr double grouped_gemm_pass_bytes_per_s(ExpertFormat f) {
  return f == ExpertFormat::kFP4 ? 1.15e12 : f == ExpertFormat::kFP8 ? 1.55e12 : 4.3e12;
}

}  // namespace deepinfer::ops::cuda
