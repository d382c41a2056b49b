"""Tiny DeepSeek-V4.1 configs for the goldens (MODEL-DEEPSEEK-V41.md §9, dims shrunk for size).

Every quantised shape is a multiple of 32 (FP8 32x32 weight blocks, FP4 experts per 32 along K,
window FP8 per 32, compressed FP4 per 16, index FP4 per 32), so every round trip really runs.
Role letters below: S sliding only, F full (KV + index source), R reuse, X reindex (own query
over the source's keys), * candidate source, c masked by the candidates.

A (§9's layout): S S F X F R F* R Xc R — Engram before 1 and 4, window 8, 3-grams, V = 300
  so §9's multipliers apply (its primes need engram_vocab 1000: too big a table here; the unit
  tests check them); swiglu_limit 10 (never clamps).
B (other layout): S F R F R F X* R Xc S — KV sources 1, 3, 5 and a candidate source that is a
  Reindex layer (6), a ratio-0 layer after the decoder, Engram before 0 and 5, 4-grams, window 12,
  candidate blocks of 3, swiglu_limit 1 (clamps), gate_temp 1.3, 7 Sinkhorn iterations, 4 heads
  (A has 2), 6 experts.
"""
from __future__ import annotations

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0}

COMMON = dict(
    num_key_value_heads=1, head_dim=64, qk_rope_head_dim=16,
    o_groups=2, o_lora_rank=32, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=32,
    scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True, routed_scaling_factor=1.5,
    hc_mult=4, hc_eps=1e-6, rms_norm_eps=1e-20, rope_theta=10000.0, compress_rope_theta=160000.0,
    rope_scaling=dict(YARN), max_position_embeddings=4096, index_n_heads=16, num_nextn_predict_layers=0,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2, engram_pad_id=2,
)

TINY_A = dict(
    COMMON, num_attention_heads=2, vocab_size=320, hidden_size=32, num_hidden_layers=10, q_lora_rank=32, sliding_window=8,
    compress_ratios=[0, 0, 2, 2, 2, 2, 1, 1, 1, 1],
    kv_source_layer_ids=[2, 4, 6], index_source_layer_ids=[2, 3, 4, 6, 8], candidate_source_layer_id=6,
    candidate_topk_blocks=2, candidate_block_size=4, index_head_dim=32, index_topk=6,
    n_routed_experts=8, swiglu_limit=10.0, gate_temp=1.0, hc_sinkhorn_iters=20,
    engram_layer_ids=[1, 4], engram_num_embeddings=None, engram_max_ngram_size=3,
    engram_n_heads=2, engram_head_dim=32, engram_vocab_size=250, engram_compressed_vocab_size=300,
    # DSpark (release fixture only; transformers ignores these): block 4, taps of layers 7, 8, 9.
    dspark_block_size=4, dspark_noise_token_id=318, dspark_target_layer_ids=[7, 8, 9], dspark_markov_rank=16,
    dspark_n_routed_experts=4, dspark_num_experts_per_tok=2,
)

TINY_B = dict(
    COMMON, num_attention_heads=4, vocab_size=256, hidden_size=32, num_hidden_layers=10, q_lora_rank=32, sliding_window=12,
    compress_ratios=[0, 2, 2, 2, 2, 1, 1, 1, 1, 0],
    kv_source_layer_ids=[1, 3, 5], index_source_layer_ids=[1, 3, 5, 6, 8], candidate_source_layer_id=6,
    candidate_topk_blocks=3, candidate_block_size=3, index_head_dim=32, index_topk=5,
    n_routed_experts=6, swiglu_limit=1.0, gate_temp=1.3, hc_sinkhorn_iters=7,
    engram_layer_ids=[0, 5], engram_num_embeddings=None, engram_max_ngram_size=4,
    engram_n_heads=2, engram_head_dim=32, engram_vocab_size=160, engram_compressed_vocab_size=200,
    dspark_block_size=3, dspark_noise_token_id=250, dspark_target_layer_ids=[6, 7, 8], dspark_markov_rank=16,
    dspark_n_routed_experts=4, dspark_num_experts_per_tok=2,
)

# Role letters per layer, for the README and meta.json (derived from the ids above).
def roles(spec: dict) -> str:
    kv, idx, cand = spec["kv_source_layer_ids"], spec["index_source_layer_ids"], spec["candidate_source_layer_id"]
    out = []
    for i, r in enumerate(spec["compress_ratios"][: spec["num_hidden_layers"]]):
        if r == 0:
            s = "S"
        elif i in kv:
            s = "F"
        elif i in idx:
            s = "X"
        else:
            s = "R"
        if i == cand:
            s += "*"
        elif i in idx and 0 <= cand < i:
            s += "c"
        out.append(s)
    return " ".join(out)
