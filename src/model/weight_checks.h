// Load-time value checks on checkpoint tensors. A checkpoint whose floats hold NaN or Inf
// used to load and then give all-NaN logits and token 0 forever; the loader calls this once
// so the failure names the file and tensor instead.
#pragma once

namespace deepinfer::io {
class Checkpoint;
}

namespace deepinfer::model {

// Every element of every floating tensor in `ck` is finite: F32 / BF16 / F16 (no NaN or Inf),
// F8_E4M3 (e4m3fn: no NaN code 0x7F/0xFF), F8_E8M0 scales (no NaN code 0xFF). Packed FP4 and
// integer tensors have no non-finite codes. Throws CheckpointError
// "<shard>: tensor '<name>' holds NaN at element <i> (of <n>)" for the first one found (in
// name order, then element order). Scans every byte once, in parallel: about the cost of
// reading the checkpoint, which the backends do anyway when they prepare their weights.
void check_finite_weights(const io::Checkpoint& ck);

}  // namespace deepinfer::model
