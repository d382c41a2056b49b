// Per-operation device timing for benchmarks (CausalLM::set_op_profiling): each top-level op of
// the CUDA backend opens a Scope, which records one timing event before and one after the op's
// launches on the step stream; take() waits for the stream and sums the elapsed times by op name.
// Ops called from inside another op (linear -> linear_fp8) are part of the outer op's time.
// Off (the default), a Scope is one branch and builds no name.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/outputs.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {

class OpTimer {
 public:
  class Scope {
   public:
    Scope(OpTimer* t, cudaStream_t st, size_t pair) : t_(t), st_(st), pair_(pair) {}
    Scope(Scope&& o) noexcept : t_(std::exchange(o.t_, nullptr)), st_(o.st_), pair_(o.pair_) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (t_) t_->close(st_, pair_);
    }

   private:
    OpTimer* t_;
    cudaStream_t st_;
    size_t pair_;
  };

  bool on() const { return on_; }
  void enable(bool on);
  // `name()` is called only when timing is on and no other op is open.
  template <class NameFn>
  Scope scope(cudaStream_t st, NameFn&& name) {
    if (!on_) return Scope(nullptr, st, 0);
    if (depth_++ > 0) return Scope(this, st, kNested);
    return Scope(this, st, open(st, name()));
  }
  // Waits for `st`, returns the sums since enable(true) or the last take(), largest first.
  std::vector<OpTiming> take(cudaStream_t st);

 private:
  static constexpr size_t kNested = ~size_t(0);
  size_t open(cudaStream_t st, std::string name);
  void close(cudaStream_t st, size_t pair);

  bool on_ = false;
  int depth_ = 0;
  std::vector<std::pair<deepinfer::cuda::Event, deepinfer::cuda::Event>> events_;  // reused across takes
  std::vector<std::string> names_;  // [used pairs]
};

}  // namespace deepinfer::model::ds::cuda
