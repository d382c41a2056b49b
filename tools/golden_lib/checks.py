"""Self-consistency of the transformers reference (shared docs §3.5) and tie diagnostics.

Incremental runs (prefill+decode, chunked prefill, decode from token 0) must reproduce the
one-shot forward; if they do not, the randomisation produced top-k ties (indexer or router).
"""
from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

CHUNK_PATTERN = [37, 53, 1, 1, 7, 64, 13, 2, 29]


@torch.no_grad()
def run_chunks(model, ids: list[int], sizes: list[int]) -> np.ndarray:
    """Feed `ids` in consecutive chunks through one DynamicCache; returns logits [T, vocab]."""
    cache = DynamicCache(config=model.config)
    outs, pos = [], 0
    for n in sizes:
        x = torch.tensor([ids[pos:pos + n]], dtype=torch.long)
        out = model(input_ids=x, past_key_values=cache, use_cache=True)
        outs.append(out.logits[0].float())
        pos += n
    assert pos == len(ids)
    return torch.cat(outs).numpy()


def cover(total: int, pattern: list[int]) -> list[int]:
    sizes, i = [], 0
    while sum(sizes) < total:
        sizes.append(min(pattern[i % len(pattern)], total - sum(sizes)))
        i += 1
    return sizes


def consistency(model, ids: list[int], ref: np.ndarray) -> dict[str, float]:
    """Max |logit diff| of three incremental schedules against the one-shot logits `ref`."""
    t = len(ids)
    prefill = max(1, min(90, t // 3))
    runs = {
        f"prefill{prefill}+decode": [prefill] + [1] * (t - prefill),
        "chunked": cover(t, CHUNK_PATTERN),
    }
    if t <= 120:
        runs["decode_from_0"] = [1] * t
    return {name: float(np.abs(run_chunks(model, ids, sizes) - ref).max()) for name, sizes in runs.items()}


class TieMonitor:
    """Forward hooks measuring how close top-k selections are to ties in one forward:
    indexer (gap between the k-th and (k+1)-th causal score) and biased router
    (gap between the k-th and (k+1)-th of score+bias)."""

    def __init__(self, model):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
        self.cfg = model.config
        self.index_gaps, self.router_gaps = [], []
        self.index_absmax = 0.0
        self.handles = []
        for layer in model.model.layers:
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                self.handles.append(comp.indexer.scorer.register_forward_hook(self._on_scores))
            if isinstance(layer.mlp.gate, m.DeepseekV4TopKRouter):
                self.handles.append(layer.mlp.gate.register_forward_hook(self._on_router))

    def _on_scores(self, mod, args, out):           # out [B, S, T] (future blocks not yet masked)
        s = out[0]
        seq, nblk = s.shape
        ratio = self.cfg.compress_rates["compressed_sparse_attention"]
        k = self.cfg.index_topk
        self.index_absmax = max(self.index_absmax, float(s.abs().max()))
        pos = torch.arange(seq) + (0 if seq > 1 else -1)  # only meaningful for full forwards
        for p in range(seq):
            n_valid = min((int(pos[p]) + 1) // ratio, nblk)
            if n_valid > k:
                top = torch.sort(s[p, :n_valid], descending=True).values
                self.index_gaps.append(float(top[k - 1] - top[k]))

    def _on_router(self, mod, args, out):
        x = args[0].reshape(-1, self.cfg.hidden_size)
        scores = mod.score_fn(torch.nn.functional.linear(x, mod.weight)) + mod.e_score_correction_bias
        top = torch.sort(scores, dim=-1, descending=True).values
        k = mod.top_k
        self.router_gaps.extend((top[:, k - 1] - top[:, k]).tolist())

    def close(self) -> dict[str, float]:
        for h in self.handles:
            h.remove()
        return {"min_indexer_topk_gap": min(self.index_gaps, default=float("nan")),
                "n_indexer_selections": len(self.index_gaps),
                "indexer_score_absmax": self.index_absmax,
                "min_router_topk_gap": min(self.router_gaps, default=float("nan"))}
