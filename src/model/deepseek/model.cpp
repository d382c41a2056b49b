#include "model/deepseek/model.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/expert_parallel.h"
#include "model/deepseek/mtp_drafter.h"

namespace deepinfer::model::ds {

DeepseekModel::DeepseekModel(ModelInfo info, Arch arch, std::vector<kv::LayerCacheSpec> specs,
                             std::unique_ptr<ModelBackend> be, std::shared_ptr<void> keepalive)
    : info_(std::move(info)), arch_(std::move(arch)), specs_(std::move(specs)), be_(std::move(be)),
      keepalive_(std::move(keepalive)) {
  DI_CHECK(be_ != nullptr, "DeepseekModel without a backend");
  if (!arch_.plan.drafter.empty()) drafter_ = std::make_unique<MtpDrafter>(*this);
}

DeepseekModel::~DeepseekModel() = default;

std::string DeepseekModel::describe() const {
  std::ostringstream os;
  os << info_.architecture << ": " << info_.summary << ", mtp " << arch_.plan.drafter.size() << ", backend "
     << be_->describe();
  return os.str();
}

kv::CacheGeometry DeepseekModel::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  return be_->plan_cache(budget_bytes, max_slots);
}

void DeepseekModel::allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot) {
  kv::CacheGeometry g;
  g.block_tokens = kv::default_block_tokens(specs_);
  g.num_slots = slots;
  g.num_blocks = slots * std::max<int64_t>(1, (max_tokens_per_slot + g.block_tokens - 1) / g.block_tokens);
  allocate_cache(g);
}

void DeepseekModel::reset_slot(int32_t slot) {
  be_->reset_slot(slot);
  if (size_t(slot) < slot_extent_.size()) slot_extent_[size_t(slot)] = {};
}

void DeepseekModel::note_writes(const ForwardBatch& batch, bool target) {
  const int64_t slots = be_->cache_geometry().num_slots;
  if (int64_t(slot_extent_.size()) != slots) slot_extent_.assign(size_t(slots), {});
  for (const SeqInBatch& s : batch.seqs) {
    SlotExtent& e = slot_extent_[size_t(s.cache_slot)];  // validate_forward_batch checked the slot
    const int64_t end = s.num_computed_tokens + s.num_new_tokens;
    e.written_end = std::max(e.written_end, end);
    if (target) e.length = end;
  }
}

void DeepseekModel::rollback(int32_t slot, int64_t num_tokens, int64_t keep) {
  CausalLM::rollback(slot, num_tokens, keep);
  if (size_t(slot) < slot_extent_.size()) slot_extent_[size_t(slot)].length = keep;
}

bool DeepseekModel::can_save_slot(int32_t slot, int64_t n) const {
  if (slot < 0 || size_t(slot) >= slot_extent_.size()) return n == 0;
  const SlotExtent& e = slot_extent_[size_t(slot)];
  return n >= 0 && n <= e.length && e.written_end - n <= max_rollback();
}

void DeepseekModel::check_saveable(int32_t slot, int64_t n) const {
  if (can_save_slot(slot, n)) return;
  const SlotExtent e = size_t(slot) < slot_extent_.size() ? slot_extent_[size_t(slot)] : SlotExtent{};
  DI_THROW(InvalidArgument, describe(), ": slot ", slot, " cannot be saved at ", n, " positions (it holds ",
           e.length, ", rings written to ", e.written_end, ", rollback ", max_rollback(), ")");
}

SlotSnapshot DeepseekModel::save_slot(int32_t slot, int64_t n) {
  check_saveable(slot, n);
  return be_->save_slot(slot, n);
}

std::unique_ptr<PendingSlotSaves> DeepseekModel::queue_save_slots(std::span<const SlotSave> saves) {
  for (const SlotSave& s : saves) check_saveable(s.slot, s.num_tokens);
  return be_->queue_save_slots(saves);
}

void DeepseekModel::restore_slot(int32_t slot, const SlotSnapshot& snap) {
  be_->restore_slot(slot, snap);
  const int64_t slots = be_->cache_geometry().num_slots;
  if (int64_t(slot_extent_.size()) != slots) slot_extent_.assign(size_t(slots), {});
  slot_extent_[size_t(slot)] = {snap.num_tokens, snap.num_tokens};
}

void DeepseekModel::check_blocks(std::span<const HostBlockCopy> copies, const char* what) const {
  const int64_t B = be_->cache_geometry().num_blocks;
  for (size_t i = 0; i < copies.size(); ++i)
    if (copies[i].block < 0 || copies[i].block >= B || !copies[i].host)
      DI_THROW(InvalidArgument, describe(), ": ", what, " copy ", i, ": block ", copies[i].block, " of ", B,
               copies[i].host ? "" : " without host memory");
}

void DeepseekModel::copy_blocks_to_host(std::span<const HostBlockCopy> copies) {
  check_blocks(copies, "copy_blocks_to_host");
  be_->copy_blocks_to_host(copies);
}

void DeepseekModel::copy_blocks_from_host(std::span<const HostBlockCopy> copies) {
  check_blocks(copies, "copy_blocks_from_host");
  be_->copy_blocks_from_host(copies);
}

std::shared_ptr<uint8_t> DeepseekModel::allocate_host_memory(size_t bytes) {
  if (auto p = be_->allocate_host_memory(bytes)) return p;
  return CausalLM::allocate_host_memory(bytes);
}

bool DeepseekModel::needs_tail_windows(const ForwardBatch& batch) const {
  if (arch_.plan.replay_keep == 0) return false;
  const int64_t W = arch_.plan.layers.empty() ? 0 : arch_.plan.layers.front().window;
  for (const SeqInBatch& s : batch.seqs)
    if (s.num_new_tokens > 0 && s.decoder_from > std::max<int64_t>(0, s.num_computed_tokens - W + 1)) return true;
  return false;
}

std::optional<ForwardBatch> DeepseekModel::split_replay(const ForwardBatch& batch,
                                                        std::optional<ForwardBatch>& tail) const {
  bool split = false;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqInBatch& s = batch.seqs[i];
    if (s.decoder_from > 0 && arch_.plan.replay_keep == 0)
      DI_THROW(InvalidArgument, describe(), ": seqs[", i, "].decoder_from ", s.decoder_from,
               " but the model runs no bounded replay (replay_keep() = 0)");
    split = split || (s.num_new_tokens > 0 && s.decoder_from > s.num_computed_tokens);
  }
  if (!split) return std::nullopt;
  // Token i of the batch -> its index in the head (encoder-only) or tail batch, -1 where absent.
  const int64_t T = batch.num_tokens();
  std::vector<int32_t> to_tail(size_t(T), -1);
  ForwardBatch head, rest;
  int64_t t = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqInBatch& s = batch.seqs[i];
    const int64_t a = s.num_computed_tokens, b = a + s.num_new_tokens;
    const int64_t cut = std::clamp(s.decoder_from, a, b);
    if (cut > a) {
      head.seqs.push_back({s.cache_slot, s.block_table, a, int32_t(cut - a), 0});
      head.token_ids.insert(head.token_ids.end(), batch.token_ids.begin() + t, batch.token_ids.begin() + t + (cut - a));
    }
    if (b > cut) {
      rest.seqs.push_back({s.cache_slot, s.block_table, cut, int32_t(b - cut), s.decoder_from});
      for (int64_t p = cut; p < b; ++p) {
        to_tail[size_t(t + p - a)] = int32_t(rest.token_ids.size());
        rest.token_ids.push_back(batch.token_ids[size_t(t + p - a)]);
      }
    }
    t += b - a;
  }
  auto remap = [&](const std::vector<int32_t>& rows, const char* what) {
    std::vector<int32_t> out;
    for (int32_t r : rows) {
      if (r < 0 || r >= T) DI_THROW(InvalidArgument, describe(), ": ", what, " row index ", r, " outside [0, ", T, ")");
      if (to_tail[size_t(r)] < 0)
        DI_THROW(InvalidArgument, describe(), ": ", what, " row of token ", r, " lies before its sequence's kept tail ",
                 "(bounded replay computes only the tail there; prompt logprobs need full prefill)");
      out.push_back(to_tail[size_t(r)]);
    }
    return out;
  };
  rest.logits_indices = remap(batch.logits_indices, "a logits");
  rest.hidden_indices = remap(batch.hidden_indices, "a hidden");
  for (const DeviceInput& d : batch.device_inputs) {
    if (d.token_index < 0 || d.token_index >= T)
      DI_THROW(InvalidArgument, describe(), ": device input at token ", d.token_index, " outside [0, ", T, ")");
    if (to_tail[size_t(d.token_index)] < 0)
      DI_THROW(InvalidArgument, describe(), ": a device input at token ", d.token_index, " before its kept tail");
    rest.device_inputs.push_back({to_tail[size_t(d.token_index)], d.sample_row});
  }
  rest.sampled_ids = batch.sampled_ids;
  if (!rest.token_ids.empty()) tail = std::move(rest);
  return head;
}

StepPlan DeepseekModel::plan_step(const ForwardBatch& batch, bool allow_fixed) const {
  const StepPlanDims dims{.n_streams = arch_.dims.streams, .index_topk = arch_.dims.index_topk,
                          .topk_experts = arch_.dims.topk};
  if (allow_fixed)
    if (const auto f = be_->fixed_shape(batch))
      return build_fixed_step_plan(specs_, dims, be_->cache_geometry(), batch, f->padded, *f->caps);
  return build_step_plan(specs_, dims, be_->cache_geometry(), batch);
}

ForwardOutput DeepseekModel::run(const ForwardBatch& batch, const ForwardOptions& options) {
  validate_forward_batch(batch, be_->cache_geometry(), be_->cache_allocated(), arch_.dims.vocab);
  if (shard_ && !be_->joins_collectives())
    DI_THROW(InvalidArgument, describe(), ": holds only the routed experts of rank ", shard_->rank, " of ",
             shard_->size, "; it runs inside an expert-parallel group (enable_expert_parallel) only");
  if (options.logits_on_device && !be_->logits_on_device())
    DI_THROW(InternalError, describe(), ": logits_on_device on a backend without device logits");
  if (!batch.device_inputs.empty() && !supports_device_inputs())
    DI_THROW(InvalidArgument, describe(), ": a batch with device_inputs on a backend without device memory");
  if (step_hook_) step_hook_(batch);
  ForwardOutput out = run_checked(batch, options);
  if (after_step_hook_ && batch.num_tokens() > 0) after_step_hook_(batch);
  return out;
}

ForwardOutput DeepseekModel::run_checked(const ForwardBatch& batch, const ForwardOptions& options) {
  if (batch.num_tokens() == 0) {
    // An empty step still joins the MoE exchanges when they are collective (expert parallelism:
    // this rank's peers wait for its all-to-alls).
    if (be_->joins_collectives()) {
      be_->begin_step(plan_step(batch, /*allow_fixed=*/false));
      be_->launch([&] { collectives_step(*be_, arch_, be_->weights()); }, ModelBackend::kTargetGraph);
    }
    return be_->end_step(options, 0, 0);
  }
  std::optional<ForwardBatch> tail;
  if (std::optional<ForwardBatch> head = split_replay(batch, tail)) {
    // Bounded replay: the positions before their tails through the encoder side first (an
    // ordinary chunk of those sequences), then the rest of the batch through every layer.
    if (be_->joins_collectives())
      DI_THROW(InvalidArgument, describe(), ": bounded replay (DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact) with "
               "expert parallelism is not built (the ranks' MoE exchanges would not pair up); use full prefill");
    note_writes(*head, /*target=*/true);
    before_step(*head);
    be_->set_device_inputs({}, nullptr);
    be_->begin_step(plan_step(*head, /*allow_fixed=*/false));
    be_->launch([&] { encoder_step(*be_, arch_, be_->weights()); }, ModelBackend::kTargetGraph);
    if (!tail) return be_->end_step(options, 0, 0);
    be_->end_step({}, 0, 0);
    return run_planned(*tail, options);
  }
  return run_planned(batch, options);
}

ForwardOutput DeepseekModel::run_planned(const ForwardBatch& batch, const ForwardOptions& options) {
  const int64_t R = int64_t(batch.logits_indices.size()), Rh = int64_t(batch.hidden_indices.size());
  note_writes(batch, /*target=*/true);
  before_step(batch);
  StepPlan plan = plan_step(batch, /*allow_fixed=*/!needs_tail_windows(batch));
  be_->set_device_inputs(batch.device_inputs, batch.sampled_ids);
  // A fixed-shape step computes every padded row (its launches must not depend on the batch).
  const int64_t R_run = plan.fixed ? plan.T : R;
  const int64_t Rh_run = plan.fixed ? (Rh > 0 ? plan.T : 0) : Rh;
  be_->begin_step(std::move(plan));
  be_->launch([&] { forward_step(*be_, arch_, be_->weights(), R_run, Rh_run); }, ModelBackend::kTargetGraph);
  return be_->end_step(options, R, Rh);
}

ForwardOutput DeepseekModel::run_mtp(const ForwardBatch& batch, const HiddenRows& target, int64_t k,
                                     const ModelBackend::RowRanges& rows, const ForwardOptions& options) {
  validate_forward_batch(batch, be_->cache_geometry(), be_->cache_allocated(), arch_.dims.vocab);
  if (k < 0 || k >= num_mtp_blocks())
    DI_THROW(InvalidArgument, "run_mtp: block ", k, " but the model has ", num_mtp_blocks(), " MTP blocks");
  const ModelBackend::RowRanges all{{0, target.rows}};
  const ModelBackend::RowRanges& ranges = rows.empty() ? all : rows;
  int64_t fed = 0;
  for (const auto& r : ranges) fed += r.second;
  if (fed != batch.num_tokens() || target.row_elems != arch_.dims.streams * arch_.dims.hidden)
    DI_THROW(InvalidArgument, "run_mtp: ", fed, " target hidden rows of ", target.row_elems, " values for ",
             batch.num_tokens(), " tokens of ", arch_.dims.streams * arch_.dims.hidden);
  const int64_t R = int64_t(batch.logits_indices.size()), Rh = int64_t(batch.hidden_indices.size());
  if (options.logits_on_device && !be_->logits_on_device())
    DI_THROW(InternalError, describe(), ": logits_on_device on a backend without device logits");
  if (batch.num_tokens() == 0) return be_->end_step(options, 0, 0);
  if (!batch.device_inputs.empty()) DI_THROW(InvalidArgument, "run_mtp: device_inputs are not supported");
  note_writes(batch, /*target=*/false);
  // Draft rounds are decode/verify shaped: the backend's fixed-shape path (graphs) takes them as
  // it takes the target's steps; padded rows run on zero streams.
  StepPlan plan = plan_step(batch, /*allow_fixed=*/mtp_fixed_shapes_);
  const bool fixed = plan.fixed;
  const int64_t T = plan.T;
  const float* main_hidden = be_->stage_hidden(target, ranges, fixed ? T : 0);
  const int64_t R_run = fixed ? T : R, Rh_run = fixed ? (Rh > 0 ? T : 0) : Rh;
  be_->set_device_inputs({}, nullptr);
  be_->begin_step(std::move(plan));
  be_->launch([&] { mtp_step(*be_, arch_, be_->weights(), k, main_hidden, R_run, Rh_run); },
              ModelBackend::kMtpGraph + int32_t(k));
  return be_->end_step(options, R, Rh);
}

void DeepseekModel::enable_expert_parallel(parallel::ProcessGroup& group, const ExpertParallelOptions& options) {
  const int32_t E = int32_t(arch_.dims.experts), n = group.size();
  if (options.num_redundant_experts < 0)
    DI_THROW(InvalidArgument, "LLMConfig.num_redundant_experts must be >= 0, got ", options.num_redundant_experts);
  // Before any load is known: experts dealt out in contiguous ranges, the spare slots repeating
  // experts from the start (parallel::ExpertShard); EPLB re-places them by load.
  const parallel::ExpertShard start{.rank = group.rank(), .size = n, .num_redundant = options.num_redundant_experts};
  if (shard_) {
    if (shard_->rank != start.rank || shard_->size != start.size || shard_->num_redundant != start.num_redundant)
      DI_THROW(InvalidArgument, "expert parallelism: this model holds the experts of rank ", shard_->rank, " of ",
               shard_->size, " (", shard_->num_redundant, " redundant), but joins rank ", start.rank, " of ", start.size,
               " (", start.num_redundant, " redundant)");
    if (options.enable_eplb && be_->expert_weight_store() == nullptr)
      DI_THROW(InvalidArgument, "expert parallelism: EPLB re-places experts, but this model holds only its shard and ",
               be_->describe(), " cannot move expert weights between ranks; load every expert to use EPLB");
  }
  std::vector<parallel::ExpertPlacement> layers(size_t(arch_.plan.num_layers()), start.placement(E));
  const EplbOptions eplb{.enabled = options.enable_eplb, .window_steps = options.eplb_window_size,
                         .step_interval = options.eplb_step_interval};
  auto ep = std::make_shared<ExpertParallel>(group, std::move(layers), eplb);
  // A sharded model's re-placements move weights (the gained experts from their old holders).
  if (shard_ && options.enable_eplb) ep->set_weight_store(be_->expert_weight_store());
  if (options.device_exchange) ep->set_device_exchange(options.device_exchange);  // before the backend sees ep
  be_->set_expert_parallel(std::move(ep));
}

}  // namespace deepinfer::model::ds
