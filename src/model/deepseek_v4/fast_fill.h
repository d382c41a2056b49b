// Fast random tensor filling and streamed safetensors writing for full-width bench stacks
// (RandomCheckpointOptions::fast in V4, the V4.1 stack writer). Counter-based: a tensor's bytes
// depend only on (key, element index), never on the thread count. Values ~N(mean, sd^2) as cheap
// triangular draws bounded at +-2.45 sd; FP8 e4m3 with one e8m0 scale per block; FP4 e2m1 codes
// from a table of normal quantiles with one power-of-two scale per tensor.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer::model::v4::fast {

uint64_t mix64(uint64_t x);  // splitmix64 finaliser
// FNV-1a of `name` seeded with `seed`: the stream key of one tensor.
uint64_t name_key(uint64_t seed, const std::string& name);
// Values i0 .. i0+n-1 of the stream `key`.
void normals(uint64_t key, uint64_t i0, int64_t n, float mean, float sd, float* out);
// Power-of-two scale (ue8m0) so that amax/scale <= qmax: 2^ceil(log2(amax/qmax)).
uint8_t e8m0_for(float amax, float qmax);

// FP8 e4m3 [R, C] with one e8m0 scale per br x bc block (scale [ceil(R/br), ceil(C/bc)]).
void fill_fp8(uint8_t* q, uint8_t* sc, int64_t R, int64_t C, int64_t br, int64_t bc, uint64_t key, float mean,
              float sd);
// Packed e2m1 [R, C/2] (element 2k in the low nibble) + e8m0 per b inputs [R, C/b].
void fill_fp4(uint8_t* q, uint8_t* sc, int64_t R, int64_t C, int64_t b, uint64_t key, float mean, float sd);
// n values as f32 (f32 = true) or bf16, written unaligned-safe.
void fill_float(uint8_t* dst, int64_t n, bool f32, uint64_t key, float mean, float sd);

// One stored tensor of a streamed file.
struct Piece {
  std::string name, st_dtype;
  Shape shape;
  uint64_t nbytes;
};
// Tensors written back to back (a weight and its scale); fill writes nbytes at dst.
struct Item {
  std::vector<Piece> pieces;
  uint64_t nbytes = 0;
  std::function<void(uint8_t* dst)> fill;
  void add(std::string name, const char* st_dtype, Shape shape, uint64_t bytes) {
    pieces.push_back({std::move(name), st_dtype, std::move(shape), bytes});
    nbytes += bytes;
  }
};
// Streams the items, in order, into `num_shards` files of roughly equal bytes (+ the index when
// more than one); each group of items is filled in parallel into one of two buffers while the
// other is written by a helper thread, so memory stays at two ~256 MB buffers.
void write_streamed(const std::string& dir, const std::vector<Item>& items, int num_shards, bool progress);

}  // namespace deepinfer::model::v4::fast
