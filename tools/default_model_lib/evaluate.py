"""Held-out evaluation of the default model with transformers on CPU (fp32): perplexity per weight
format, a unigram baseline on the same tokens, and MTP draft agreement."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from golden_lib import mtp as mtp_ref


def windows(held: np.ndarray, seq: int, n: int) -> list[np.ndarray]:
    """n non-overlapping windows of seq+1 ids spread evenly over the held-out ids (which are in
    corpus-source order, so consecutive windows would all come from the first sources)."""
    slots = (len(held) - 1) // (seq + 1)
    n = min(n, slots)
    picks = np.linspace(0, slots - 1, n).round().astype(int)
    return [held[i * (seq + 1): (i + 1) * (seq + 1)].astype(np.int64) for i in picks]


@torch.no_grad()
def perplexity(model, wins: list[np.ndarray], head=None) -> dict:
    """Main CE/ppl over every position of each window; with `head` (an MtpRef) also the MTP draft
    CE and its agreement with the main model's greedy next-next token (teacher forced: the draft
    at t sees the true token t+1 and is compared with argmax of the main logits at t+1)."""
    ce = n = mce = mn = agree = 0.0
    for w in wins:
        ids = torch.from_numpy(w).view(1, -1)
        streams, logits = mtp_ref.main_streams_and_logits(model, ids[0, :-1].tolist())
        ce += float(F.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        n += logits.shape[0]
        if head is not None:
            dl = head(model, streams[:, :-1], ids[:, 1:-1])
            mce += float(F.cross_entropy(dl, ids[0, 2:], reduction="sum"))
            agree += float((dl.argmax(-1) == logits[1:].argmax(-1)).sum())
            mn += dl.shape[0]
    out = {"tokens": int(n), "ce": ce / n, "ppl": math.exp(ce / n)}
    if head is not None:
        out.update(mtp_ce=mce / mn, mtp_ppl=math.exp(mce / mn), mtp_agreement=agree / mn)
    return out


def unigram(train: np.ndarray, wins: list[np.ndarray], vocab: int) -> dict:
    """Add-one smoothed unigram model from the training ids, scored on the same positions."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    tgt = np.concatenate([w[1:] for w in wins])
    ce = float(-logp[tgt].mean())
    return {"tokens": int(len(tgt)), "ce": ce, "ppl": math.exp(ce)}
