"""Step 3: tiny_official — model A in the release layout + MTP block, logits from dequantised weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import DeepseekV4ForCausalLM, DynamicCache

from . import checks, hfmodel, mtp, official, quant

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")  # main, MTP


def decode_release(tensors: dict) -> dict:
    """Release tensors (name -> (dtype, np array)) -> name -> fp32 torch tensor, per weight."""
    out = {}
    for name, (dtype, arr) in tensors.items():
        if name.endswith(".scale") and dtype == "F8_E8M0":
            continue
        t = torch.from_numpy(arr.copy())
        if dtype == "F8_E4M3":
            out[name] = quant.fp8_decode(t, torch.from_numpy(tensors[official.scale_name(name)][1].copy()))
        elif dtype == "I8":
            out[name] = quant.fp4_decode(t, torch.from_numpy(tensors[official.scale_name(name)][1].copy()))
        elif dtype == "BF16":
            out[name] = torch.from_numpy((arr.astype(np.uint32) << 16).view(np.float32))
        else:
            out[name] = t
    return out


def write_checkpoint(d: Path, main: dict, mtp_t: dict, cfg_json: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for shard, tensors in zip(SHARDS, (main, mtp_t)):
        total += official.write_safetensors(d / shard, tensors)
        weight_map.update({n: shard for n in tensors})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (d / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")


def check_roundtrip(d: Path, main: dict, mtp_t: dict, deq: dict, mdeq: dict) -> None:
    """Re-read the shards and decode them; must give exactly the weights the logits use."""
    stored = {}
    for shard in SHARDS:
        stored.update(official.read_safetensors(d / shard))
    want = {**main, **mtp_t}
    assert stored.keys() == want.keys()
    for n, (dt, arr) in want.items():
        assert stored[n][0] == dt and np.array_equal(stored[n][1], arr), n
    dec = decode_release(stored)
    hf_of = {}   # release weight name -> HF name (inverse of the maps; experts checked via fused)
    for hf, (rel, _) in official.GLOBAL_MAP.items():
        hf_of[rel] = hf
    for n in dec:
        if n.startswith("layers.") and ".ffn.experts." not in n:
            L, rest = n.split(".", 2)[1:]
            inv = {v[0]: k for k, v in official.LAYER_MAP.items()}
            hf_of[n] = f"model.layers.{L}.{inv[rest]}"
    for rel, hf in hf_of.items():
        assert torch.equal(dec[rel], deq[hf]), rel
    e0 = dec["layers.0.ffn.experts.1.w3.weight"]
    inter = e0.shape[0]
    assert torch.equal(e0, deq["model.layers.0.mlp.experts.gate_up_proj"][1, inter:])
    assert torch.equal(dec["mtp.0.e_proj.weight"], mdeq["e_proj.weight"])


@torch.no_grad()
def mtp_logits(model, head: mtp.MtpRef, ids: list[int]) -> tuple[np.ndarray, float]:
    """Draft logits [T-1, V] for main positions 0..T-2, plus max diff of a chunked MTP run."""
    streams, _ = mtp.main_streams_and_logits(model, ids)
    nxt = torch.tensor([ids[1:]])
    full = head(model, streams[:, :-1], nxt)
    cache = DynamicCache(config=mtp.mtp_config(model.config))
    parts, pos = [], 0
    for n in checks.cover(len(ids) - 1, checks.CHUNK_PATTERN):
        parts.append(head(model, streams[:, pos:pos + n], nxt[:, pos:pos + n], start=pos, cache=cache))
        pos += n
    return full.numpy().astype(np.float32), float((torch.cat(parts) - full).abs().max())


@torch.no_grad()
def build(out: Path, model_a, inputs: dict, seed_mtp: int, reference_run) -> dict:
    d = out / "tiny_official"
    cfg = model_a.config
    main, deq = official.encode_main(model_a.state_dict(), cfg.num_hidden_layers)
    head = mtp.MtpRef(cfg).eval()
    hfmodel.randomize_(head, seed_mtp, cfg.n_routed_experts)
    mtp_t, mdeq = official.encode_mtp(head.state_dict())
    write_checkpoint(d, main, mtp_t, official.official_config(cfg, 1))
    check_roundtrip(d, main, mtp_t, deq, mdeq)
    (d / "inputs.json").write_text(json.dumps(inputs) + "\n")

    model = DeepseekV4ForCausalLM(cfg).eval()
    model.load_state_dict(deq, strict=True)
    head.load_state_dict(mdeq, strict=True)
    plumbing = float((mtp.manual_main_logits(model, inputs["short"])
                      - model(input_ids=torch.tensor([inputs["short"]])).logits[0]).abs().max())
    print(f"[tiny_official] {len(main)} main + {len(mtp_t)} MTP tensors; "
          f"manual-loop vs model() max diff {plumbing:.1e}")
    assert plumbing < 1e-5
    report = reference_run(model, inputs, d)
    for name, ids in inputs.items():
        logits, chunk_diff = mtp_logits(model, head, ids)
        np.save(d / f"mtp_logits_{name}.npy", logits)
        report[name]["mtp_chunked"] = chunk_diff
        print(f"  mtp {name:6s} [{logits.shape[0]}, {logits.shape[1]}] std={logits.std():.3f} "
              f"chunked-vs-full={chunk_diff:.2e}")
        assert chunk_diff < 1e-4
    a_logits = np.load(out / "tiny" / "logits_short.npy")
    report["quant_effect_short_vs_tiny"] = float(np.abs(np.load(d / "logits_short.npy") - a_logits).max())
    (d / "meta.json").write_text(json.dumps({"seed_mtp": seed_mtp, "checks": report}, indent=1) + "\n")
    return report
