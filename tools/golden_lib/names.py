"""Release-layout <-> transformers-layout tensor names (shared docs §8.1, transformers
conversion_mapping "deepseek_v4"), with the storage format of each release tensor.
Pure Python (no torch) so tests can import it.

Formats: "BF16", "F32", "I64" stored as is; "FP8" = F8_E4M3 weight + F8_E8M0 `.scale`
(128x128 blocks). Routed experts (not listed: fused in transformers) are I8 packed FP4 +
F8_E8M0 `.scale` per 32 inputs: `ffn.experts.E.w1/w3` = gate_up_proj[E, :I] / [E, I:],
`ffn.experts.E.w2` = down_proj[E].
"""

# transformers name (relative to model.layers.L.) -> (release name relative to layers.L., format)
LAYER_MAP = {
    "input_layernorm.weight": ("attn_norm.weight", "BF16"),
    "post_attention_layernorm.weight": ("ffn_norm.weight", "BF16"),
    "attn_hc.fn": ("hc_attn_fn", "F32"), "attn_hc.base": ("hc_attn_base", "F32"),
    "attn_hc.scale": ("hc_attn_scale", "F32"),
    "ffn_hc.fn": ("hc_ffn_fn", "F32"), "ffn_hc.base": ("hc_ffn_base", "F32"),
    "ffn_hc.scale": ("hc_ffn_scale", "F32"),
    "self_attn.q_a_proj.weight": ("attn.wq_a.weight", "FP8"),
    "self_attn.q_a_norm.weight": ("attn.q_norm.weight", "BF16"),
    "self_attn.q_b_proj.weight": ("attn.wq_b.weight", "FP8"),
    "self_attn.kv_proj.weight": ("attn.wkv.weight", "FP8"),
    "self_attn.kv_norm.weight": ("attn.kv_norm.weight", "BF16"),
    "self_attn.o_a_proj.weight": ("attn.wo_a.weight", "FP8"),
    "self_attn.o_b_proj.weight": ("attn.wo_b.weight", "FP8"),
    "self_attn.sinks": ("attn.attn_sink", "F32"),
    "self_attn.compressor.kv_proj.weight": ("attn.compressor.wkv.weight", "BF16"),
    "self_attn.compressor.gate_proj.weight": ("attn.compressor.wgate.weight", "BF16"),
    "self_attn.compressor.position_bias": ("attn.compressor.ape", "F32"),
    "self_attn.compressor.kv_norm.weight": ("attn.compressor.norm.weight", "BF16"),
    "self_attn.compressor.indexer.kv_proj.weight": ("attn.indexer.compressor.wkv.weight", "BF16"),
    "self_attn.compressor.indexer.gate_proj.weight": ("attn.indexer.compressor.wgate.weight", "BF16"),
    "self_attn.compressor.indexer.position_bias": ("attn.indexer.compressor.ape", "F32"),
    "self_attn.compressor.indexer.kv_norm.weight": ("attn.indexer.compressor.norm.weight", "BF16"),
    "self_attn.compressor.indexer.q_b_proj.weight": ("attn.indexer.wq_b.weight", "FP8"),
    "self_attn.compressor.indexer.scorer.weights_proj.weight": ("attn.indexer.weights_proj.weight", "BF16"),
    "mlp.gate.weight": ("ffn.gate.weight", "BF16"),
    "mlp.gate.e_score_correction_bias": ("ffn.gate.bias", "F32"),
    "mlp.gate.tid2eid": ("ffn.gate.tid2eid", "I64"),
    "mlp.shared_experts.gate_proj.weight": ("ffn.shared_experts.w1.weight", "FP8"),
    "mlp.shared_experts.up_proj.weight": ("ffn.shared_experts.w3.weight", "FP8"),
    "mlp.shared_experts.down_proj.weight": ("ffn.shared_experts.w2.weight", "FP8"),
}
GLOBAL_MAP = {
    "model.embed_tokens.weight": ("embed.weight", "BF16"),
    "lm_head.weight": ("head.weight", "BF16"),
    "model.norm.weight": ("norm.weight", "BF16"),
    "model.hc_head.hc_fn": ("hc_head_fn", "F32"),
    "model.hc_head.hc_base": ("hc_head_base", "F32"),
    "model.hc_head.hc_scale": ("hc_head_scale", "F32"),
}
# MTP-only modules (relative to mtp.0.; the MTP reference module uses the left-hand names)
MTP_EXTRA_MAP = {
    "e_proj.weight": ("e_proj.weight", "FP8"), "h_proj.weight": ("h_proj.weight", "FP8"),
    "enorm.weight": ("enorm.weight", "BF16"), "hnorm.weight": ("hnorm.weight", "BF16"),
    "norm.weight": ("norm.weight", "BF16"),
    "hc_head.hc_fn": ("hc_head_fn", "F32"), "hc_head.hc_base": ("hc_head_base", "F32"),
    "hc_head.hc_scale": ("hc_head_scale", "F32"),
}
