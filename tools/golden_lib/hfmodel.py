"""Tiny DeepSeek-V4 models in transformers: configs, full randomisation, save/load, forward.

Everything runs on CPU in fp32 with eager attention. Weights are rounded to bf16 once after
randomisation, so the bf16 checkpoint written by save_pretrained holds exactly the values the
reference logits were computed from (bf16 -> fp32 is exact).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
        "beta_fast": 32.0, "beta_slow": 1.0}

# Model A (shared docs MODEL-DEEPSEEK-V4.md §9, dims shrunk to keep the fixtures small).
TINY = dict(
    vocab_size=512, hidden_size=128, num_hidden_layers=6,
    num_attention_heads=8, num_key_value_heads=1, head_dim=64, partial_rotary_factor=0.25,
    q_lora_rank=144, o_groups=2, o_lora_rank=32,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    sliding_window=16, index_n_heads=16, index_head_dim=32, index_topk=8,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1048576,
    rope_parameters=dict(YARN), swiglu_limit=10.0, routed_scaling_factor=1.5,
    scoring_func="sqrtsoftplus", norm_topk_prob=True, num_nextn_predict_layers=1,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
)

# Model B: clamps active (swiglu_limit 1), different layer order and HCA ratio 8; smaller
# vocab / q_lora than A to keep the fixtures small.
TINY_CLAMP = dict(TINY, num_hidden_layers=3, swiglu_limit=1.0, vocab_size=256, q_lora_rank=64,
                  layer_types=["heavily_compressed_attention", "sliding_attention",
                               "compressed_sparse_attention"],
                  mlp_layer_types=["hash_moe", "moe", "moe"],
                  compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})


def make_config(spec: dict) -> DeepseekV4Config:
    spec = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in spec.items()}
    cfg = DeepseekV4Config(**spec)
    cfg._attn_implementation = "eager"
    return cfg


def _normal(gen, shape, std, mean=0.0):
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


def random_value(name: str, shape, gen) -> torch.Tensor:
    """Value for one float parameter (§9 step 1). Nothing keeps transformers' init
    (which zeroes sinks/position_bias/hc base/bias and sets scales to 1)."""
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return _normal(gen, shape, 0.1, 1.0)
    if "_hc." in name or leaf in ("hc_fn", "hc_base", "hc_scale"):
        if leaf in ("fn", "hc_fn"):
            return _normal(gen, shape, 0.05)
        if leaf in ("base", "hc_base"):
            return _normal(gen, shape, 0.5)
        if leaf in ("scale", "hc_scale"):
            return _normal(gen, shape, 0.3, 1.0)
    if leaf == "sinks":
        return _normal(gen, shape, 1.0)
    if leaf == "position_bias":
        return _normal(gen, shape, 0.5)
    if leaf == "e_score_correction_bias":
        # Larger than §9's 0.05 so that the bias really changes which experts win.
        return _normal(gen, shape, 0.3)
    if name.endswith("embed_tokens.weight"):
        return _normal(gen, shape, 1.0)
    if leaf in ("gate_up_proj", "down_proj") and len(shape) == 3:   # fused experts [E, out, in]
        return _normal(gen, shape, 1.0 / math.sqrt(shape[-1]))
    if leaf == "weight" and len(shape) == 2:                        # every nn.Linear [out, in]
        return _normal(gen, shape, 1.0 / math.sqrt(shape[1]))
    raise ValueError(f"no randomisation rule for parameter {name} {tuple(shape)}")


def random_tid2eid(shape, gen, n_experts: int) -> torch.Tensor:
    """[V, k] int64, k distinct random experts per row."""
    rows = [torch.randperm(n_experts, generator=gen)[: shape[1]] for _ in range(shape[0])]
    return torch.stack(rows).to(torch.int64)


@torch.no_grad()
def randomize_(module, seed: int, n_experts: int) -> None:
    """Overwrite every entry of the state dict, then round floats to bf16-representable values."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in module.state_dict(keep_vars=True).items():
        if name.endswith("tid2eid"):
            t.copy_(random_tid2eid(t.shape, gen, n_experts))
            continue
        v = random_value(name, tuple(t.shape), gen)
        t.copy_(v.to(torch.bfloat16).to(torch.float32))


def build_model(spec: dict, seed: int):
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(make_config(spec)).eval()
    randomize_(model, seed, model.config.n_routed_experts)
    return model


def save_bf16(model, out_dir: Path) -> None:
    """save_pretrained of a bf16 copy: every float tensor stored BF16 (values already bf16-exact).

    save_original_format=False keeps the in-memory transformers names. The default (True) runs
    transformers' reverse checkpoint conversion, which in 5.17 writes a hybrid of release and HF
    names ("model.layers.L.attn.wq_a.weight", attention kv_norm renamed to "attn.norm")."""
    out_dir.mkdir(parents=True, exist_ok=True)
    copy = DeepseekV4ForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    copy.to(torch.bfloat16)
    copy.save_pretrained(out_dir, save_original_format=False)


def load_fp32(path: Path):
    model = DeepseekV4ForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def assert_same_weights(a, b, what: str) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        raise RuntimeError(f"{what}: state dict keys differ: {sorted(set(sa) ^ set(sb))}")
    for k in sa:
        if not torch.equal(sa[k], sb[k]):
            raise RuntimeError(f"{what}: tensor {k} differs after reload")


@torch.no_grad()
def full_logits(model, ids: list[int]) -> np.ndarray:
    """One full-sequence forward, no cache. Returns float32 [T, vocab]."""
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, use_cache=False)
    return out.logits[0].float().numpy()
