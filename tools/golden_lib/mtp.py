"""Reference MTP draft head (shared docs §7), assembled from transformers' own modules.

For main position t (0 <= t < T-1):
    e   = enorm(embed[ids[t+1]])
    X0k = e_proj(e) + h_proj(hnorm(S_t,k))      S_t = main model's 4 streams at t, before hc_head
    X   = DecoderLayer(X0) at RoPE position t  (sliding-only layer, "main" rope: theta 1e4, no YaRN,
                                                 its own window over MTP positions 0..t)
    logits_t = lm_head(norm(hc_head(X)))       embed and lm_head shared with the main model
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m


def mtp_config(cfg):
    c = copy.deepcopy(cfg)
    c.num_hidden_layers = 1
    c.layer_types = ["sliding_attention"]
    c.mlp_layer_types = ["moe"]
    c._attn_implementation = "eager"
    return c


class MtpRef(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = mtp_config(cfg)
        d = cfg.hidden_size
        self.block = m.DeepseekV4DecoderLayer(c, 0)
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.enorm = m.DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.hnorm = m.DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.norm = m.DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.hc_head = m.DeepseekV4HyperHead(c)
        self.window = cfg.sliding_window

    @torch.no_grad()
    def forward(self, main_model, streams: torch.Tensor, next_ids: torch.Tensor, start: int = 0,
                cache=None) -> torch.Tensor:
        """streams [1, N, 4, D] = main streams at positions start..start+N-1, next_ids [1, N] =
        ids[start+1 .. start+N]. `cache`: a DynamicCache of mtp_config (incremental use) or None
        (then start must be 0). Returns draft logits [N, V]."""
        n = next_ids.shape[1]
        e = self.enorm(main_model.model.embed_tokens(next_ids))
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(self.hnorm(streams))
        pos = torch.arange(start, start + n).unsqueeze(0)
        rot = main_model.model.rotary_emb
        pe = {"main": rot(x, position_ids=pos, layer_type="main"),
              "compress": rot(x, position_ids=pos, layer_type="compress")}
        prev = min(start, self.window - 1) if cache is not None else 0   # HF keeps window-1 old keys
        qpos, kpos = pos.view(-1, 1), torch.arange(start - prev, start + n).view(1, -1)
        allowed = (kpos <= qpos) & (kpos > qpos - self.window)            # keys t-window+1 .. t
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
        x = self.block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask,
                       input_ids=next_ids, past_key_values=cache)
        return main_model.lm_head(self.norm(self.hc_head(x)))[0]


@torch.no_grad()
def main_streams_and_logits(model, ids: list[int]):
    """One full forward; returns (streams before hc_head [1, T, 4, D], logits [T, V])."""
    got = {}
    h = model.model.hc_head.register_forward_hook(lambda mod, a, o: got.__setitem__("s", a[0].clone()))
    try:
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        h.remove()
    return got["s"], logits


@torch.no_grad()
def manual_main_logits(model, ids: list[int]) -> torch.Tensor:
    """The main model re-run through the same plumbing MtpRef uses (own mask, rope dict, direct
    layer calls) — validates that plumbing against model() itself."""
    mm = model.model
    x = torch.tensor([ids])
    n = x.shape[1]
    h = mm.embed_tokens(x).unsqueeze(2).expand(-1, -1, model.config.hc_mult, -1).contiguous()
    pos = torch.arange(n).unsqueeze(0)
    pe = {t: mm.rotary_emb(h, position_ids=pos, layer_type=t) for t in ("main", "compress")}
    q, k = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    allowed = (k <= q) & (k > q - model.config.sliding_window)
    mask = torch.zeros(n, n).masked_fill(~allowed, float("-inf")).view(1, 1, n, n)
    for layer in mm.layers:
        h = layer(h, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=x,
                  past_key_values=None)
    return model.lm_head(mm.norm(mm.hc_head(h)))[0]
