"""Training-only additions to transformers' DeepSeek-V4 (nothing here changes the forward math).

- dense_experts: every expert computed for every token, weighted by the (sparse) routing weights:
  same result as transformers' per-expert loop, but no data-dependent shapes or host syncs, so a
  step is a fixed sequence of batched kernels.
- IndexerDistill: the lightning indexer only selects blocks (top-k), so it gets no gradient from
  the LM loss. As in DeepSeek-V3.2's indexer training, it is fitted to the main attention: the
  target is the head-averaged softmax of the main queries over ALL causal compressed blocks of
  the layer (detached), the loss KL(target || softmax(indexer scores)). Indexer inputs are
  detached, so this loss trains only the indexer.
- RouterBalance: auxiliary-loss-free load balancing (DeepSeek-V3): after each step every biased
  router's e_score_correction_bias moves by `rate` toward equal expert load.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m


def dense_experts(self, hidden_states, top_k_index, top_k_weights):
    """hidden [N, D], top_k_index/weights [N, k] -> [N, D]."""
    n = hidden_states.shape[0]
    gate_up = torch.einsum("nd,eod->neo", hidden_states, self.gate_up_proj.to(hidden_states.dtype))
    act = self._apply_gate(gate_up)                                                  # [N, E, I]
    out = torch.einsum("nei,edi->ned", act, self.down_proj.to(act.dtype))             # [N, E, D]
    w = torch.zeros(n, self.num_experts, device=out.device, dtype=torch.float32)
    w = w.scatter_add(1, top_k_index, top_k_weights.float())                           # duplicates add, as in HF
    return (out.float() * w.unsqueeze(-1)).sum(1).to(hidden_states.dtype)


def use_dense_experts() -> None:
    m.DeepseekV4Experts.forward = dense_experts


def _causal_block_mask(seq_len: int, n_blocks: int, ratio: int, device) -> torch.Tensor:
    """[S, C] True where query position s may see compressed block c ((s+1)//ratio > c)."""
    ready = (torch.arange(seq_len, device=device) + 1) // ratio
    return torch.arange(n_blocks, device=device).view(1, -1) < ready.view(-1, 1)


class IndexerDistill:
    def __init__(self, model):
        self.scores, self.targets, self.handles = {}, {}, []
        self.enabled = True
        self._orig_eager = m.eager_attention_forward
        for layer in model.model.layers:
            att = layer.self_attn
            if isinstance(att.compressor, m.DeepseekV4CSACompressor):
                idx = att.compressor.indexer
                key = id(att)
                self.handles.append(idx.register_forward_pre_hook(self._detach_inputs))
                self.handles.append(idx.scorer.register_forward_hook(self._keep(key)))
        m.eager_attention_forward = self._eager

    @staticmethod
    def _detach_inputs(module, args):
        h, q, *rest = args
        return (h.detach(), q.detach(), *rest)

    def _keep(self, key):
        def hook(module, args, out):
            if self.enabled:
                self.scores[key] = out                                             # [B, S, C] fp32
        return hook

    def _eager(self, module, query, key, value, attention_mask, scaling, **kw):
        comp = getattr(module, "compressor", None)
        if self.enabled and isinstance(comp, m.DeepseekV4CSACompressor):
            s = query.shape[2]
            kc = key[:, :, s:, :]                                                  # compressed entries [B,1,C,d]
            if kc.shape[2] > 0:
                with torch.no_grad():
                    logits = torch.matmul(query.float(), kc.float().transpose(2, 3)) * scaling   # [B,H,S,C]
                    ok = _causal_block_mask(s, kc.shape[2], comp.compress_rate, query.device)
                    logits = logits.masked_fill(~ok, float("-inf"))
                    p = torch.softmax(logits, dim=-1).nan_to_num(0.0).mean(1)                  # [B,S,C]
                self.targets[id(module)] = (p, ok)
        return self._orig_eager(module, query, key, value, attention_mask, scaling, **kw)

    def loss(self) -> torch.Tensor:
        total, n = None, 0
        for key, scores in self.scores.items():
            if key not in self.targets:
                continue
            p, ok = self.targets[key]
            logq = torch.log_softmax(scores.float().masked_fill(~ok, float("-inf")), dim=-1)
            rows = ok.any(-1)                                                          # queries with >= 1 block
            kl = (p * (torch.log(p.clamp_min(1e-12)) - logq.clamp_min(-1e4))).masked_fill(~ok, 0.0).sum(-1)
            term = kl[:, rows].mean()
            total = term if total is None else total + term
            n += 1
        self.scores.clear()
        self.targets.clear()
        return total / n if n else torch.zeros(())


class RouterBalance:
    def __init__(self, modules, rate: float = 1e-3):
        self.rate, self.counts, self.routers = rate, {}, []
        for mod in modules:
            for r in mod.modules():
                if isinstance(r, m.DeepseekV4TopKRouter):
                    self.routers.append(r)
                    r.register_forward_hook(self._count)

    def _count(self, router, args, out):
        idx = out[2]
        c = torch.bincount(idx.reshape(-1), minlength=router.num_experts).float()
        self.counts[id(router)] = self.counts.get(id(router), 0) + c

    @torch.no_grad()
    def step(self) -> float:
        """Apply the bias update; returns the worst max/mean load ratio seen this step."""
        worst = 0.0
        for r in self.routers:
            c = self.counts.pop(id(r), None)
            if c is None:
                continue
            mean = c.mean()
            r.e_score_correction_bias += self.rate * torch.sign(mean - c)
            worst = max(worst, float(c.max() / mean.clamp_min(1)))
        return worst
