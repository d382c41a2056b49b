#include "model/deepseek_v41/model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek_v41/plan.h"
#include "model/deepseek_v41/prepare.h"
#include "model/deepseek_v41/weights.h"
#include "model/plan/cache_specs.h"

namespace deepinfer::model::v41 {

ds::ModelInfo v41_model_info(const DeepseekV41Config& c) {
  std::ostringstream os;
  os << c.num_layers << " layers [" << c.schedule_str() << "], D=" << c.hidden_size << ", H=" << c.num_heads << "x"
     << c.head_dim << ", experts " << c.n_routed_experts << " top-" << c.num_experts_per_tok << ", Engram "
     << c.engram.layer_ids.size() << " layers";
  return {.architecture = "DeepseekV41ForCausalLM", .summary = os.str(), .max_model_len = c.max_position_embeddings,
          .eos_token_id = c.eos_token_id, .bos_token_id = c.bos_token_id};
}

DeepseekV41Model::DeepseekV41Model(ds::ModelInfo info, ds::Arch arch, std::vector<kv::LayerCacheSpec> specs,
                                   std::unique_ptr<ds::ModelBackend> be, std::shared_ptr<void> keepalive,
                                   DeepseekV41Config cfg, std::optional<EngramHasher> hasher,
                                   std::unique_ptr<DSparkDrafter> dspark)
    : DeepseekModel(std::move(info), std::move(arch), std::move(specs), std::move(be), std::move(keepalive)),
      cfg_(std::move(cfg)), hasher_(std::move(hasher)), dspark_(std::move(dspark)) {
  if (!hasher_) return;
  engram_ = std::make_unique<EngramSlots>(*hasher_, max_rollback());
  const ds::ModelRef& w = backend().weights();
  for (int64_t i = 0; i < hasher_->num_layers(); ++i) {
    const ds::EngramRef& g = w.layers.at(size_t(hasher_->layer_id(i))).engram;
    if (!g.defined()) DI_THROW(InternalError, cfg_.origin, ": Engram layer ", hasher_->layer_id(i), " has no table");
    tables_.push_back(&g);
  }
}

DeepseekV41Model::~DeepseekV41Model() = default;

std::unique_ptr<DeepseekV41Model> DeepseekV41Model::load(const std::string& dir, const ModelOptions& o) {
  return load(dir, o, {});
}

std::unique_ptr<DeepseekV41Model> DeepseekV41Model::load(const std::string& dir, const ModelOptions& o,
                                                         const BackendMaker& make) {
  DeepseekV41Config cfg = DeepseekV41Config::from_file(dir);
  V41Weights w = V41Weights::load(dir, cfg, o.progress);
  std::optional<EngramHasher> hasher;
  if (!cfg.engram.layer_ids.empty()) hasher.emplace(EngramHasher::load(cfg, dir));
  const bool dspark = o.dspark && w.num_dspark > 0;
  ds::Arch arch = v41_arch(cfg, {.max_rollback = o.max_rollback, .qat = o.qat, .replay_keep = o.replay_keep,
                                 .dspark = dspark});
  std::vector<kv::LayerCacheSpec> specs =
      model::cache_specs(arch.plan, {.head_dim = cfg.head_dim, .index_head_dim = cfg.index_head_dim});
  std::unique_ptr<DSparkDrafter> drafter;
  if (dspark) drafter = std::make_unique<DSparkDrafter>(cfg, w, DSparkOptions{.max_rollback = o.max_rollback, .qat = o.qat,
                                                                       .host_taps = o.dspark_host_taps,
                                                                       .stages = o.dspark_stages});
  std::unique_ptr<ds::ModelBackend> be;
  if (make)
    be = make(cfg, arch, specs, w);
  else
    be = std::make_unique<ds::CpuBackend>(arch, specs, v41_prepare_cpu(cfg, arch.plan, w, o.expert_shard),
                                          ds::CpuBackendOptions{.batch_invariant = o.batch_invariant});
  ds::ModelInfo info = v41_model_info(cfg);
  std::unique_ptr<DeepseekV41Model> m(new DeepseekV41Model(std::move(info), std::move(arch), std::move(specs),
                                                           std::move(be), w.keepalive, std::move(cfg), std::move(hasher),
                                                           std::move(drafter)));
  m->set_expert_shard(o.expert_shard);
  return m;
}

// The Engram rows are hashed from the step's token ids on the host. A token the previous step
// sampled on the device (ForwardBatch::device_inputs, the engine's asynchronous scheduling) is a
// placeholder 0 in token_ids: its id is fetched first (the host waits for that sampling), or the
// step would read the table rows of n-grams ending in token 0 and the history would keep them
// (issue #22: on the GPU, plain greedy decoding left the reference from the first decode step,
// while drafting steps, whose inputs the host knows, did not).
void DeepseekV41Model::before_step(const ForwardBatch& batch) {
  if (!engram_) return;
  ForwardBatch host;
  if (!batch.device_inputs.empty()) {
    int32_t n = 0;
    for (const DeviceInput& d : batch.device_inputs) n = std::max(n, d.sample_row + 1);
    const std::vector<int32_t> ids = backend().device_ids_to_host(batch.sampled_ids, n);
    host.seqs = batch.seqs;
    host.token_ids = batch.token_ids;
    for (const DeviceInput& d : batch.device_inputs)
      host.token_ids.at(size_t(d.token_index)) = ids.at(size_t(d.sample_row));
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  std::vector<std::vector<int64_t>> ids = engram_->step(batch.device_inputs.empty() ? batch : host, tables_);
  const Clock::time_point t1 = Clock::now();
  // The host time before the step (issue #13 item 5), at DEEPINFER_LOG_LEVEL=debug.
  const auto report = [&](const char* path) {
    const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    DI_DEBUG("engram before_step: ", batch.num_tokens(), " tokens, ids ", ms(t1 - t0), " ms, ", path, " ",
             ms(Clock::now() - t1), " ms");
  };
  // A backend that widens on the device takes the ids (it uploads the stored bytes); otherwise the
  // rows are widened to f32 here.
  std::vector<ds::ModelBackend::EngramStepIds> by_layer(size_t(arch().plan.num_layers()));
  for (int64_t i = 0; i < hasher_->num_layers(); ++i)
    by_layer[size_t(hasher_->layer_id(i))] = {.table = tables_[size_t(i)], .ids = std::move(ids[size_t(i)])};
  if (backend().stage_engram_ids(by_layer)) return report("gather + upload (device widen)");
  std::vector<std::vector<float>> rows(by_layer.size());
  for (size_t l = 0; l < by_layer.size(); ++l)
    if (by_layer[l].table) rows[l] = engram_widen_rows(*by_layer[l].table, by_layer[l].ids);
  backend().stage_engram_rows(std::move(rows));
  report("host widen + stage");
}

void DeepseekV41Model::reset_slot(int32_t slot) {
  DeepseekModel::reset_slot(slot);
  if (engram_) engram_->reset(slot);
  if (dspark_) dspark_->reset_slot(slot);
}

void DeepseekV41Model::rollback(int32_t slot, int64_t num_tokens, int64_t keep) {
  DeepseekModel::rollback(slot, num_tokens, keep);
  if (dspark_) dspark_->rollback(slot, keep);
}

// Snapshot bytes: the shared state, then the Engram tail, then the DSpark rings (taken back in
// the reverse order).
SlotSnapshot DeepseekV41Model::save_slot(int32_t slot, int64_t n) {
  SlotSnapshot s = DeepseekModel::save_slot(slot, n);
  if (engram_) engram_->append_snapshot(slot, n, s.bytes);
  if (dspark_) dspark_->append_snapshot(slot, n, s.bytes);
  return s;
}

void DeepseekV41Model::restore_slot(int32_t slot, const SlotSnapshot& snapshot) {
  if (!engram_ && !dspark_) return DeepseekModel::restore_slot(slot, snapshot);
  SlotSnapshot s = snapshot;
  if (dspark_) dspark_->take_snapshot(slot, s.bytes);
  if (engram_) engram_->take_snapshot(slot, s.bytes);
  DeepseekModel::restore_slot(slot, s);
}

}  // namespace deepinfer::model::v41
