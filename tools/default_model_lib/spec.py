"""The default model's architecture (issue #21): a small DeepSeek-V4 that uses every path.

Layer schedule S C H C H S (S = sliding window only, C = CSA ratio 4 with the lightning indexer,
H = HCA ratio 32), hash-routed MoE in layers 0-1, bias-routed MoE after, one shared expert,
mHC with 4 streams, one MTP block. Sizes are chosen so the release-layout folder (BF16
embed/head, FP8 dense, FP4 experts) stays under 12 MB.
"""
from __future__ import annotations

import copy

from transformers import DeepseekV4Config

YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
        "beta_fast": 32.0, "beta_slow": 1.0}
S, C, H = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

DEFAULT_SPEC = dict(
    vocab_size=8192, hidden_size=192, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=1, head_dim=64, partial_rotary_factor=0.25,  # rope: last 16 dims
    q_lora_rank=128, o_groups=2, o_lora_rank=64,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=96,
    layer_types=[S, C, H, C, H, S],
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    compress_rates={C: 4, H: 32},
    # A 100-token prompt has 25 CSA blocks: top-16 is a real selection for any prompt past 64 tokens.
    sliding_window=64, index_n_heads=16, index_head_dim=32, index_topk=16,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
    rope_parameters=dict(YARN), swiglu_limit=10.0, routed_scaling_factor=1.5,
    scoring_func="sqrtsoftplus", norm_topk_prob=True, num_nextn_predict_layers=1,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    initializer_range=0.02,
)
CONTEXT = 1024   # training sequence length; also the shipped max_position_embeddings hint


def make_config(spec: dict | None = None) -> DeepseekV4Config:
    spec = copy.deepcopy(spec or DEFAULT_SPEC)
    cfg = DeepseekV4Config(**spec)
    cfg._attn_implementation = "eager"
    return cfg
