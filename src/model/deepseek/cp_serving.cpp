#include "model/deepseek/cp_serving.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/sequence_runner.h"
#include "parallel/wire.h"

namespace deepinfer::model::ds {
namespace {

// kStep: a split step (its batch and state); kJoin: a step the leader runs alone, whose MoE
// exchanges the helpers join with an empty step (expert parallelism over the CP group).
enum Msg : uint8_t { kStop = 0, kStep = 1, kJoin = 2 };

// 128-bit content hash of one block (two independent 64-bit mixes): equal hashes stand for equal
// bytes (a collision is ~2^-128 per comparison).
struct BlockHash {
  uint64_t a = 0, b = 0;
  bool operator==(const BlockHash&) const = default;
};
BlockHash hash_block(const uint8_t* p, size_t n) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x9e3779b97f4a7c15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    a = (a ^ w) * 0x100000001b3ull;
    b = (b + w) * 0xff51afd7ed558ccdull;
    b ^= b >> 33;
  }
  for (; i < n; ++i) a = (a ^ p[i]) * 0x100000001b3ull, b = (b + p[i]) * 0xc4ceb9fe1a85ec53ull;
  return {a, b};
}

// What the helpers hold in each block, as the leader knows it: the hash of the bytes last shipped
// for that block id, or of what a split step (which every rank runs from the same state, with
// byte-identical results) left there. A block whose leader bytes hash the same is not shipped
// again; everything a helper did not see (decode and short steps, drafter blocks, host-tier loads,
// prefix imports) changes the leader's bytes and so ships the block. A split step's blocks are
// unknown while it runs (a step that throws leaves them unknown: shipped next time).
struct BlockMirror {
  std::unordered_map<int32_t, BlockHash> held;
  int64_t shipped = 0, skipped = 0;
};

// The batch and, per sequence, its slot state and the blocks the helpers do not hold yet.
std::vector<uint8_t> encode_step(DeepseekModel& m, const ForwardBatch& b, BlockMirror& mirror) {
  parallel::WireWriter w;
  w.put<uint8_t>(kStep);
  if (b.device_inputs.empty()) {
    w.put_vec(b.token_ids);
  } else {
    // Asynchronous scheduling on the GPU: tokens the previous step sampled on the device are
    // placeholders here; the helpers get their ids (one small copy back, split steps only).
    int32_t n = 0;
    for (const DeviceInput& d : b.device_inputs) n = std::max(n, d.sample_row + 1);
    const std::vector<int32_t> drawn = m.backend().device_ids_to_host(b.sampled_ids, n);
    std::vector<int32_t> ids = b.token_ids;
    for (const DeviceInput& d : b.device_inputs) ids.at(size_t(d.token_index)) = drawn.at(size_t(d.sample_row));
    w.put_vec(ids);
  }
  w.put_vec(b.logits_indices);
  w.put_vec(b.hidden_indices);
  w.put<uint64_t>(b.seqs.size());
  const size_t bb = m.backend().paged_block_bytes();
  std::vector<uint8_t> blocks, ship;
  std::vector<uint8_t> flags;
  for (const SeqInBatch& s : b.seqs) {
    w.put<int32_t>(s.cache_slot);
    w.put_vec(s.block_table);
    w.put<int64_t>(s.num_computed_tokens);
    w.put<int32_t>(s.num_new_tokens);
    w.put<int64_t>(s.decoder_from);
    w.put_vec(m.backend().save_slot(s.cache_slot, s.num_computed_tokens).bytes);
    blocks.assign(s.block_table.size() * bb, 0);
    std::vector<HostBlockCopy> copies;
    for (size_t i = 0; i < s.block_table.size(); ++i) copies.push_back({.block = s.block_table[i], .host = blocks.data() + i * bb});
    m.backend().copy_blocks_to_host(copies);
    flags.assign(s.block_table.size(), 0);
    ship.clear();
    for (size_t i = 0; i < s.block_table.size(); ++i) {
      const uint8_t* p = blocks.data() + i * bb;
      const BlockHash h = hash_block(p, bb);
      auto it = mirror.held.find(s.block_table[i]);
      if (it != mirror.held.end() && it->second == h) {
        ++mirror.skipped;
        continue;
      }
      flags[i] = 1;
      ship.insert(ship.end(), p, p + bb);
      ++mirror.shipped;
    }
    w.put_vec(flags);
    w.put_vec(ship);
    // The step rewrites this sequence's blocks on every rank: unknown until it has run.
    for (int32_t id : s.block_table) mirror.held.erase(id);
  }
  return w.bytes();
}

// After a split step every rank's blocks of its sequences hold the same bytes: record them.
void note_split_step(DeepseekModel& m, const ForwardBatch& b, BlockMirror& mirror) {
  const size_t bb = m.backend().paged_block_bytes();
  std::vector<uint8_t> blocks;
  for (const SeqInBatch& s : b.seqs) {
    blocks.assign(s.block_table.size() * bb, 0);
    std::vector<HostBlockCopy> copies;
    for (size_t i = 0; i < s.block_table.size(); ++i) copies.push_back({.block = s.block_table[i], .host = blocks.data() + i * bb});
    m.backend().copy_blocks_to_host(copies);
    for (size_t i = 0; i < s.block_table.size(); ++i) mirror.held[s.block_table[i]] = hash_block(blocks.data() + i * bb, bb);
  }
}

// Restores the state the message carries and returns its batch.
ForwardBatch decode_step(DeepseekModel& m, parallel::WireReader& r, int64_t& blocks_received) {
  ForwardBatch b;
  b.token_ids = r.get_vec<int32_t>("token_ids");
  b.logits_indices = r.get_vec<int32_t>("logits_indices");
  b.hidden_indices = r.get_vec<int32_t>("hidden_indices");
  const uint64_t n = r.get<uint64_t>("seqs");
  const size_t bb = m.backend().paged_block_bytes();
  for (uint64_t i = 0; i < n; ++i) {
    SeqInBatch s;
    s.cache_slot = r.get<int32_t>("cache_slot");
    s.block_table = r.get_vec<int32_t>("block_table");
    s.num_computed_tokens = r.get<int64_t>("num_computed_tokens");
    s.num_new_tokens = r.get<int32_t>("num_new_tokens");
    s.decoder_from = r.get<int64_t>("decoder_from");
    m.backend().restore_slot(s.cache_slot, {.num_tokens = s.num_computed_tokens, .bytes = r.get_vec<uint8_t>("slot")});
    const std::vector<uint8_t> flags = r.get_vec<uint8_t>("block flags");
    std::vector<uint8_t> blocks = r.get_vec<uint8_t>("blocks");
    size_t n_ship = 0;
    for (uint8_t f : flags) n_ship += f != 0;
    if (flags.size() != s.block_table.size() || blocks.size() != n_ship * bb)
      DI_THROW(InternalError, "context parallelism: ", blocks.size(), " block bytes and ", flags.size(),
               " flags for ", s.block_table.size(), " blocks of ", bb, " (", n_ship, " shipped)");
    std::vector<HostBlockCopy> copies;
    for (size_t k = 0, j = 0; k < s.block_table.size(); ++k)
      if (flags[k]) copies.push_back({.block = s.block_table[k], .host = blocks.data() + bb * j++});
    m.backend().copy_blocks_from_host(copies);
    blocks_received += int64_t(copies.size());
    b.seqs.push_back(std::move(s));
  }
  r.expect_done();
  return b;
}

}  // namespace

std::shared_ptr<ContextParallel> enable_context_parallel(DeepseekModel& model, parallel::ProcessGroup& group,
                                                         int64_t min_tokens) {
  int64_t align = 1;
  for (const auto& p : model.arch().plan.layers) align = std::max(align, p.ratio);
  auto cp = std::make_shared<ContextParallel>(group, CpOptions{.min_tokens = min_tokens, .align = align});
  model.backend().set_context_parallel(cp);
  if (group.rank() == 0) {
    DeepseekModel* m = &model;
    auto mirror = std::make_shared<BlockMirror>();
    auto split = [cp = cp.get()](const ForwardBatch& b) {
      return b.num_tokens() >= cp->options().min_tokens && cp->size() > 1;
    };
    model.set_step_hook([m, cp = cp.get(), mirror, split](const ForwardBatch& b) {
      if (split(b)) {
        parallel::broadcast_bytes(cp->group(), encode_step(*m, b, *mirror), 0);
        cp->note_blocks_shipped(mirror->shipped, mirror->skipped);
      } else if (m->joins_collectives() && cp->size() > 1) {
        // Expert parallelism (set after this hook, so asked per step): every rank joins every
        // step's MoE exchanges, the helpers with no tokens.
        parallel::WireWriter w;
        w.put<uint8_t>(kJoin);
        parallel::broadcast_bytes(cp->group(), w.bytes(), 0);
        cp->note_joined_step();
      }
    });
    model.set_after_step_hook([m, mirror, split](const ForwardBatch& b) {
      if (split(b)) note_split_step(*m, b, *mirror);
    });
  }
  return cp;
}

void serve_context_parallel_helper(DeepseekModel& model, ContextParallel& cp) {
  DI_CHECK(cp.rank() > 0, "serve_context_parallel_helper on rank 0");
  int64_t steps = 0, bytes = 0, blocks = 0;
  for (;;) {
    const std::vector<uint8_t> msg = parallel::broadcast_bytes(cp.group(), {}, 0);
    parallel::WireReader r(msg, "a context-parallel step from rank 0");
    const uint8_t kind = r.get<uint8_t>("message");
    if (kind == kStop) {
      DI_INFO("context-parallel helper rank ", cp.rank(), ": served ", steps, " steps (", cp.split_steps(),
              " split, ", cp.joined_steps(), " joined empty), received ", bytes, " bytes of steps and state (",
              blocks, " paged blocks), ", cp.bytes_received(), " of attention rows");
      return;
    }
    if (kind == kJoin) {
      r.expect_done();
      if (!model.joins_collectives())
        DI_THROW(InternalError, "context-parallel helper rank ", cp.rank(), ": rank 0 runs expert-parallel steps, "
                 "this rank's model is not expert-parallel");
      model.run(ForwardBatch{}, {});
      cp.note_joined_step();
      continue;
    }
    if (kind != kStep) DI_THROW(InternalError, "context-parallel helper rank ", cp.rank(), ": message kind ", int(kind));
    ++steps, bytes += int64_t(msg.size());
    const ForwardBatch b = decode_step(model, r, blocks);
    model.run(b, {});
  }
}

void stop_context_parallel_helpers(ContextParallel& cp) {
  if (cp.rank() != 0 || cp.size() == 1 || cp.stopped()) return;
  cp.mark_stopped();
  DI_INFO("context-parallel leader: shipped ", cp.blocks_shipped(), " paged blocks to the helpers, ",
          cp.blocks_skipped(), " not shipped (the helpers held their bytes)");
  parallel::WireWriter w;
  w.put<uint8_t>(kStop);
  parallel::broadcast_bytes(cp.group(), w.bytes(), 0);
}

}  // namespace deepinfer::model::ds
