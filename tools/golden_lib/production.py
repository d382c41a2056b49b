"""DeepSeek's production rounding in the transformers reference (shared docs §3.3, §3.4, §11).

The DeepSeek reference quantise-dequantises, after rope:
  * the attention kv of every token and the compressed entries (HCA/CSA compressors): FP8 e4m3
    round trip of the leading non-rope dims (head_dim - rope_dim), blocks of 64 along the row,
    scale = pow2ceil(max(amax, 1e-4) / 448);
  * the lightning indexer's query and compressed keys: with index_head_dim 128, a normalised
    Sylvester Hadamard rotation (x @ H_128 / sqrt(128); dot products are unchanged), then an FP4
    e2m1 round trip in blocks of 32, scale = pow2ceil(max(amax, 6 * 2^-126) / 6).
Transformers does none of this. `production_rounding(model)` patches it in, mirroring the
engine's kernels (src/ops/cuda/quant.cu, applied in src/model/deepseek_v4/cuda/cuda_layers.cpp)
operation for operation in fp32: same scale formula (fp32 multiply by the fp32 constant 1/qmax,
power of two rounded up exactly), same clamps, round to nearest even (e4m3 through torch's
float8_e4m3fn cast; e2m1 with ties to the even code), and the same applicability rules (FP8 only
when head_dim - rope_dim is a positive multiple of 64, Hadamard only at width 128).

How: transformers' modeling module calls apply_rotary_pos_emb at exactly the four places the
reference rounds after (plus the query and output rotations, which stay untouched); the patched
function rounds the result of those four calls, identified by the calling module and call line.
`hits` counts each kind, so a transformers version that moved a call fails loudly.
"""
from __future__ import annotations

import contextlib
import linecache
import sys
from collections import Counter

import torch

FP8_MAX, FP4_MAX = 448.0, 6.0
FP8_BLOCK, FP4_BLOCK = 64, 32
_F32 = torch.float32


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= s (s > 0, fp32), exactly."""
    m, e = torch.frexp(s)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def _scale(amax: torch.Tensor, floor: float, qmax: float) -> torch.Tensor:
    inv = torch.tensor(1.0, dtype=_F32) / torch.tensor(qmax, dtype=_F32)  # the kernels' fp32 1/qmax
    return pow2_ceil(amax.clamp_min(floor) * inv)


def fp8_round_trip(x: torch.Tensor, quant_dims: int, block: int = FP8_BLOCK) -> torch.Tensor:
    """x [..., d] -> same shape/dtype, the leading `quant_dims` dims FP8 round-tripped per block."""
    y = x.to(_F32).clone()
    head = y[..., :quant_dims].reshape(*y.shape[:-1], quant_dims // block, block)
    scale = _scale(head.abs().amax(-1, keepdim=True), 1e-4, FP8_MAX)
    q = (head * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX)          # 1/scale is exact (power of two)
    q = q.to(torch.float8_e4m3fn).to(_F32) * scale                 # round to nearest even
    y[..., :quant_dims] = q.reshape(*y.shape[:-1], quant_dims)
    return y.to(x.dtype)


def e2m1(q: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value of q (|q| <= 6), ties to the even code (core/numeric.h f32_to_fp4e2m1)."""
    a = q.abs()
    mag = torch.full_like(a, 6.0)
    for bound, value, inclusive in ((5.0, 4.0, True), (3.5, 3.0, False), (2.5, 2.0, True), (1.75, 1.5, False),
                                    (1.25, 1.0, True), (0.75, 0.5, False), (0.25, 0.0, True)):
        below = a <= bound if inclusive else a < bound
        mag = torch.where(below, torch.full_like(a, value), mag)
    return torch.copysign(mag, q)


def hadamard_128() -> torch.Tensor:
    h = torch.ones(1, 1, dtype=_F32)
    while h.shape[0] < 128:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def fp4_round_trip(x: torch.Tensor, hadamard: bool) -> torch.Tensor:
    """x [..., d] (d % 32 == 0; d == 128 with hadamard) -> rotated (optionally) and FP4 round-tripped."""
    y = x.to(_F32)
    if hadamard:
        y = (y @ hadamard_128()) * torch.tensor(0.08838834764831845, dtype=_F32)
    d = y.shape[-1]
    g = y.reshape(*y.shape[:-1], d // FP4_BLOCK, FP4_BLOCK)
    scale = _scale(g.abs().amax(-1, keepdim=True), FP4_MAX * 2.0 ** -126, FP4_MAX)
    q = e2m1((g / scale).clamp(-FP4_MAX, FP4_MAX)) * scale
    return q.reshape(y.shape).to(x.dtype)


# (module class name, start of the call line) -> kind of rounding
_SITES = {
    ("DeepseekV4Attention", "kv = apply_rotary_pos_emb(kv"): "kv",
    ("DeepseekV4HCACompressor", "compressed = apply_rotary_pos_emb("): "entries",
    ("DeepseekV4CSACompressor", "compressed = apply_rotary_pos_emb("): "entries",
    ("DeepseekV4Indexer", "compressed = apply_rotary_pos_emb("): "index_keys",
    ("DeepseekV4Indexer", "q = apply_rotary_pos_emb(q"): "index_q",
}


@contextlib.contextmanager
def production_rounding(model):
    """Within the block, forwards of `model` apply the production round trips. Yields the hit counter."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    cfg = model.config
    rope = int(cfg.head_dim * cfg.partial_rotary_factor)
    quant_dims = cfg.head_dim - rope
    hits: Counter = Counter()
    original = m.apply_rotary_pos_emb

    def rounded(x, cos, sin, *args, **kwargs):
        out = original(x, cos, sin, *args, **kwargs)
        frame = sys._getframe(1)
        owner = frame.f_locals.get("self")
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        kind = next((k for (cls, start), k in _SITES.items()
                     if type(owner).__name__ == cls and line.startswith(start)), None)
        if kind is None:
            return out
        d = out.shape[-1]
        if kind in ("kv", "entries"):
            if quant_dims <= 0 or quant_dims % FP8_BLOCK:
                return out
            out = fp8_round_trip(out, quant_dims)
        else:
            if d % FP4_BLOCK:
                return out
            out = fp4_round_trip(out, hadamard=d == 128)
        hits[kind] += 1
        return out

    m.apply_rotary_pos_emb = rounded
    try:
        yield hits
    finally:
        m.apply_rotary_pos_emb = original


# Model P (tiny_prod/): model A's layout with dims at which every production round trip applies
# (head_dim 128 with 64 rope dims -> one FP8 block of 64 non-rope dims; index_head_dim 128 ->
# Hadamard + FP4; 16 indexer heads keep relu from tying scores), hidden 64, vocab 256 and 4
# layers to keep the fixture under 2 MB.
def tiny_prod_spec(base: dict) -> dict:
    return dict(base, vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=128,
                partial_rotary_factor=0.5, q_lora_rank=32, o_groups=2, o_lora_rank=32, moe_intermediate_size=16,
                index_n_heads=16, index_head_dim=128, index_topk=8,
                layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                             "compressed_sparse_attention"],
                mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})


@torch.no_grad()
def greedy_chain(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """n argmax tokens by full recomputation (no cache), lowest id on exact ties; and the
    top-1 minus top-2 logit margin of each step."""
    ids, out, margins = list(prompt), [], []
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
        top = torch.topk(logits, 2)
        out.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(out[-1])
    return out, margins


def self_check() -> None:
    """The rounding helpers on hand-picked values (ties, saturation, scales)."""
    q = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, -0.25, -2.6, 6.0])
    want = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -3.0, 6.0])
    assert torch.equal(e2m1(q), want), e2m1(q)
    assert torch.equal(pow2_ceil(torch.tensor([0.5, 0.75, 3.0, 4.0])), torch.tensor([0.5, 1.0, 4.0, 4.0]))
    x = torch.zeros(1, 128)
    x[0, :64] = torch.linspace(-3.0, 5.0, 64)
    x[0, 64:] = 123.456  # rope dims: untouched
    y = fp8_round_trip(x, 64)
    assert torch.equal(y[0, 64:], x[0, 64:])
    scale = 2.0 ** -6  # pow2ceil(5/448)
    assert torch.equal(y[0, :64], (x[0, :64] / scale).to(torch.float8_e4m3fn).float() * scale)
    h = hadamard_128()
    assert torch.equal(h @ h, 128 * torch.eye(128))
    v = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    r = fp4_round_trip(v, hadamard=True)
    s = (v @ h) * 0.08838834764831845
    assert (r - s).abs().max() <= s.abs().amax() / 6 / 2 * 2 + 1e-6  # within half an FP4 step
