"""tests/data/golden/v41_engram: the reference's Engram row ids on random token streams.

Per case `<case>_tokens.i32` (T token ids), `<case>_dead.u8` (T flags: 1 = DEAD, the reference's
token_mask False) and `<case>_rows.i64` ([T, layers, columns] row ids into each layer's table, from
the reference's DeepseekV41NgramHashState over the whole stream at once), plus meta.json (the
Engram config of each case). Cases:
  a       v41_a's Engram (layers 1, 4; 3-grams x 2 heads; engram_vocab 250), class(t) = t mod 300
  b_dead  v41_b's Engram (layers 0, 5; 4-grams x 2 heads; engram_vocab 160), t mod 200, with DEAD
          positions (single ones and a run)
  v3      the release's Engram shape (layers 1, 14; 4-grams x 8 heads; engram_vocab 16,000,000) with
          the class map of the DeepSeek-V3 tokenizer (98,627 classes: the V4.1 tokenizer is not
          available here); `v3_engram_sidecar.json` is that map written by tools/make_engram_sidecar.py
The engine's hasher must reproduce the rows bit for bit, also when fed in chunks.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from . import v41configs, v41engram, v41ref

V3_TOKENIZER = Path("/work/shared/data/tokenizers/deepseek-v3/tokenizer.json")
T = 300


def _engram_spec(base: dict, **over) -> dict:
    keys = ("engram_layer_ids", "engram_max_ngram_size", "engram_n_heads", "engram_head_dim", "engram_vocab_size",
            "engram_compressed_vocab_size", "engram_pad_id", "vocab_size")
    return {**{k: base[k] for k in keys}, **over}


class _MapTokenizer:
    """A tokenizer stand-in whose decode gives each id its class key (so the reference's own map
    builder reproduces `classes`)."""

    def __init__(self, classes: list[int]):
        self.classes = classes
        self.backend_tokenizer = self

    def __len__(self):
        return len(self.classes)

    def decode(self, ids, skip_special_tokens=False):
        return f"k{self.classes[ids[0]]}"

    def id_to_token(self, i):
        return self.decode([i])


def _hash_state(m, c, spec: dict, tokenizer):
    cfg = c.DeepseekV41TextConfig(num_hidden_layers=max(spec["engram_layer_ids"]) + 3, num_nextn_predict_layers=0,
                                  **{**spec, "engram_num_embeddings": [1] * len(spec["engram_layer_ids"])})
    return m.DeepseekV41NgramHashState(cfg, tokenizer)


def build(out: Path, seed: int = 31) -> None:
    m, c = v41ref.load()
    d = out / "v41_engram"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cases = {"a": (_engram_spec(v41configs.TINY_A), None), "b_dead": (_engram_spec(v41configs.TINY_B), None)}
    if V3_TOKENIZER.is_file():
        classes = v41engram.class_map(V3_TOKENIZER)
        ref_classes, ref_n = m.build_compressed_token_map(_hf_tokenizer(V3_TOKENIZER))
        assert classes == ref_classes, "class map differs from the reference's build_compressed_token_map"
        cases["v3"] = (_engram_spec(v41configs.TINY_A, engram_layer_ids=[1, 14], engram_max_ngram_size=4,
                                    engram_n_heads=8, engram_head_dim=256, engram_vocab_size=16000000,
                                    engram_compressed_vocab_size=ref_n, vocab_size=129280), classes)
        v41engram.write(d / "v3_engram_sidecar.json", classes, "tokenizer deepseek-v3 tokenizer.json: reference "
                        "build_compressed_token_map", v41engram.sha256(V3_TOKENIZER), [1, 14], 4)
    meta = {"reference": "transformers deepseek_v41 @0a2080b: DeepseekV41NgramHashState", "T": T, "cases": {}}
    for name, (spec, classes) in cases.items():
        if classes is None:
            classes = v41engram.synthetic(spec["vocab_size"], spec["engram_compressed_vocab_size"])
        state = _hash_state(m, c, spec, _MapTokenizer(classes))
        tokens = rng.integers(0, len(classes), size=T).astype(np.int32)
        dead = np.zeros(T, np.uint8)
        if name == "b_dead":
            dead[rng.choice(T, 12, replace=False)] = 1
            dead[100:106] = 1
            dead[0] = 1
        rows = state(torch.from_numpy(tokens.astype(np.int64))[None], torch.arange(T)[None],
                     torch.from_numpy(dead == 0)[None])[0].numpy()
        tokens.tofile(d / f"{name}_tokens.i32")
        dead.tofile(d / f"{name}_dead.u8")
        rows.astype("<i8").tofile(d / f"{name}_rows.i64")
        meta["cases"][name] = {"engram": spec, "num_ids": len(classes), "rows_shape": list(rows.shape),
                               "dead_positions": int(dead.sum()), "primes": [list(map(list, p)) for p in state.layout.primes],
                               "multipliers": state.multipliers.tolist()}
        print(f"  v41_engram/{name}: rows {list(rows.shape)}, {int(dead.sum())} DEAD")
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def _hf_tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_file=str(path))
