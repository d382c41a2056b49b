#include "model/deepseek/context_parallel.h"

#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/backend.h"

namespace deepinfer::model::ds {

ContextParallel::ContextParallel(parallel::ProcessGroup& group, CpOptions options)
    : group_(group), options_(options), rows_(size_t(group.size())) {
  if (options_.min_tokens < 2)
    DI_THROW(InvalidArgument, "context parallelism: min_tokens ", options_.min_tokens,
             " (the threshold below which a step is not split) must be at least 2");
  if (options_.align < 1) DI_THROW(InvalidArgument, "context parallelism: align ", options_.align, " must be >= 1");
  if (group_.memory() != parallel::Memory::kHost)
    DI_THROW(InvalidArgument, "context parallelism runs over a host group (gloo) only, not ", group_.describe());
}

void ContextParallel::begin_step(const StepPlan& plan) {
  active_ = group_.size() > 1 && !plan.fixed && plan.T >= options_.min_tokens;
  T_ = plan.T;
  for (auto& r : rows_) r.clear();
  if (!active_) return;
  // The rows of one prefill are consecutive positions; the plan is made in absolute positions so
  // the chunk boundaries are aligned there. A batch of several sequences is split the same way
  // (correct for any split of the rows, balanced for one sequence).
  const int64_t p0 = plan.pos[0];
  plan_ = parallel::balanced_cp_plan(p0, plan.T, int32_t(group_.size()), options_.align);
  for (int r = 0; r < group_.size(); ++r)
    for (const parallel::CpSpan& s : plan_.spans[size_t(r)]) rows_[size_t(r)].push_back({s.begin - p0, s.end - p0});
  ++split_steps_;
}

void ContextParallel::gather_rows(void* buf, int64_t row_bytes) {
  DI_CHECK(active_, "context parallelism: gather_rows outside a split step");
  auto* b = static_cast<uint8_t*>(buf);
  const int n = group_.size();
  std::vector<int64_t> recv_bytes(size_t(n), 0);
  for (int r = 0; r < n; ++r)
    for (const parallel::CpSpan& s : rows_[size_t(r)]) recv_bytes[size_t(r)] += s.size() * row_bytes;
  send_.clear();
  for (const parallel::CpSpan& s : own_rows())
    send_.insert(send_.end(), b + s.begin * row_bytes, b + s.end * row_bytes);
  int64_t total = 0;
  for (int64_t x : recv_bytes) total += x;
  recv_.resize(size_t(total));
  group_.all_gather_v(send_.data(), int64_t(send_.size()), recv_.data(), recv_bytes);
  int64_t off = 0;
  for (int r = 0; r < n; ++r) {
    for (const parallel::CpSpan& s : rows_[size_t(r)]) {
      const int64_t bytes = s.size() * row_bytes;
      if (r != rank()) std::memcpy(b + s.begin * row_bytes, recv_.data() + off, size_t(bytes));
      off += bytes;
    }
  }
  bytes_received_ += total - int64_t(send_.size());
  ++gathers_;
}

void Backend::gather_cp_rows(ContextParallel& cp, void* buf, int64_t /*T*/, int64_t row_bytes) {
  cp.gather_rows(buf, row_bytes);
}

}  // namespace deepinfer::model::ds
