"""The DeepSeek-V4.1 reference (transformers' deepseek_v41 at 0a2080b) and how we drive it.

The reference is not part of any released transformers: it lives in a git-ignored folder
(`.v41ref/site`, or $DEEPINFER_V41REF_SITE) holding the transformers 5.23.0 wheel installed with
--target and the deepseek_v41 folder placed into its models/ (see docs/MODEL-V41.md). `load()`
puts that folder first on sys.path before anything imports transformers.

Two reference quirks shape everything here (shared docs V41-REFERENCE-NOTES.md §1):
  - `DynamicCache(config=...)` raises on 5.23 for this model: `new_cache` builds the layers by
    hand (CSA cache at KV sources, a sliding layer elsewhere);
  - its no-cache forward mixes KV-source groups: every run here goes through a cache, and the
    golden "full" logits are ONE cache-path call over the whole sequence.
The Engram history lives on the model (position-indexed); `reset` clears it per sequence.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def site_dir() -> Path:
    return Path(os.environ.get("DEEPINFER_V41REF_SITE", REPO / ".v41ref" / "site"))


def load():
    """Import the reference modules; returns (modeling, configuration) modules."""
    site = site_dir()
    if not (site / "transformers" / "models" / "deepseek_v41" / "modeling_deepseek_v41.py").is_file():
        raise SystemExit(f"V4.1 reference not found under {site} (set DEEPINFER_V41REF_SITE; "
                         "see docs/MODEL-V41.md, 'Reference setup')")
    if "transformers" in sys.modules and not str(sys.modules["transformers"].__file__).startswith(str(site)):
        raise SystemExit("a different transformers was imported before the V4.1 reference")
    sys.path.insert(0, str(site))
    import transformers  # noqa: F401
    from transformers.models.deepseek_v41 import configuration_deepseek_v41 as c
    from transformers.models.deepseek_v41 import modeling_deepseek_v41 as m
    return m, c


class SyntheticTokenizer:
    """Stands in for a tokenizer in the reference's `build_compressed_token_map`: token t decodes to
    "w<t mod C>", so the reference's own map-building code gives class(t) = t mod C (first
    appearance order), the synthetic map of MODEL-DEEPSEEK-V41.md §9."""

    def __init__(self, vocab: int, classes: int):
        self.vocab, self.classes = vocab, classes
        self.backend_tokenizer = self

    def __len__(self) -> int:
        return self.vocab

    def decode(self, ids, skip_special_tokens=False) -> str:
        return f"w{ids[0] % self.classes}"

    def id_to_token(self, i: int) -> str:
        return self.decode([i])


def new_cache(model):
    """A fresh cache with one layer per main layer (the 5.23-compatible construction)."""
    m, _ = load()
    from transformers.cache_utils import Cache, DynamicSlidingWindowLayer
    cfg = model.config
    layers = [m.DeepseekV41CSACache(cfg) if t == "shared_compressed_attention"
              else DynamicSlidingWindowLayer(sliding_window=cfg.sliding_window) for t in cfg.layer_types]
    return Cache(layers=layers)


def reset(model) -> None:
    """Forget the Engram n-gram history (it lives on the model, not the cache)."""
    state = model.model.engram_hash_state
    if state is not None:
        state.history = None


def run_chunks(model, ids: list[int], sizes: list[int]):
    """Feed `ids` in consecutive chunks through one fresh cache; returns logits [T, V] (torch)."""
    import torch
    reset(model)
    cache = new_cache(model)
    outs, pos = [], 0
    with torch.no_grad():
        for n in sizes:
            x = torch.tensor([ids[pos:pos + n]], dtype=torch.long)
            position_ids = torch.arange(pos, pos + n).unsqueeze(0)
            out = model(input_ids=x, position_ids=position_ids, past_key_values=cache, use_cache=True)
            outs.append(out.logits[0].float())
            pos += n
    assert pos == len(ids)
    return torch.cat(outs)


def cover(total: int, pattern: list[int]) -> list[int]:
    """Chunk sizes following `pattern` cyclically, the last one cut to fit `total`."""
    sizes = []
    while sum(sizes) < total:
        sizes.append(min(pattern[len(sizes) % len(pattern)], total - sum(sizes)))
    return sizes
