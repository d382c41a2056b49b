"""The Engram class-map sidecar (docs/MODEL-V41.md, "Engram class map"): written next to the
weights as `engram_classes.json`, read by the engine, checked against the config.

    {"format": "deepinfer.engram_classes", "version": 1,
     "source": "<how it was built>", "tokenizer_sha256": "<hex of tokenizer.json>" | null,
     "num_ids": N, "num_classes": C, "classes": [c_0, ..., c_{N-1}]}

`classes[t]` is the compressed class of token t (classes numbered by first appearance, so
classes[0] == 0 and every class c first appears after classes 0..c-1).
"""
from __future__ import annotations

import json
from pathlib import Path

FORMAT, VERSION, FILE_NAME = "deepinfer.engram_classes", 1, "engram_classes.json"


def write(path: Path, classes: list[int], source: str, tokenizer_sha256: str | None) -> None:
    num = max(classes) + 1 if classes else 0
    doc = {"format": FORMAT, "version": VERSION, "source": source, "tokenizer_sha256": tokenizer_sha256,
           "num_ids": len(classes), "num_classes": num, "classes": classes}
    Path(path).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def synthetic(vocab: int, num_classes: int) -> list[int]:
    return [t % num_classes for t in range(vocab)]
