"""DSpark drafter goldens for v41_a_release (MODEL-DEEPSEEK-V41.md §7).

transformers' deepseek_v41 has no DSpark, so the drafter reference is DeepSeek's own
inference/model.py (V4.1-Flash @dba1be0, read through a public vendored copy): its DSparkBlock /
DSparkAttention / Markov and confidence heads / forward_spec, transcribed into the git-ignored
`.v41ref/dspark_ref/ref_dspark.py` and run on CPU in fp32 with float weights (the release values),
act_quant = the FP8 window round trip, and an exact fp32 sparse attention (the reference kernel
rounds probabilities to bf16; that is its bf16 serving numerics, not the model's). The target side
is the transformers model of v41_a: the taps are the mean over the 4 streams at the input of
layers 7, 8, 9 of its golden cache-path forward over t37 (causal, so they equal an incremental run's).

Schedule (what a speculative loop does, greedy): prefill the stage rings with the taps of
positions 0..P-1; then for every position i = P..T-1: anchor a_i = argmax of the target's logits
row i (the token at position i+1), forward_spec(a_i, tap_i, start_pos=i) -> drafts for positions
i+2..i+1+block, per-position logits (Markov bias included) and confidences.
Files in v41_a_release/: `dspark_t37_taps.f32` [T, 3*D], `dspark_t37_anchor.i32` [S],
`dspark_t37_drafts.i32` [S, block], `dspark_t37_logits.f32` [S, block, V],
`dspark_t37_confidence.f32` [S, block]; weights `mtp.{0,1,2}.*` in the release layout.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import torch

from . import v41quant, v41ref, v41weights

PREFILL = 20
SEQ = "t37"


def load_ref():
    path = v41ref.site_dir().parent / "dspark_ref" / "ref_dspark.py"
    if not path.is_file():
        raise SystemExit(f"DSpark reference transcription not found at {path} (docs/MODEL-V41.md, 'DSpark golden')")
    spec = importlib.util.spec_from_file_location("ref_dspark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ref_args(ref, spec: dict):
    return ref.ModelArgs(
        vocab_size=spec["vocab_size"], dim=spec["hidden_size"], moe_inter_dim=spec["moe_intermediate_size"],
        n_layers=spec["num_hidden_layers"], n_mtp_layers=3, n_heads=spec["num_attention_heads"],
        n_routed_experts=spec["n_routed_experts"], n_activated_experts=spec["num_experts_per_tok"],
        gate_temp=spec["gate_temp"], route_scale=spec["routed_scaling_factor"], swiglu_limit=spec["swiglu_limit"],
        q_lora_rank=spec["q_lora_rank"], head_dim=spec["head_dim"], rope_head_dim=spec["qk_rope_head_dim"],
        norm_eps=spec["rms_norm_eps"], o_groups=spec["o_groups"], o_lora_rank=spec["o_lora_rank"],
        window_size=spec["sliding_window"], compress_ratios=(0,) * (spec["num_hidden_layers"] + 3),
        rope_theta=spec["rope_theta"], hc_mult=spec["hc_mult"], hc_sinkhorn_iters=spec["hc_sinkhorn_iters"],
        hc_eps=spec["hc_eps"], dspark_block_size=spec["dspark_block_size"],
        dspark_noise_token_id=spec["dspark_noise_token_id"],
        dspark_target_layer_ids=tuple(spec["dspark_target_layer_ids"]), dspark_markov_rank=spec["dspark_markov_rank"],
        dspark_n_routed_experts=spec["dspark_n_routed_experts"],
        dspark_n_activated_experts=spec["dspark_num_experts_per_tok"], temperature=0)


# Relative to mtp.S.: FP8 32x32 in the release (§6: "mtp main_proj and attn"), FP4 routed experts.
FP8 = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
       "ffn.shared_experts.w1.weight", "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight", "main_proj.weight")


def mtp_storage(name: str) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in v41weights.F32_LEAVES:
        return "F32"
    if name in FP8:
        return "FP8"
    if name.startswith("ffn.experts."):
        return "FP4"
    return "BF16"


def mtp_value(name: str, shape, gen) -> torch.Tensor:
    if name == "markov_head.embed.weight":
        return torch.randn(shape, generator=gen)
    return v41weights.random_value(name, shape, gen)


@torch.no_grad()
def build_stages(ref, spec: dict, hf_model, seed: int):
    args = ref_args(ref, spec)
    stages = torch.nn.ModuleList([ref.DSparkBlock(args.n_layers + s, args) for s in range(3)])
    gen = torch.Generator().manual_seed(seed)
    for s, st in enumerate(stages):
        for name, t in st.state_dict(keep_vars=True).items():
            fmt = mtp_storage(name)
            v = mtp_value(name, tuple(t.shape), gen)
            v = {"F32": lambda x: x, "FP8": v41quant.round_fp8, "FP4": v41quant.round_fp4,
                 "BF16": lambda x: x.to(torch.bfloat16).float()}[fmt](v)
            t.copy_(v)
        st.embed = hf_model.model.embed.weight.detach().float()   # shared with the trunk
        st.head = hf_model.lm_head.weight.detach().float()
    return args, stages


@torch.no_grad()
def taps(hf_model, ids: list[int], targets) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over the streams at the input of each target layer (after its Engram): [T, len*D]."""
    got = {}
    handles = []
    for layer_id in targets:
        layer = hf_model.model.layers[layer_id]
        if layer.engram is not None:
            handles.append(layer.engram.register_forward_hook(lambda m, a, o, k=layer_id: got.__setitem__(k, o)))
        else:
            handles.append(layer.register_forward_pre_hook(lambda m, a, k=layer_id: got.__setitem__(k, a[0])))
    logits = v41ref.run_chunks(hf_model, ids, [len(ids)])
    for h in handles:
        h.remove()
    return torch.cat([got[k][0].float().mean(dim=1) for k in targets], dim=-1), logits


def run_schedule(ref, stages, args, tap: torch.Tensor, anchors: torch.Tensor, prefill: int):
    """Rings seeded with positions < prefill, then one draft round per position i >= prefill."""
    for st in stages:
        st.attn.window_kv_cache.zero_()
    ref.get_dspark_topk_idxs.cache_clear()
    ref.forward_spec(stages, args.hc_mult, anchors[prefill - 1:prefill], tap[None, :prefill], 0)
    out = []
    for i in range(prefill, tap.shape[0]):
        ids, logits, conf = ref.forward_spec(stages, args.hc_mult, anchors[i:i + 1], tap[None, i:i + 1], i)
        out.append((ids[0].clone(), logits[0].clone(), conf[0].clone()))
    return out


def min_top_gap(logits: torch.Tensor) -> float:
    top = torch.topk(logits, 2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


def build(release_dir: Path, hf_model, spec: dict, ids: list[int], seed: int = 5, max_seeds: int = 20) -> tuple[dict, dict]:
    """Returns (mtp tensors as name -> torch fp32 value, meta) and writes the golden files."""
    ref = load_ref()
    tap, target_logits = taps(hf_model, ids, spec["dspark_target_layer_ids"])
    anchors = target_logits.argmax(dim=-1)
    for attempt in range(max_seeds):
        args, stages = build_stages(ref, spec, hf_model, seed + attempt)
        out = run_schedule(ref, stages, args, tap, anchors, PREFILL)
        again = run_schedule(ref, stages, args, tap, anchors, PREFILL + 3)   # rings filled by decode vs prefill
        consistency = max(float((a[1] - b[1]).abs().max()) for a, b in zip(out[3:], again))
        same_drafts = all(torch.equal(a[0], b[0]) for a, b in zip(out[3:], again))
        gap = min(min_top_gap(o[1]) for o in out)
        if gap >= 1e-3 and consistency <= 1e-5 and same_drafts:
            break
        print(f"    dspark seed {seed + attempt} rejected: min top1-top2 gap {gap:.2e}, consistency {consistency:.1e}")
    else:
        raise RuntimeError("no DSpark seed passed")
    steps = len(out)
    np.concatenate([tap.numpy()]).astype("<f4").tofile(release_dir / f"dspark_{SEQ}_taps.f32")
    anchors[PREFILL:].numpy().astype("<i4").tofile(release_dir / f"dspark_{SEQ}_anchor.i32")
    torch.stack([o[0][1:] for o in out]).numpy().astype("<i4").tofile(release_dir / f"dspark_{SEQ}_drafts.i32")
    torch.stack([o[1] for o in out]).numpy().astype("<f4").tofile(release_dir / f"dspark_{SEQ}_logits.f32")
    torch.stack([o[2] for o in out]).numpy().astype("<f4").tofile(release_dir / f"dspark_{SEQ}_confidence.f32")
    tensors = {f"mtp.{s}.{k}": v.detach().float() for s, st in enumerate(stages) for k, v in st.state_dict().items()}
    drafted = torch.stack([o[0][1:] for o in out])
    # d_1 of round i predicts position i+2, as does the target's argmax of row i+1 (a diagnostic:
    # random draft weights agree about 1/vocab of the time).
    agree = [int(drafted[k, 0]) == int(anchors[PREFILL + k + 1]) for k in range(steps - 1)]
    accept = float(np.mean(agree)) if agree else 0.0
    meta = {"reference": "DeepSeek inference/model.py @dba1be0 (DSparkBlock, forward_spec) via a vendored copy; "
                         "fp32, float weights, exact fp32 sparse attention (.v41ref/dspark_ref)",
            "seed": seed + attempt, "sequence": SEQ, "prefill": PREFILL, "steps": steps,
            "positions": [PREFILL, len(ids) - 1], "block_size": spec["dspark_block_size"],
            "target_layers": spec["dspark_target_layer_ids"], "min_top1_top2_gap": gap,
            "prefill_vs_decode_ring_max_abs": consistency,
            "first_draft_equals_target_next_argmax_share": accept,
            "confidence_range": [float(torch.stack([o[2] for o in out]).min()), float(torch.stack([o[2] for o in out]).max())]}
    print(f"  dspark: seed {meta['seed']}, {steps} draft rounds from position {PREFILL}, min gap {gap:.2e}, "
          f"ring consistency {consistency:.1e}, first-draft agreement {accept:.2f}")
    return tensors, meta


def as_release(tensors: dict) -> dict:
    """mtp tensors -> release (dtype, numpy) entries, in the same encodings as the trunk."""
    from . import v41release
    out = {}
    for name, t in tensors.items():
        rel = name.split(".", 2)[2]
        fmt = mtp_storage(rel)
        base = name[: -len(".weight")]
        if fmt == "FP8":
            codes, scales = v41quant.exact_fp8(t)
            out[name], out[base + ".scale"] = ("F8_E4M3", codes.numpy()), ("F8_E8M0", scales.numpy())
        elif fmt == "FP4":
            packed, scales = v41quant.exact_fp4(t)
            out[name], out[base + ".scale"] = ("I8", packed.numpy()), ("F8_E8M0", scales.numpy())
        elif fmt == "F32":
            out[name] = ("F32", t.numpy())
        else:
            assert torch.equal(t.to(torch.bfloat16).float(), t), name
            out[name] = ("BF16", v41release._bf16(t))
    return out
