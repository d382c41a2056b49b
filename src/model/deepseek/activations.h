// Sizes of the shared forward's named step buffers (backend.h Buf), from the model's dimensions and
// a step plan: the one place both backends (and the GPU memory plan) take them from.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/deepseek/backend.h"
#include "model/deepseek/forward.h"

namespace deepinfer::model::ds {

struct StepSizes {
  int64_t T = 0;           // new tokens
  int64_t win_rows = 0;    // staged window rows
  int64_t stage_rows = 0;  // max staged compressor rows over kinds
  int64_t entries = 0;     // max emitted entries over kinds
  int64_t R = 0;           // logits rows
  int64_t Rh = 0;          // hidden rows
};
StepSizes step_sizes(const StepPlan& plan);

struct BufferSize {
  int64_t elems = 0;
  size_t elem_bytes = 4;
  size_t bytes() const { return size_t(elems) * elem_bytes; }
};
// act_bytes: the backend's activation element size (4: f32, 2: bf16).
BufferSize buffer_size(Buf b, const Dims& g, const StepSizes& s, size_t act_bytes);

}  // namespace deepinfer::model::ds
