"""A tiny V4.1 model written in the DeepSeek release layout, and read back.

Names (MODEL-DEEPSEEK-V41.md §6, V41-REFERENCE-NOTES.md §8): transformers' `model.layers.L.<x>` is
`layers.L.<x>`, `model.embed.weight` is `embed.weight`, `model.norm.weight` is `norm.weight`,
`lm_head.weight` is `head.weight`; the per-layer names below `layers.L.` are the same in both.
Storage: FP8 linears -> F8_E4M3 `<m>.weight` + F8_E8M0 `<m>.scale` [ceil(out/32), ceil(in/32)];
routed experts -> I8 `<m>.weight` [out, in/2] (FP4 e2m1, element 2k in the low nibble) + F8_E8M0
`<m>.scale` [out, in/32]; Engram tables -> F8_E4M3 `engram.embed.weight` + F8_E8M0
`engram.embed.scale` [rows, dim/32]; F32 / BF16 tensors as is. Config: composite (text_config +
vision_config + quantization_config), with the release key `engram_pad_token_id`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from . import official, quant, v41quant, v41weights


def shard_names(n: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
GLOBAL_NAMES = {"model.embed.weight": "embed.weight", "model.norm.weight": "norm.weight",
                "lm_head.weight": "head.weight"}


def release_name(hf: str) -> str:
    if hf in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf]
    if not hf.startswith("model.layers."):
        raise ValueError(f"no release name for {hf}")
    return hf[len("model."):]


def _bf16(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def encode(sd: dict) -> dict:
    """transformers state dict (fp32 values already in their storage formats) -> release tensors
    name -> (safetensors dtype, numpy array)."""
    out = {}
    for hf, t in sd.items():
        fmt, name = v41weights.storage(hf), release_name(hf)
        if hf.endswith("engram.embed.scale"):
            continue                                  # replaced by the FP8 table's own scales
        base = name[: -len(".weight")]
        if fmt == "FP8" or fmt == "FP8ROW":
            codes, scales = v41quant.exact_fp8(t, *((32, 32) if fmt == "FP8" else (1, 32)))
            out[name] = ("F8_E4M3", codes.numpy())
            out[base + ".scale"] = ("F8_E8M0", scales.numpy())
        elif fmt == "FP4":
            packed, scales = v41quant.exact_fp4(t)
            out[name] = ("I8", packed.numpy())
            out[base + ".scale"] = ("F8_E8M0", scales.numpy())
        elif fmt == "F32":
            out[name] = ("F32", t.float().numpy())
        else:
            if not torch.equal(t.to(torch.bfloat16).float(), t.float()):
                raise AssertionError(f"{hf} is not bf16-exact")
            out[name] = ("BF16", _bf16(t))
    return out


def decode(tensors: dict) -> dict:
    """Release tensors -> transformers state dict (fp32), the inverse of `encode`."""
    sd = {}
    by_hf = {}
    for name in tensors:
        if name.endswith(".scale") and tensors[name][0] == "F8_E8M0":
            continue
        if name.startswith("mtp."):
            continue                                  # the drafter: not a transformers weight
        hf = next((k for k, v in GLOBAL_NAMES.items() if v == name), None) or "model." + name
        by_hf[hf] = name
    for hf, name in by_hf.items():
        dtype, arr = tensors[name]
        t = torch.from_numpy(np.array(arr))
        scale = name[: -len(".weight")] + ".scale"
        if dtype == "F8_E4M3":
            block = (1, 32) if name.endswith("engram.embed.weight") else (32, 32)
            sd[hf] = v41quant.fp8_decode(t, torch.from_numpy(np.array(tensors[scale][1])), *block)
            if block == (1, 32):
                sd[hf[: -len(".weight")] + ".scale"] = torch.ones(t.shape[0], t.shape[1] // 32)
        elif dtype == "I8":
            sd[hf] = quant.fp4_decode(t, torch.from_numpy(np.array(tensors[scale][1])))
        elif dtype == "BF16":
            sd[hf] = torch.from_numpy((arr.astype(np.uint32) << 16).view(np.float32))
        else:
            sd[hf] = t.float()
    return sd


def release_config(cfg, spec: dict, dspark_stages: int = 0) -> dict:
    """The composite config.json of the release, with the tiny model's values (plus DSpark stages)."""
    text = {
        "model_type": "deepseek_v41_text", "architectures": ["DeepseekV41ForCausalLM"],
        **{k: getattr(cfg, k) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window",
            "kv_source_layer_ids", "index_source_layer_ids", "candidate_source_layer_id",
            "candidate_topk_blocks", "candidate_block_size", "index_n_heads", "index_head_dim", "index_topk",
            "rope_theta", "compress_rope_theta", "max_position_embeddings", "n_routed_experts",
            "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "scoring_func", "topk_method",
            "norm_topk_prob", "routed_scaling_factor", "gate_temp", "swiglu_limit", "hc_mult",
            "hc_sinkhorn_iters", "hc_eps", "rms_norm_eps", "engram_layer_ids", "engram_num_embeddings",
            "engram_max_ngram_size", "engram_n_heads", "engram_head_dim", "engram_vocab_size",
            "engram_compressed_vocab_size", "num_nextn_predict_layers", "hidden_act", "tie_word_embeddings")},
        "compress_ratios": list(cfg.compress_ratios)[: cfg.num_hidden_layers] + [0] * dspark_stages,
        "rope_scaling": dict(spec["rope_scaling"]),
        "engram_pad_token_id": cfg.engram_pad_id,
    }
    text["num_nextn_predict_layers"] = dspark_stages
    for k in ("dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank",
              "dspark_n_routed_experts", "dspark_num_experts_per_tok"):
        text[k] = getattr(cfg, k)
    return {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
        "text_config": text,
        "vision_config": {"model_type": "deepseek_v41_vision", "hidden_size": 64, "intermediate_size": 128,
                          "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 14,
                          "downsample_ratio": 3, "rope_theta": 10000.0, "max_image_tokens": 64,
                          "min_pixels": 3136},
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": cfg.vocab_size - 1,
        "dtype": "bfloat16", "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
    }


def _shard_of(name: str, n_layers: int, shards: list[str]) -> str:
    """Layers below L/2 (and embed) in the first shard, the rest in the second, DSpark in a third."""
    if name.startswith("mtp."):
        return shards[2]
    if name.startswith("layers."):
        return shards[int(name.split(".")[1]) >= n_layers // 2]
    return shards[0] if name == "embed.weight" else shards[1]


def write(d: Path, tensors: dict, cfg_json: dict, n_layers: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    shards = shard_names(3 if any(n.startswith("mtp.") for n in tensors) else 2)
    per = {s: {} for s in shards}
    for n, v in tensors.items():
        per[_shard_of(n, n_layers, shards)][n] = v
    weight_map, total = {}, 0
    for shard, ts in per.items():
        total += official.write_safetensors(d / shard, ts)
        weight_map.update({n: shard for n in ts})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (d / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")


def read(d: Path) -> dict:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(official.read_safetensors(d / shard))
    return out
