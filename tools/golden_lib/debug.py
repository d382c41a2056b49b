"""Per-layer intermediates of one full forward, for bisecting engine mismatches."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


@torch.no_grad()
def dump(model, ids: list[int], path: Path) -> dict[str, tuple]:
    """Writes float32 arrays (batch dim dropped):
    embed [T,D]; streams_L [T,4,D] (residual streams after decoder layer L);
    attn_out_L [T,D] (attention block output, before the HC post/comb mix);
    moe_out_L [T,D] (routed + shared MoE output, before the HC mix);
    hc_head_out [T,D] (after hc_head, before the final norm); final_hidden [T,D] (after the norm)."""
    got: dict[str, np.ndarray] = {}

    def keep(key):
        def hook(mod, args, out):
            t = out[0] if isinstance(out, tuple) else out
            got[key] = t[0].float().numpy().copy()
        return hook

    mm = model.model
    handles = [mm.embed_tokens.register_forward_hook(keep("embed")),
               mm.hc_head.register_forward_hook(keep("hc_head_out")),
               mm.norm.register_forward_hook(keep("final_hidden"))]
    for i, layer in enumerate(mm.layers):
        handles += [layer.register_forward_hook(keep(f"streams_{i}")),
                    layer.self_attn.register_forward_hook(keep(f"attn_out_{i}")),
                    layer.mlp.register_forward_hook(keep(f"moe_out_{i}"))]
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    np.savez(path, **got)
    return {k: v.shape for k, v in got.items()}
