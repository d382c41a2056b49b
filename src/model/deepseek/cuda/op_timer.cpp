#include "model/deepseek/cuda/op_timer.h"

#include <algorithm>

namespace deepinfer::model::ds::cuda {

void OpTimer::enable(bool on) {
  on_ = on;
  depth_ = 0;
  names_.clear();
}

size_t OpTimer::open(cudaStream_t st, std::string name) {
  const size_t i = names_.size();
  if (events_.size() <= i) events_.emplace_back(deepinfer::cuda::Event(true), deepinfer::cuda::Event(true));
  names_.push_back(std::move(name));
  events_[i].first.record(st);
  return i;
}

void OpTimer::close(cudaStream_t st, size_t pair) {
  --depth_;
  if (pair != kNested) events_[pair].second.record(st);
}

std::vector<OpTiming> OpTimer::take(cudaStream_t st) {
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  std::map<std::string, OpTiming> by_name;
  for (size_t i = 0; i < names_.size(); ++i) {
    OpTiming& t = by_name[names_[i]];
    t.op = names_[i];
    t.calls += 1;
    t.ms += double(events_[i].second.elapsed_ms_since(events_[i].first));
  }
  names_.clear();
  std::vector<OpTiming> out;
  for (auto& [name, t] : by_name) out.push_back(std::move(t));
  std::sort(out.begin(), out.end(), [](const OpTiming& a, const OpTiming& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace deepinfer::model::ds::cuda
