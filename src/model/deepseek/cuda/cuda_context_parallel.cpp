// Context parallelism on the CUDA backend (context_parallel.h): the forward splits a long
// prefill's attention core by rows exactly as on the CPU (forward.cpp own_rows: the kernels get
// pointer-shifted row ranges), and the one collective of a split layer, the all-gather of the
// attention output rows, goes through the host group: the step's [T, H*d] rows are copied to the
// host, exchanged, and copied back. That costs a stream sync and two copies of T*H*d activations
// per main layer of a split step — small against a long prefill's attention; the device-side
// exchange belongs with NCCL expert parallelism (docs/PARALLEL.md).
#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/context_parallel.h"
#include "model/deepseek/cuda/cuda_backend.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;

void CudaBackend::set_context_parallel(std::shared_ptr<ContextParallel> cp) {
  if (cp && ep_)
    DI_THROW(InvalidArgument, describe(), ": context parallelism together with expert parallelism is not built on the "
             "GPU backend (the CPU backend runs both over one group)");
  cp_ = std::move(cp);
}

void CudaBackend::gather_cp_rows(ContextParallel& cp, void* buf, int64_t T, int64_t row_bytes) {
  DI_CHECK(T == plan_.T, "gather_cp_rows: ", T, " rows in a step of ", plan_.T);
  const size_t bytes = size_t(T) * size_t(row_bytes);
  cp_stage_.resize(bytes);
  const cudaStream_t st = stream_.get();
  // Only the rows this rank computed need to leave the device; the others are overwritten by
  // the gather. Copy each own span, synchronously (the group reads the host buffer next).
  for (const parallel::CpSpan& s : cp.own_rows())
    dc::copy_d2h(cp_stage_.data() + s.begin * row_bytes, static_cast<const char*>(buf) + s.begin * row_bytes,
                 size_t(s.size() * row_bytes), st, false);
  stream_.synchronize();
  cp.gather_rows(cp_stage_.data(), row_bytes);
  for (int r = 0; r < cp.size(); ++r) {
    if (r == cp.rank()) continue;
    for (const parallel::CpSpan& s : cp.rows_of(r))
      dc::copy_h2d(static_cast<char*>(buf) + s.begin * row_bytes, cp_stage_.data() + s.begin * row_bytes,
                   size_t(s.size() * row_bytes), st, false);
  }
  // The host buffer is reused by the next layer's gather: the copies out of it must have run.
  stream_.synchronize();
}

}  // namespace deepinfer::model::ds::cuda
