"""Release weight encodings (shared docs §8.1), encode and decode, in torch.

FP8: e4m3fn values, one E8M0 scale per 128x128 block (grid ceil(out/128) x ceil(in/128)).
FP4: e2m1 codes packed two per byte along the input dim (element 2k low nibble, 2k+1 high
     nibble), one E8M0 scale per 32 consecutive input elements.
E8M0 byte b means 2^(b-127). A block's exponent e is the SMALLEST integer with amax <= qmax * 2^e
(qmax 448 for e4m3, 6 for e2m1), i.e. e = ceil(log2(amax / qmax)); an all-zero block gets e = 0.
Values are divided by 2^e (exact) and rounded to nearest, ties to even.
"""
from __future__ import annotations

import torch

FP8_MAX, FP4_MAX = 448.0, 6.0
FP8_BLOCK, FP4_BLOCK = 128, 32
E2M1_MAGS = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
E2M1_MIDS = (E2M1_MAGS[1:] + E2M1_MAGS[:-1]) / 2          # 0.25 0.75 1.25 1.75 2.5 3.5 5


def pow2_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest integer e with amax <= qmax * 2^e (int32); e = 0 where amax == 0."""
    a = amax.double()
    e = torch.ceil(torch.log2(torch.where(a > 0, a / qmax, torch.ones_like(a)))).to(torch.int32)
    for _ in range(2):  # repair any off-by-one from log2 rounding
        e = torch.where(a > qmax * torch.ldexp(torch.ones_like(a), e), e + 1, e)
        e = torch.where((a > 0) & (a <= qmax * torch.ldexp(torch.ones_like(a), e - 1)), e - 1, e)
    if (e < -127).any() or (e > 127).any():
        raise ValueError("block scale outside the E8M0 range")
    return e


def _block_view(w: torch.Tensor, b: int) -> tuple[torch.Tensor, int, int]:
    out, inp = w.shape
    ob, ib = -(-out // b), -(-inp // b)
    padded = torch.zeros(ob * b, ib * b, dtype=torch.float64)
    padded[:out, :inp] = w.double()
    return padded.view(ob, b, ib, b), ob, ib


def fp8_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (uint8 e4m3 codes [out, in], uint8 E8M0 scales [ceil(out/128), ceil(in/128)])."""
    blocks, ob, ib = _block_view(w, FP8_BLOCK)
    e = pow2_exponent(blocks.abs().amax(dim=(1, 3)), FP8_MAX)                     # [ob, ib]
    full = e.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[: w.shape[0], : w.shape[1]]
    scaled = torch.ldexp(w.double(), -full).float()          # exact: power-of-two division
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)  # round to nearest even
    return codes, (e + 127).to(torch.uint8)


def fp8_decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    e = scales.to(torch.int32) - 127
    full = e.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[: codes.shape[0], : codes.shape[1]]
    return torch.ldexp(codes.view(torch.float8_e4m3fn).float().double(), full).float()


def fp4_encode(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] (in % 32 == 0) -> (int8 packed [out, in/2], uint8 E8M0 scales [out, in/32])."""
    out, inp = w.shape
    if inp % FP4_BLOCK:
        raise ValueError(f"FP4 needs in_features % 32 == 0, got {inp}")
    g = w.double().view(out, inp // FP4_BLOCK, FP4_BLOCK)
    e = pow2_exponent(g.abs().amax(dim=2), FP4_MAX)                                  # [out, in/32]
    x = torch.ldexp(g, -e.unsqueeze(-1).expand_as(g))
    a = x.abs()
    idx = (a.unsqueeze(-1) > E2M1_MIDS).sum(-1)                                       # round half down
    tie = a.unsqueeze(-1) == E2M1_MIDS                                                # exactly halfway
    k = torch.where(tie.any(-1), tie.double().argmax(-1), torch.zeros_like(idx))
    idx = torch.where(tie.any(-1), k + (k % 2), idx)                                  # ties to even code
    code = (idx | ((x < 0).long() << 3)).view(out, inp).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed.view(torch.int8), (e + 127).to(torch.uint8)


def fp4_decode(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    p = packed.view(torch.uint8).long()
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).view(p.shape[0], -1)              # [out, in]
    mags = E2M1_MAGS[codes & 7]
    vals = torch.where(codes >= 8, -mags, mags)
    e = (scales.to(torch.int32) - 127).repeat_interleave(FP4_BLOCK, 1)
    return torch.ldexp(vals, e).float()
