"""tests/data/golden/v41_qat: the reference's own QAT round trips on hand-made and random rows.

For each format (the reference function in parentheses) `<fmt>_in.f32` holds rows x n float32
values (little-endian, row-major) and `<fmt>_out.f32` what the reference returns for them:
  fp8_ue8m0_b32   window KV          (_fake_quant_fp8_block(x, 32))
  fp4_e4m3_b16    compressed entries (_fake_quant_fp4_block(x, 16, e4m3_scales=True))
  fp4_ue8m0_b32   index keys/queries (_fake_quant_fp4_block(x, 32))
plus `<fmt>_skip_*`: a row length that is not a multiple of the block (returned unchanged).
Rows: random N(0,1) at scales 1e-30 .. 1e30, all-zero, -0, subnormals, exact rounding ties of
the value grid and of the scale, huge values (the e4m3 scale overflowing to NaN), NaN and Inf.
meta.json lists rows, n and what each row is.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from . import v41ref

FORMATS = {"fp8_ue8m0_b32": 32, "fp4_e4m3_b16": 16, "fp4_ue8m0_b32": 32}
N = 64


def _apply(m, fmt: str, x: torch.Tensor) -> torch.Tensor:
    if fmt == "fp8_ue8m0_b32":
        return m._fake_quant_fp8_block(x, 32)
    if fmt == "fp4_e4m3_b16":
        return m._fake_quant_fp4_block(x, 16, e4m3_scales=True)
    return m._fake_quant_fp4_block(x, 32)


def _grid_ties(fmt: str, rng) -> np.ndarray:
    """A row whose values sit exactly on rounding midpoints once divided by the block scale."""
    row = np.zeros(N, np.float32)
    if fmt.startswith("fp4"):
        mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32)
    else:   # e4m3 midpoints: between consecutive codes of a few binades, plus the top
        codes = np.arange(0, 0x7e, dtype=np.uint8)
        vals = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
        mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
        mids = np.concatenate([mids[rng.choice(len(mids), 30, replace=False)], np.float32([448.0])])
    for j in range(0, N, FORMATS[fmt]):
        blk = rng.choice(mids, FORMATS[fmt]) * rng.choice([-1, 1], FORMATS[fmt])
        # Pins amax to 448 / 6: 448 * fl(1/448) == 6 * fl(1/6) == 6 / 6 == 1 exactly in fp32, so
        # the block scale is 1 and the values are exact midpoints of the grid.
        blk[0] = mids.max()
        row[j:j + FORMATS[fmt]] = blk
    return row


def rows_for(fmt: str, rng) -> tuple[np.ndarray, list[str]]:
    rows, what = [], []

    def add(r, label):
        rows.append(np.asarray(r, np.float32).reshape(N))
        what.append(label)

    for s in (1.0, 1e-3, 1e3, 1e-30, 1e30, 3e-5, 0.05):
        add(rng.standard_normal(N) * s, f"N(0,1) * {s:g}")
    add(np.zeros(N), "all zero")
    add(-np.zeros(N), "all -0")
    z = rng.standard_normal(N).astype(np.float32)
    z[::3] = -0.0
    add(z, "N(0,1) with -0 entries")
    add(rng.standard_normal(N) * 1e-41, "subnormals")
    add(np.full(N, 1e-4, np.float32) * rng.choice([-1, 1], N), "+-1e-4 (the FP8 amax floor)")
    add(np.full(N, 6 * 2.0 ** -9, np.float32), "6*2^-9 (the FP4-e4m3 amax floor)")
    add(_grid_ties(fmt, rng), "exact rounding midpoints of the value grid")
    for amax in (2688.0, 2784.0, 2784.5, 2880.0, 1e5):
        r = rng.standard_normal(N).astype(np.float32)
        r[::16] = amax
        add(r, f"amax {amax:g} (e4m3 scale saturates / overflows)")
    r = rng.standard_normal(N).astype(np.float32)
    r[5] = np.nan
    add(r, "one NaN in the first block")
    r = rng.standard_normal(N).astype(np.float32)
    r[40] = np.inf
    r[41] = -np.inf
    add(r, "+-Inf in a later block")
    for k in range(6):
        add(rng.standard_normal(N) * np.exp(rng.uniform(-8, 8)), f"random scale draw {k}")
    return np.stack(rows), what


def build(out: Path, seed: int = 7) -> None:
    m, _ = v41ref.load()
    d = out / "v41_qat"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    meta = {"reference": "transformers deepseek_v41 @0a2080b: _fake_quant_fp8_block / _fake_quant_fp4_block",
            "n": N, "formats": {}}
    for fmt, block in FORMATS.items():
        x, what = rows_for(fmt, rng)
        y = _apply(m, fmt, torch.from_numpy(x)).numpy()
        x.astype("<f4").tofile(d / f"{fmt}_in.f32")
        y.astype("<f4").tofile(d / f"{fmt}_out.f32")
        skip_n = block + block // 2
        xs = (rng.standard_normal((3, skip_n)) * 10).astype(np.float32)
        ys = _apply(m, fmt, torch.from_numpy(xs)).numpy()
        assert np.array_equal(xs, ys)
        xs.astype("<f4").tofile(d / f"{fmt}_skip_in.f32")
        meta["formats"][fmt] = {"block": block, "rows": len(what), "what": what, "skip_rows": 3, "skip_n": skip_n,
                                "nan_rows": int(np.isnan(y).any(axis=1).sum())}
        print(f"  v41_qat/{fmt}: {len(what)} rows x {N}, {meta['formats'][fmt]['nan_rows']} rows with NaN outputs")
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
