"""Training checkpoints: the model and MTP state dicts, split into files of at most `max_bytes`
(the device tool returns files of at most 16 MiB). Float tensors the release stores as F32
(mHC, sinks, compressor position bias, router bias) stay fp32; every other float is rounded to
bf16 here, which is also what the shipped checkpoint stores."""
from __future__ import annotations

from pathlib import Path

import torch

F32_LEAVES = ("sinks", "position_bias", "e_score_correction_bias", "hc_fn", "hc_base", "hc_scale")


def keeps_fp32(name: str) -> bool:
    return "_hc." in name or name.rsplit(".", 1)[-1] in F32_LEAVES


def storage_form(name: str, t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if not t.is_floating_point():
        return t.clone()
    return t.float().clone() if keeps_fp32(name) else t.to(torch.bfloat16)


def save_sharded(parts: dict, out: Path, stem: str, meta: dict, max_bytes: int = 12 << 20) -> list[Path]:
    """parts: {"model": state_dict, "mtp": state_dict}. Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    shards, cur, size = [], {}, 0
    for part, sd in parts.items():
        for name, t in sd.items():
            v = storage_form(name, t)
            nb = v.numel() * v.element_size()
            if cur and size + nb > max_bytes:
                shards.append(cur)
                cur, size = {}, 0
            cur[f"{part}/{name}"] = v
            size += nb
    shards.append(cur)
    files = []
    for i, sh in enumerate(shards):
        f = out / f"{stem}-{i:02d}-of-{len(shards):02d}.pt"
        torch.save({"tensors": sh, "meta": meta if i == 0 else None}, f)
        files.append(f)
    for old in out.glob(f"{stem}-*.pt"):
        if old not in files:
            old.unlink()
    return files


def load_sharded(folder: Path, stem: str) -> tuple[dict, dict]:
    """-> ({"model": sd, "mtp": sd} with fp32 floats, meta)."""
    parts, meta = {}, None
    files = sorted(folder.glob(f"{stem}-*.pt"))
    if not files:
        raise FileNotFoundError(f"no {stem}-*.pt checkpoint files in {folder}")
    for f in files:
        blob = torch.load(f, map_location="cpu")
        meta = meta or blob["meta"]
        for key, t in blob["tensors"].items():
            part, name = key.split("/", 1)
            parts.setdefault(part, {})[name] = t.float() if t.is_floating_point() else t
    return parts, meta
