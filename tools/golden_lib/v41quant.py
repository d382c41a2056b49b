"""V4.1 release weight encodings (MODEL-DEEPSEEK-V41.md §6) in torch, encode and decode.

FP8 e4m3 with one E8M0 scale per (bo x bi) block: 32x32 for the dense linears
(scale [ceil(out/32), ceil(in/32)]), 1x32 for the Engram table rows (scale [rows, dim/32]).
FP4 e2m1 routed experts: quant.fp4_encode (two codes per byte along K, element 2k in the LOW
nibble, one E8M0 scale per 32 along K: scale [out, in/32]). The scale exponent of a block is the
smallest e with amax <= qmax * 2^e (quant.pow2_exponent); values are w / 2^e rounded to nearest even.
The goldens pre-round every such weight (`round_fp8`, `round_fp4`), so the transformers-layout
checkpoint holds exactly the decoded release values and both layouts give the same logits.
"""
from __future__ import annotations

import torch

from . import quant


def _expand(e: torch.Tensor, bo: int, bi: int, shape) -> torch.Tensor:
    return e.repeat_interleave(bo, 0).repeat_interleave(bi, 1)[: shape[0], : shape[1]]


def fp8_encode(w: torch.Tensor, bo: int = 32, bi: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (uint8 e4m3 codes [out, in], uint8 E8M0 scales [ceil(out/bo), ceil(in/bi)])."""
    out, inp = w.shape
    ob, ib = -(-out // bo), -(-inp // bi)
    padded = torch.zeros(ob * bo, ib * bi, dtype=torch.float64)
    padded[:out, :inp] = w.double()
    amax = padded.view(ob, bo, ib, bi).abs().amax(dim=(1, 3))
    e = quant.pow2_exponent(amax, quant.FP8_MAX)
    scaled = torch.ldexp(w.double(), -_expand(e, bo, bi, w.shape)).float()   # exact (power of two)
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)                # RNE, |x| <= 448
    return codes, (e + 127).to(torch.uint8)


def fp8_decode(codes: torch.Tensor, scales: torch.Tensor, bo: int = 32, bi: int = 32) -> torch.Tensor:
    e = scales.to(torch.int32) - 127
    vals = codes.view(torch.float8_e4m3fn).float().double()
    return torch.ldexp(vals, _expand(e, bo, bi, codes.shape)).float()


def round_fp8(w: torch.Tensor, bo: int = 32, bi: int = 32) -> torch.Tensor:
    return fp8_decode(*fp8_encode(w, bo, bi), bo, bi)


def round_fp4(w: torch.Tensor) -> torch.Tensor:
    return quant.fp4_decode(*quant.fp4_encode(w))


def exact_fp8(w: torch.Tensor, bo: int = 32, bi: int = 32):
    """Encode a weight that is already FP8-representable; asserts the round trip is exact."""
    codes, scales = fp8_encode(w, bo, bi)
    if not torch.equal(fp8_decode(codes, scales, bo, bi), w.float()):
        raise AssertionError("weight is not exactly FP8-representable (was it pre-rounded?)")
    return codes, scales


def exact_fp4(w: torch.Tensor):
    packed, scales = quant.fp4_encode(w)
    if not torch.equal(quant.fp4_decode(packed, scales), w.float()):
        raise AssertionError("weight is not exactly FP4-representable (was it pre-rounded?)")
    return packed, scales
