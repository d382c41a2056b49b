// Where each entry of V4.1's tensor table goes in the prepared ds::ModelRef the shared forward
// reads, in one place for both preparations: the CPU's (prepare_cpu.cpp: exact f32 copies) and the
// GPU upload's (deepseek/cuda/v41_cuda_model.cpp: the stored FP8 / FP4 bytes as the device keeps
// them, one entry at a time). v41_device_table expresses the table in the form the shared device
// uploader walks (deepseek_v4/tensors.h's TensorEntry: kind, role, parts as v4::Linear views,
// target); the Engram tables (host memory) and q_weight ⊙ k_weight (a product of two entries) are
// the callers' own steps.
#pragma once
#include <cstdint>

#include "model/deepseek/prepared.h"
#include "model/deepseek_v4/tensors.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer::model::v41 {

struct V41Target {
  enum Kind : uint8_t {
    kNone,         // not read by the main model (bias_vl, DSpark stages)
    kLinear,       // -> *lin
    kVec,          // -> *vec
    kExpert,       // -> *lin (a routed expert's W1|W3 or W2; the layer's expert list is sized)
    kEngramTable,  // -> *engram (table, scale: host memory)
    kEngramQ,      // engram.q_weight: first factor of engram->w
    kEngramK,      // engram.k_weight: second factor of engram->w
  } kind = kNone;
  ds::LinearRef* lin = nullptr;
  ds::VecRef* vec = nullptr;
  ds::EngramRef* engram = nullptr;
};

// Resolves entry `e` into `m` (m.layers sized to the main layers), creating what the entry needs
// (a compressor with its ratio and width, the layer's expert list). InternalError for an entry
// with no target.
V41Target v41_target(const DeepseekV41Config& c, const ModelPlan& plan, const V41Entry& e, ds::ModelRef& m);

// Points `g` at the stored Engram table `l` (FP8 rows + E8M0 scales, or bf16/f32 rows).
void v41_engram_table_ref(const v4::Linear& l, ds::EngramRef& g);

// The main model's linears and floats as v4 TensorEntries: parts are views of `w`'s parts and
// targets point into `m` (both may be null: shapes only, for the memory plan). kDense -> kDense,
// kExpert -> kExpert (contiguous per layer), kPlain -> kPlain, kEmbed / kHead as such, kFloat ->
// kFloat; Engram tables, Engram q/k weights, unused and DSpark entries are not in it.
v4::TensorTable v41_device_table(const DeepseekV41Config& c, const ModelPlan& plan, const V41Weights* w,
                                 ds::ModelRef* m);

}  // namespace deepinfer::model::v41
