// ProcessGroup: the collectives the parallel engine needs, over an existing library: gloo between
// CPU ranks (TCP, tests and CI), NCCL between GPUs. One process per rank; a group is a set of
// ranks that call the same collectives in the same order (STYLE.md: no globals; every group is an
// object its owner passes down).
//
// Buffers live where memory() says: host memory for gloo, device memory for NCCL, ordered on the
// group's stream (set_stream). Sizes are in bytes unless named counts; every rank passes the
// same `root`, and the same per-rank sizes where a collective needs them (all_to_all_v: rank r's
// send_bytes[q] equals rank q's recv_bytes[r]; exchange_counts() gets them for you).
//
// Errors: a peer that died or timed out (DEEPINFER_COLLECTIVE_TIMEOUT_S, default 600) throws
// deepinfer::InternalError naming the group, the rank and the collective, never hangs forever.
// Determinism: host groups reduce in rank order 0..size-1 whatever gloo's own algorithm would do;
// NCCL's float reductions are its own (nccl_group.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace deepinfer::parallel {

enum class Memory { kHost, kDevice };
enum class ReduceType { kF32, kI64 };
enum class ReduceOp { kSum, kMax, kMin };

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // "gloo tcp, 4 ranks", "nccl, 2 ranks on cuda:0"
  virtual Memory memory() const = 0;
  // Device groups order their work on this stream (a cudaStream_t); host groups ignore it.
  virtual void set_stream(void* stream) {}

  // Rank r sends send_bytes[q] bytes (packed back to back in rank order) to rank q and receives
  // recv_bytes[q] bytes from rank q (packed in rank order) into `recv`.
  virtual void all_to_all_v(const void* send, std::span<const int64_t> send_bytes, void* recv,
                            std::span<const int64_t> recv_bytes) = 0;
  // Every rank's `send_bytes` bytes, concatenated in rank order into `recv` (recv_bytes[q] = rank q's size).
  virtual void all_gather_v(const void* send, int64_t send_bytes, void* recv, std::span<const int64_t> recv_bytes) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // In place over `count` elements; floats summed in rank order.
  virtual void all_reduce(void* data, int64_t count, ReduceType type, ReduceOp op) = 0;
  // send [size * count] elements; rank r receives the rank-order sum of every rank's block r [count].
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, ReduceType type) = 0;
  virtual void barrier() = 0;
};

// ---- host-side conveniences built on the collectives (host groups only) ----

// recv_bytes for an all_to_all_v whose sends are `send_bytes` (an all-to-all of the counts).
std::vector<int64_t> exchange_counts(ProcessGroup& pg, std::span<const int64_t> send_bytes);
// Every rank's message, in rank order (sizes first, then the bytes).
std::vector<std::vector<uint8_t>> all_gather_bytes(ProcessGroup& pg, std::span<const uint8_t> message);
// Root's message on every rank.
std::vector<uint8_t> broadcast_bytes(ProcessGroup& pg, std::vector<uint8_t> message, int root);
// Variable all-to-all of messages: out[q] is what rank q sent to this rank.
std::vector<std::vector<uint8_t>> all_to_all_bytes(ProcessGroup& pg, const std::vector<std::vector<uint8_t>>& to);

// A group of one rank (no library): what a single-process engine runs with, so every path can be
// written for groups. Host memory.

std::unique_ptr<ProcessGroup> make_single_rank_group();

}  // namespace deepinfer::parallel
