#include "model/deepseek/cp_serving.h"

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/sequence_runner.h"
#include "parallel/wire.h"

namespace deepinfer::model::ds {
namespace {

enum Msg : uint8_t { kStop = 0, kStep = 1 };

// The batch and, per sequence, its slot state and the bytes of its blocks.
std::vector<uint8_t> encode_step(DeepseekModel& m, const ForwardBatch& b) {
  parallel::WireWriter w;
  w.put<uint8_t>(kStep);
  w.put_vec(b.token_ids);
  w.put_vec(b.logits_indices);
  w.put_vec(b.hidden_indices);
  w.put<uint64_t>(b.seqs.size());
  const size_t bb = m.backend().paged_block_bytes();
  std::vector<uint8_t> blocks;
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
    w.put_vec(blocks);
  }
  return w.bytes();
}

// Restores the state the message carries and returns its batch.
ForwardBatch decode_step(DeepseekModel& m, parallel::WireReader& r) {
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
    std::vector<uint8_t> blocks = r.get_vec<uint8_t>("blocks");
    if (blocks.size() != s.block_table.size() * bb)
      DI_THROW(InternalError, "context parallelism: ", blocks.size(), " block bytes for ", s.block_table.size(),
               " blocks of ", bb);
    std::vector<HostBlockCopy> copies;
    for (size_t k = 0; k < s.block_table.size(); ++k) copies.push_back({.block = s.block_table[k], .host = blocks.data() + k * bb});
    m.backend().copy_blocks_from_host(copies);
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
    model.set_step_hook([m, cp = cp.get()](const ForwardBatch& b) {
      if (b.num_tokens() < cp->options().min_tokens || cp->size() == 1) return;
      parallel::broadcast_bytes(cp->group(), encode_step(*m, b), 0);
    });
  }
  return cp;
}

void serve_context_parallel_helper(DeepseekModel& model, ContextParallel& cp) {
  DI_CHECK(cp.rank() > 0, "serve_context_parallel_helper on rank 0");
  int64_t steps = 0, bytes = 0;
  for (;;) {
    const std::vector<uint8_t> msg = parallel::broadcast_bytes(cp.group(), {}, 0);
    parallel::WireReader r(msg, "a context-parallel step from rank 0");
    if (r.get<uint8_t>("message") == kStop) {
      DI_INFO("context-parallel helper rank ", cp.rank(), ": served ", steps, " steps (", cp.split_steps(),
              " split), received ", bytes, " bytes of steps and state, ", cp.bytes_received(), " of attention rows");
      return;
    }
    ++steps, bytes += int64_t(msg.size());
    const ForwardBatch b = decode_step(model, r);
    model.run(b, {});
  }
}

void stop_context_parallel_helpers(ContextParallel& cp) {
  if (cp.rank() != 0 || cp.size() == 1 || cp.stopped()) return;
  cp.mark_stopped();
  parallel::WireWriter w;
  w.put<uint8_t>(kStop);
  parallel::broadcast_bytes(cp.group(), w.bytes(), 0);
}

}  // namespace deepinfer::model::ds
