#include "model/deepseek_v4/model.h"

#include <sstream>

#include "deepinfer/error.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek_v4/plan.h"
#include "model/deepseek_v4/prepare.h"
#include "model/deepseek_v4/weights.h"
#include "model/plan/cache_specs.h"
#include "model/sequence_runner.h"

namespace deepinfer::model::v4 {

ds::ModelInfo v4_model_info(const DeepseekV4Config& c) {
  std::ostringstream os;
  os << c.num_layers << " layers [" << c.schedule_str() << "], D=" << c.hidden_size << ", H=" << c.num_heads << "x"
     << c.head_dim << ", experts " << c.n_routed_experts << " top-" << c.num_experts_per_tok;
  return {.architecture = c.architecture, .summary = os.str(), .max_model_len = c.max_position_embeddings,
          .eos_token_id = c.eos_token_id, .bos_token_id = c.bos_token_id};
}

std::unique_ptr<DeepseekV4Model> DeepseekV4Model::load(const std::string& dir, const ModelOptions& options) {
  DeepseekV4Config cfg = DeepseekV4Config::from_file(dir);
  if (cfg.num_kv_heads != 1)
    DI_THROW(ConfigError, dir, "/config.json: num_key_value_heads must be 1, got ", cfg.num_kv_heads);
  if (cfg.rope.attention_factor != 1.0 || cfg.compress_rope.attention_factor != 1.0)
    DI_THROW(ConfigError, cfg.origin, ": rope attention_factor != 1 is not supported by DeepSeek-V4");
  DeepseekV4Weights w = DeepseekV4Weights::load(dir, cfg, LoadOptions{.progress = options.progress});
  const int64_t num_mtp = options.load_mtp ? int64_t(w.mtp.size()) : 0;
  ds::Arch arch = v4_arch(cfg, {.formats = V4Formats::kPlain, .num_mtp = num_mtp, .max_rollback = options.max_rollback});
  std::vector<kv::LayerCacheSpec> specs = model::cache_specs(arch.plan, {.head_dim = cfg.head_dim,
                                                                  .index_head_dim = cfg.index_head_dim});
  auto store = prepare_cpu(cfg, arch.plan, w, options.expert_shard);
  auto be = std::make_unique<ds::CpuBackend>(arch, specs, std::move(store),
                                             ds::CpuBackendOptions{.batch_invariant = options.batch_invariant});
  auto m = std::unique_ptr<DeepseekV4Model>(
      new DeepseekV4Model(v4_model_info(cfg), std::move(arch), std::move(specs), std::move(be), w.keepalive, cfg));
  m->set_expert_shard(options.expert_shard);
  return m;
}

kv::KvCache& DeepseekV4Model::cache() { return static_cast<ds::CpuBackend&>(backend()).cache(); }

Tensor DeepseekV4Model::forward_mtp(const ForwardBatch& batch, const Tensor& main_hidden, int64_t k) {
  const int64_t T = batch.num_tokens(), e = cfg_.hc_mult * cfg_.hidden_size;
  if (main_hidden.dtype() != DType::kF32 || main_hidden.numel() != T * e)
    DI_THROW(InvalidArgument, "forward_mtp: main_hidden ", main_hidden.str(), " must be f32 [", T, ",", cfg_.hc_mult,
             ",", cfg_.hidden_size, "]");
  HiddenRows h;
  h.host = main_hidden;
  h.rows = T;
  h.row_elems = e;
  return run_mtp(batch, h, k).logits;
}

Tensor run_sequence(DeepseekV4Model& model, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
                    int32_t slot, bool need_hidden, Tensor* hidden) {
  const int64_t n = model.config().hc_mult, D = model.config().hidden_size;
  Tensor hid;
  Tensor out = deepinfer::model::run_sequence(model, model.cache_geometry(), ids, chunks, slot,
                                              need_hidden ? &hid : nullptr);
  if (hidden && need_hidden) *hidden = hid.view({int64_t(ids.size()), n, D});
  return out;
}

}  // namespace deepinfer::model::v4
