"""The Engram sidecar (docs/MODEL-V41.md, "Engram"): the tokenizer's compressed-token class map and
the frozen hash multipliers, written next to the weights as `engram_sidecar.json` and read by the
engine (src/model/deepseek_v41/engram.h), which checks it against config.json.

    {"format": "deepinfer.engram_sidecar", "version": 1,
     "source": "<how the class map was built>", "tokenizer_sha256": "<hex of tokenizer.json>" | null,
     "num_ids": N, "num_classes": C, "classes": [c_0, ..., c_{N-1}],
     "max_ngram_size": n, "multipliers": [{"layer": l, "values": [m_0, ..., m_{n-1}]}, ...]}

classes[t] is token t's class, numbered by first appearance (classes[0] == 0, each new class is
max-so-far + 1). The class map is built exactly as the reference's `build_compressed_token_map`
does (with HF `tokenizers`: the same decoder and normalizers); the multipliers are numpy's
default_rng(10007 * layer).integers(0, (int64max // C) // 2, n) * 2 + 1, computed here once and
frozen in the file (the engine never recomputes them; tests check them against numpy).
Pure Python + numpy (+ `tokenizers` for a real tokenizer).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

FORMAT, VERSION, FILE_NAME = "deepinfer.engram_sidecar", 1, "engram_sidecar.json"


def multipliers(layer_ids, max_ngram_size: int, num_classes: int) -> list[list[int]]:
    bound = max(1, (np.iinfo(np.int64).max // num_classes) // 2)
    out = []
    for layer in layer_ids:
        rng = np.random.default_rng(10007 * layer)
        v = rng.integers(low=0, high=bound, size=(max_ngram_size,), dtype=np.int64) * 2 + 1
        out.append([int(x) for x in v])
    return out


def _normalizer():
    from tokenizers import Regex, normalizers
    sentinel = "\ue000"   # keeps a token that is exactly one space from stripping to ""
    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(), normalizers.Replace(sentinel, " ")])


def class_map(tokenizer_json: Path) -> list[int]:
    """The reference's class map for the tokenizer in `tokenizer_json`: one class per distinct key,
    key = the normalised single-token decode, the raw token string when the decode holds U+FFFD,
    the raw decode when normalising leaves nothing. Ids run over the whole tokenizer (added tokens
    included), as the reference's range(len(tokenizer))."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_json))
    norm = _normalizer()
    keys: dict[str, int] = {}
    out = []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        out.append(keys.setdefault(key, len(keys)))
    return out


def synthetic(vocab: int, num_classes: int) -> list[int]:
    """MODEL-DEEPSEEK-V41.md §9's test map: class(t) = t mod C."""
    return [t % num_classes for t in range(vocab)]


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write(path: Path, classes: list[int], source: str, tokenizer_sha256: str | None, layer_ids, max_ngram_size: int) -> dict:
    num = max(classes) + 1 if classes else 0
    doc = {"format": FORMAT, "version": VERSION, "source": source, "tokenizer_sha256": tokenizer_sha256,
           "num_ids": len(classes), "num_classes": num, "classes": classes, "max_ngram_size": max_ngram_size,
           "multipliers": [{"layer": int(l), "values": v}
                           for l, v in zip(layer_ids, multipliers(layer_ids, max_ngram_size, num))]}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return doc


def text_config(config_json: Path) -> dict:
    cfg = json.loads(Path(config_json).read_text())
    return cfg.get("text_config", cfg)
