"""Self-consistency of the V4.1 reference's own paths, and how close its selections are to ties.

The reference is chaotic on random inputs (V41-REFERENCE-NOTES.md §1): a 1e-6 difference can
cross an FP8/FP4 step and flip a top-k pick. A golden sequence is accepted only if
  - chunked (odd cuts), prefill+decode and token-by-token cache-path runs reproduce the one-call
    cache-path logits to <= 1e-4, and
  - no selection boundary is close to a tie: for every index top-k, candidate-block top-k and
    router top-k, (k-th best - (k+1)-th best) / |best| >= the thresholds below (the notes' rule).
`Monitor` recomputes the scores from the reference's own modules in forward hooks (the reference
exposes no scores): the same calls in the same order, so the values are the ones it selected on.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import v41ref

TOL_PATHS = 1e-4
MIN_REL_GAP_INDEX = 1e-5      # index and candidate-block selections
MIN_REL_GAP_ROUTER = 5e-6
CHUNK_PATTERN = [7, 1, 5, 13, 2, 9, 3, 37, 1, 11]   # odd cuts: split ratio-2 pairs and blocks


def _rel_gaps(rows: torch.Tensor, k: int) -> list[float]:
    """Rows [N, n] with -inf for invisible entries: relative gap at the k boundary per row where
    more than k entries are visible."""
    out = []
    for r in rows:
        vis = r[torch.isfinite(r)]
        if vis.numel() > k:
            top = torch.sort(vis, descending=True).values
            out.append(float(top[k - 1] - top[k]) / max(abs(float(top[0])), 1e-30))
    return out


class Monitor:
    def __init__(self, model):
        self.m, _ = v41ref.load()
        self.model = model
        self.index_gaps, self.cand_gaps, self.router_gaps = [], [], []
        self.filtered_queries = 0      # queries whose visible entries the candidate mask cut
        self.handles = []
        for layer in model.model.layers:
            if layer.attn.indexer is not None:
                self.handles.append(layer.attn.indexer.register_forward_hook(self._on_indexer))
            self.handles.append(layer.ffn.gate.register_forward_hook(self._on_router))

    @torch.no_grad()
    def _on_indexer(self, mod, args, _out):
        m = self.m
        hidden, q_res, _latent, _first, position_ids, _cache, shared = args
        index_k = shared.get("index_k")
        if index_k is None or index_k.shape[2] == 0:
            return
        b, s, _ = hidden.shape
        cos, sin = mod.rotary_emb(hidden, position_ids=position_ids, layer_type="compress")
        q = m.apply_rotary_pos_emb(mod.wq_b(q_res).view(b, s, mod.num_heads, mod.head_dim), cos, sin)
        q = m._fake_quant_fp4_block(q, block_size=32)
        scores = torch.einsum("bshd,btd->bsht", q.float(), index_k[:, 0].float()).relu_() * mod.softmax_scale
        weights = mod.weights_proj(hidden).float() * mod.heads_scaling
        sc = (scores * weights.unsqueeze(-1)).sum(dim=2)[0]                       # [S, T]
        n = sc.shape[-1]
        lens = (position_ids[0].long() + 1) // mod.compress_ratio                 # [S]
        sc = sc.masked_fill(torch.arange(n).view(1, -1) >= lens.view(-1, 1), -math.inf)
        if mod.is_candidate_source:
            self._candidate_gaps(sc, lens, mod.candidate_topk_blocks, mod.candidate_block_size)
        elif mod.uses_candidates and shared.get("candidates") is not None:
            masked = sc.masked_fill(~shared["candidates"][0], -math.inf)
            self.filtered_queries += int((torch.isfinite(masked).sum(-1) < torch.isfinite(sc).sum(-1)).sum())
            sc = masked
        self.index_gaps += _rel_gaps(sc, min(mod.index_topk, n))

    def _candidate_gaps(self, sc: torch.Tensor, lens: torch.Tensor, topk_blocks: int, bs: int) -> None:
        width = sc.shape[-1]
        blocks = F.pad(sc, (0, -width % bs), value=-math.inf).unflatten(-1, (-1, bs)).amax(-1)   # [S, nb]
        pinned = (lens - 1) // bs
        others = blocks.clone()
        others[torch.arange(others.shape[0]), pinned.clamp_min(0)] = -math.inf    # the pinned block never competes
        if topk_blocks > 1:
            self.cand_gaps += _rel_gaps(others, topk_blocks - 1)

    @torch.no_grad()
    def _on_router(self, mod, args, _out):
        flat = args[0].reshape(-1, args[0].shape[-1]).float()
        scores = mod.score_fn(F.linear(flat, mod.weight.float()) / mod.gate_temp) + mod.bias
        self.router_gaps += _rel_gaps(scores, mod.top_k)

    def close(self) -> dict:
        for h in self.handles:
            h.remove()
        return {"min_rel_gap_index": min(self.index_gaps, default=math.inf),
                "n_index_selections": len(self.index_gaps),
                "min_rel_gap_candidate": min(self.cand_gaps, default=math.inf),
                "n_candidate_selections": len(self.cand_gaps),
                "min_rel_gap_router": min(self.router_gaps, default=math.inf),
                "candidate_filtered_queries": self.filtered_queries}


def margins_ok(gaps: dict) -> bool:
    return (gaps["min_rel_gap_index"] >= MIN_REL_GAP_INDEX and gaps["min_rel_gap_candidate"] >= MIN_REL_GAP_INDEX
            and gaps["min_rel_gap_router"] >= MIN_REL_GAP_ROUTER)


def path_schedules(t: int) -> dict[str, list[int]]:
    prefill = max(1, (t // 2) | 1)
    runs = {"chunked": v41ref.cover(t, CHUNK_PATTERN), "token_by_token": [1] * t}
    if t > 2:
        runs[f"prefill{prefill}+decode"] = [prefill] + [1] * (t - prefill)
    return runs


def full_and_paths(model, ids: list[int]) -> tuple[torch.Tensor, dict, dict]:
    """One-call cache-path logits [T, V], their tie margins, and max |diff| of every other path."""
    mon = Monitor(model)
    full = v41ref.run_chunks(model, ids, [len(ids)])
    gaps = mon.close()
    diffs = {name: float((v41ref.run_chunks(model, ids, sizes) - full).abs().max())
             for name, sizes in path_schedules(len(ids)).items()} if len(ids) > 1 else {}
    return full, gaps, diffs


@torch.no_grad()
def no_cache_diff(model, ids: list[int], full: torch.Tensor) -> float:
    """The reference's no-cache forward against the cache path (documented as wrong with > 1 KV source)."""
    v41ref.reset(model)
    out = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    return float((out - full).abs().max())


class ClampMonitor:
    """Share of routed + shared expert pre-activations the SwiGLU clamp changes (gate above the
    limit, up outside +-limit): shows whether a fixture's swiglu_limit really clamps."""

    def __init__(self, model):
        self.limit = model.config.swiglu_limit
        self.counts = {"gate": 0, "up": 0, "n": 0}
        self.handles = []
        for layer in model.model.layers:
            for e in list(layer.ffn.experts) + [layer.ffn.shared_experts]:
                self.handles.append(e.w1.register_forward_hook(self._gate))
                self.handles.append(e.w3.register_forward_hook(self._up))

    def _gate(self, _mod, _args, out):
        self.counts["gate"] += int((out > self.limit).sum())
        self.counts["n"] += out.numel()

    def _up(self, _mod, _args, out):
        self.counts["up"] += int((out.abs() > self.limit).sum())

    def close(self) -> dict:
        for h in self.handles:
            h.remove()
        n = max(1, self.counts["n"])
        return {"swiglu_limit": self.limit, "gate_clamped_share": self.counts["gate"] / n,
                "up_clamped_share": self.counts["up"] / n}
