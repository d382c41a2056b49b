"""Model A's weights in the DeepSeek release layout (shared docs §8.1), plus the inverse.

Formats: "BF16", "F32", "I64" stored as is; "FP8" -> `<name>` F8_E4M3 + `<scale name>` F8_E8M0
(128x128 blocks); experts -> `<name>` I8 packed FP4 + `<scale name>` F8_E8M0 (32 per scale).
`.weight` tensors get their scale at `.scale` (e.g. layers.0.attn.wq_a.scale).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

from . import quant
from .names import GLOBAL_MAP, LAYER_MAP, MTP_EXTRA_MAP  # noqa: F401 (re-exported)

ST_DTYPE = {"BF16": "BF16", "F32": "F32", "I64": "I64", "F8_E4M3": "F8_E4M3", "F8_E8M0": "F8_E8M0", "I8": "I8"}
NP_OF = {"BF16": np.uint16, "F32": np.float32, "I64": np.int64, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8,
         "I8": np.int8}


def scale_name(name: str) -> str:
    return name[: -len(".weight")] + ".scale"


def _raw(t: torch.Tensor, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if dtype == "F32":
        return t.float().numpy()
    if dtype == "I64":
        return t.long().numpy()
    return t.numpy()


def encode(name: str, t: torch.Tensor, fmt: str, out: dict, deq: dict, hf_name: str) -> None:
    """Add the release tensors for one parameter to `out` (name -> (dtype, np array)) and record
    the value transformers must use (`deq[hf_name]`, fp32)."""
    if fmt in ("BF16", "F32", "I64"):
        if fmt == "BF16" and not torch.equal(t.to(torch.bfloat16).float(), t):
            raise ValueError(f"{hf_name} is not bf16-exact")
        out[name] = (fmt, _raw(t, fmt))
        deq[hf_name] = t.clone()
    elif fmt == "FP8":
        codes, scales = quant.fp8_encode(t)
        out[name] = ("F8_E4M3", codes.numpy())
        out[scale_name(name)] = ("F8_E8M0", scales.numpy())
        deq[hf_name] = quant.fp8_decode(codes, scales)
    else:
        raise ValueError(fmt)


def encode_experts(prefix: str, hf_prefix: str, sd: dict, out: dict, deq: dict) -> None:
    """Fused HF experts -> per-expert w1/w3/w2 FP4 (+E8M0 per 32)."""
    gate_up, down = sd[hf_prefix + "mlp.experts.gate_up_proj"], sd[hf_prefix + "mlp.experts.down_proj"]
    inter = gate_up.shape[1] // 2
    gu_deq, down_deq = torch.empty_like(gate_up), torch.empty_like(down)
    for e in range(gate_up.shape[0]):
        for w_name, w, target, rows in (("w1", gate_up[e, :inter], gu_deq, slice(0, inter)),
                                        ("w3", gate_up[e, inter:], gu_deq, slice(inter, 2 * inter)),
                                        ("w2", down[e], down_deq, slice(None))):
            packed, scales = quant.fp4_encode(w)
            base = f"{prefix}ffn.experts.{e}.{w_name}."
            out[base + "weight"] = ("I8", packed.numpy())
            out[base + "scale"] = ("F8_E8M0", scales.numpy())
            target[e, rows] = quant.fp4_decode(packed, scales)
    deq[hf_prefix + "mlp.experts.gate_up_proj"] = gu_deq
    deq[hf_prefix + "mlp.experts.down_proj"] = down_deq


def encode_layer(prefix: str, hf_prefix: str, sd: dict, out: dict, deq: dict) -> None:
    for rel, (name, fmt) in LAYER_MAP.items():
        if hf_prefix + rel in sd:
            encode(prefix + name, sd[hf_prefix + rel], fmt, out, deq, hf_prefix + rel)
    encode_experts(prefix, hf_prefix, sd, out, deq)


def encode_main(sd: dict, n_layers: int) -> tuple[dict, dict]:
    """HF state dict (fp32, bf16-exact) -> (release tensors, dequantised HF state dict)."""
    out, deq = {}, {}
    for hf, (name, fmt) in GLOBAL_MAP.items():
        encode(name, sd[hf], fmt, out, deq, hf)
    for L in range(n_layers):
        encode_layer(f"layers.{L}.", f"model.layers.{L}.", sd, out, deq)
    missing = set(sd) - set(deq)
    if missing:
        raise RuntimeError(f"parameters without a release mapping: {sorted(missing)}")
    return out, deq


def encode_mtp(sd: dict, k: int = 0) -> tuple[dict, dict]:
    """MTP reference module state dict (block.* + extras) -> release tensors under mtp.k."""
    out, deq = {}, {}
    encode_layer(f"mtp.{k}.", "block.", sd, out, deq)
    for rel, (name, fmt) in MTP_EXTRA_MAP.items():
        encode(f"mtp.{k}.{name}", sd[rel], fmt, out, deq, rel)
    missing = set(sd) - set(deq)
    if missing:
        raise RuntimeError(f"MTP parameters without a release mapping: {sorted(missing)}")
    return out, deq


def write_safetensors(path: Path, tensors: dict) -> int:
    """Minimal safetensors writer: header dtype strings exactly as given; larger elements first
    so every tensor is aligned to its element size. Returns the data size in bytes."""
    order = sorted(tensors, key=lambda n: (-tensors[n][1].dtype.itemsize, n))
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for n in order:
        dtype, arr = tensors[n]
        b = np.ascontiguousarray(arr).tobytes()
        header[n] = {"dtype": ST_DTYPE[dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return offset


def read_safetensors(path: Path) -> dict:
    """name -> (dtype string, np array of the stored element type)."""
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        arr = np.frombuffer(blob[8 + n + a: 8 + n + b], dtype=NP_OF[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
    return out


def official_config(cfg, n_mtp: int) -> dict:
    """config.json in the release's own field names (values of the tiny model)."""
    ratio = {"sliding_attention": 0,
             "compressed_sparse_attention": cfg.compress_rates["compressed_sparse_attention"],
             "heavily_compressed_attention": cfg.compress_rates["heavily_compressed_attention"]}
    n_hash = sum(t == "hash_moe" for t in cfg.mlp_layer_types)
    assert cfg.mlp_layer_types == ["hash_moe"] * n_hash + ["moe"] * (cfg.num_hidden_layers - n_hash)
    rp = cfg.rope_parameters["compress"]
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id, "expert_dtype": "fp4", "hc_eps": cfg.hc_eps,
        "hc_mult": cfg.hc_mult, "hc_sinkhorn_iters": cfg.hc_sinkhorn_iters, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "hidden_size": cfg.hidden_size, "index_head_dim": cfg.index_head_dim,
        "index_n_heads": cfg.index_n_heads, "index_topk": cfg.index_topk, "initializer_range": 0.02,
        "max_position_embeddings": cfg.max_position_embeddings,
        "moe_intermediate_size": cfg.moe_intermediate_size, "n_routed_experts": cfg.n_routed_experts,
        "n_shared_experts": cfg.n_shared_experts, "norm_topk_prob": cfg.norm_topk_prob,
        "num_attention_heads": cfg.num_attention_heads, "num_experts_per_tok": cfg.num_experts_per_tok,
        "num_hidden_layers": cfg.num_hidden_layers, "num_hash_layers": n_hash,
        "num_key_value_heads": cfg.num_key_value_heads, "num_nextn_predict_layers": n_mtp,
        "o_groups": cfg.o_groups, "o_lora_rank": cfg.o_lora_rank, "q_lora_rank": cfg.q_lora_rank,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": {"beta_fast": rp["beta_fast"], "beta_slow": rp["beta_slow"], "factor": rp["factor"],
                         "original_max_position_embeddings": rp["original_max_position_embeddings"],
                         "type": "yarn"},
        "rope_theta": cfg.rope_theta, "routed_scaling_factor": cfg.routed_scaling_factor,
        "scoring_func": cfg.scoring_func, "sliding_window": cfg.sliding_window,
        "swiglu_limit": cfg.swiglu_limit, "tie_word_embeddings": False, "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": cfg.vocab_size,
        "compress_rope_theta": cfg.compress_rope_theta,
        "compress_ratios": [ratio[t] for t in cfg.layer_types] + [0] * n_mtp,
    }
