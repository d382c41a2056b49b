"""Trainable MTP block (shared docs §7) on top of transformers' DeepseekV4ForCausalLM.

For main position t it drafts token t+2 from the main model's 4 final streams at t (before
hc_head) and the embedding of token t+1:
    X0_k = e_proj(enorm(embed[x_{t+1}])) + h_proj(hnorm(S_t,k))        k = 0..3
    X    = DecoderLayer(X0) at RoPE position t   (sliding-only, "main" rope, own window)
    logits = lm_head(norm(hc_head(X)))                                 embed / lm_head shared
Parameter names match tools/golden_lib/mtp.py's MtpRef (block.*, e_proj, h_proj, enorm, hnorm,
norm, hc_head.*) so golden_lib.official.encode_mtp writes it as mtp.0.*.
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


def sliding_mask(n: int, window: int, device, dtype=torch.float32) -> torch.Tensor:
    """[1, 1, n, n] additive mask: query q sees keys q-window+1 .. q."""
    q, k = torch.arange(n, device=device).view(-1, 1), torch.arange(n, device=device).view(1, -1)
    allowed = (k <= q) & (k > q - window)
    return torch.zeros(n, n, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))[None, None]


class MtpHead(nn.Module):
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

    def init_weights(self, std: float, gen: torch.Generator) -> None:
        """Same scheme as transformers' _init_weights for the main model."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if name.endswith("norm.weight") or name.endswith("layernorm.weight") or leaf in ("scale", "hc_scale"):
                    p.fill_(1.0)
                elif leaf in ("base", "hc_base", "sinks"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)

    def hidden(self, main_model, streams: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """streams [B, N, 4, D] (main streams at 0..N-1), next_ids [B, N] (= ids[1..N]) -> [B, N, D]
        final hidden of the draft (before lm_head). Positions start at 0, no cache."""
        n = next_ids.shape[1]
        e = self.enorm(main_model.model.embed_tokens(next_ids))
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(self.hnorm(streams))
        pos = torch.arange(n, device=x.device).unsqueeze(0)
        rot = main_model.model.rotary_emb
        pe = {"main": rot(x, position_ids=pos, layer_type="main"),
              "compress": rot(x, position_ids=pos, layer_type="compress")}
        mask = sliding_mask(n, self.window, x.device, dtype=x.dtype if x.dtype != torch.bfloat16 else torch.float32)
        x = self.block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=next_ids,
                       past_key_values=None)
        return self.norm(self.hc_head(x))
