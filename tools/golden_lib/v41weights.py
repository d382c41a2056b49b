"""Random tiny V4.1 models: every parameter drawn, then rounded to its release storage format.

Recipe (as the V4 goldens, tools/golden_lib/hfmodel.py, plus V4.1's tensors):
  norms 1+N(0,.1); mHC fn N(0,.05), base N(0,.5), scale 1+N(0,.3); attn_sink N(0,1);
  router bias N(0,.3) (and bias_vl, unused); embed N(0,1); Engram table rows N(0,1),
  q_weight / k_weight 1+N(0,.2); every linear N(0, 1/sqrt(fan_in)).
Storage (release, MODEL-DEEPSEEK-V41.md §6): FP8 32x32 for the dense linears, FP4 for the routed
experts, FP8 rows (1x32 scales) for the Engram tables, F32 for mHC / sinks / router biases, BF16
for everything else. Values are rounded to that format at creation (FP8/FP4 values are bf16-exact),
so the transformers checkpoint (BF16, F32 where transformers keeps fp32) and the release checkpoint
decode to the same weights. The HF-layout Engram `embed.scale` is all ones (transformers ignores it
for a float table; a reader that multiplies by it gets the same values).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from . import v41quant, v41ref

# Relative to model.layers.L.: dense linears stored FP8 32x32 in the release.
FP8_LINEARS = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
               "attn.wo_b.weight", "attn.indexer.wq_b.weight", "ffn.shared_experts.w1.weight",
               "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight", "engram.wkv.weight")
F32_LEAVES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
              "attn_sink", "bias", "bias_vl")


def layer_suffix(name: str) -> str:
    """'model.layers.3.attn.wq_a.weight' -> 'attn.wq_a.weight' ('' for global tensors)."""
    parts = name.split(".")
    return ".".join(parts[3:]) if name.startswith("model.layers.") else ""


def storage(name: str) -> str:
    """Release storage of one transformers parameter: FP8, FP8ROW, FP4, F32 or BF16."""
    suffix, leaf = layer_suffix(name), name.rsplit(".", 1)[-1]
    if leaf in F32_LEAVES:
        return "F32"
    if suffix in FP8_LINEARS:
        return "FP8"
    if ".ffn.experts." in name:
        return "FP4"
    if suffix == "engram.embed.weight":
        return "FP8ROW"
    return "BF16"


def _normal(gen, shape, std, mean=0.0):
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


def random_value(name: str, shape, gen) -> torch.Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight"):
        return _normal(gen, shape, 0.1, 1.0)
    if leaf.endswith("_fn"):
        return _normal(gen, shape, 0.05)
    if leaf.endswith("_base"):
        return _normal(gen, shape, 0.5)
    if leaf.endswith("_scale") and leaf.startswith("hc_"):
        return _normal(gen, shape, 0.3, 1.0)
    if leaf == "attn_sink":
        return _normal(gen, shape, 1.0)
    if leaf in ("bias", "bias_vl"):
        return _normal(gen, shape, 0.3)
    if name == "model.embed.weight" or name.endswith("engram.embed.weight"):
        return _normal(gen, shape, 1.0)
    if name.endswith("engram.embed.scale"):
        return torch.ones(shape)
    if leaf in ("q_weight", "k_weight"):
        return _normal(gen, shape, 0.2, 1.0)
    if leaf == "weight" and len(shape) == 2:
        return _normal(gen, shape, 1.0 / math.sqrt(shape[1]))
    raise ValueError(f"no randomisation rule for parameter {name} {tuple(shape)}")


def round_to_storage(name: str, v: torch.Tensor) -> torch.Tensor:
    fmt = storage(name)
    if fmt == "F32":
        return v
    if fmt == "FP8":
        return v41quant.round_fp8(v)
    if fmt == "FP8ROW":
        return v41quant.round_fp8(v, 1, 32)
    if fmt == "FP4":
        return v41quant.round_fp4(v)
    return v.to(torch.bfloat16).float()


@torch.no_grad()
def randomize_(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, t in model.state_dict(keep_vars=True).items():
        t.copy_(round_to_storage(name, random_value(name, tuple(t.shape), gen)))


def text_config(spec: dict):
    """DeepseekV41TextConfig from a spec; Engram table sizes (sum of each layer's primes) filled in."""
    m, c = v41ref.load()
    spec = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in spec.items()}
    cfg = c.DeepseekV41TextConfig(**{**spec, "engram_num_embeddings": None})
    layout = m.EngramLayout.from_config(cfg)
    sizes = [sum(sum(per) for per in layer) for layer in layout.primes] if layout else []
    if spec.get("engram_num_embeddings") not in (None, sizes):
        raise ValueError(f"engram_num_embeddings {spec['engram_num_embeddings']} != prime sums {sizes}")
    cfg = c.DeepseekV41TextConfig(**{**spec, "engram_num_embeddings": sizes})
    cfg._attn_implementation = "eager"
    return cfg


def bind(model, spec: dict):
    model.model.bind_tokenizer(v41ref.SyntheticTokenizer(spec["vocab_size"], spec["engram_compressed_vocab_size"]))
    return model


def build_model(spec: dict, seed: int):
    m, _ = v41ref.load()
    torch.manual_seed(seed)
    model = m.DeepseekV41ForCausalLM(text_config(spec)).eval()
    randomize_(model, seed)
    return bind(model, spec)


def save_hf(model, out_dir: Path) -> None:
    """save_pretrained with every tensor in its transformers storage dtype: F32 for the tensors
    transformers keeps in fp32 (`_keep_in_fp32_modules_strict`), BF16 otherwise (values exact)."""
    m, _ = v41ref.load()
    copy = m.DeepseekV41ForCausalLM(model.config).eval()
    copy.load_state_dict(model.state_dict())
    copy.to(torch.bfloat16)
    for name, p in copy.named_parameters():
        if name.rsplit(".", 1)[-1] in F32_LEAVES:
            p.data = model.state_dict()[name].float().clone()
    copy.save_pretrained(out_dir, save_original_format=False)


def load_hf(path: Path, spec: dict):
    m, c = v41ref.load()
    cfg = c.DeepseekV41TextConfig.from_pretrained(path)   # flat config: see V41-REFERENCE-NOTES §2
    model = m.DeepseekV41ForCausalLM.from_pretrained(path, config=cfg, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    return bind(model, spec)


def assert_same_weights(a, b, what: str) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        raise RuntimeError(f"{what}: state dict keys differ: {sorted(set(sa) ^ set(sb))}")
    for k in sa:
        if not torch.equal(sa[k].float(), sb[k].float()):
            raise RuntimeError(f"{what}: tensor {k} differs after reload")
