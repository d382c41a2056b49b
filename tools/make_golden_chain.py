#!/usr/bin/env python3
"""Greedy argmax chains of the golden checkpoints, for engine end-to-end greedy tests.

    python3 tools/make_golden_chain.py [--golden tests/data/golden] [--only tiny,tiny_clamp] [--rev HEAD]

For each fixture, loads its checkpoint with transformers (fp32, eager attention; the same
loader as tools/make_golden.py) and, for a few prompts taken from the fixture's inputs.json,
decodes NUM_NEW tokens greedily by FULL RECOMPUTATION: step k runs one no-cache forward over
prompt + the k tokens so far and appends the argmax of the last row (lowest id on an exact
tie, like the engine). Nothing is cached, so the chain is the plain argmax chain of the
one-shot forward, the same procedure that produced logits_<seq>.npy.

Writes <fixture>/greedy_chain.json:
  checkpoint_sha256   of model.safetensors + config.json the chain was made from (tests skip
                      with a clear message when the checkpoint has changed since)
  prompts[]           {name, prompt_ids, generated_ids [NUM_NEW], margins [NUM_NEW] (top-1 minus
                      top-2 logit at each step), near_tie_steps (margin < NEAR_TIE),
                      exact_prefix (steps before the first near tie: what a test may compare),
                      min_indexer_topk_gap / min_router_topk_gap over the final sequence}
                      Only candidate prompts with no near tie (margin < NEAR_TIE, or an internal
                      top-k gap < MIN_TOPK_GAP) are kept; `rejected` lists the others.
With --rev, the checkpoint files are read from that git revision (for a working tree where
someone is rebuilding the fixtures) while the chain is still written into the working tree.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_lib import checks, hfmodel  # noqa: E402

NUM_NEW = 80
NUM_PROMPTS = 3
NEAR_TIE = 1e-3  # top-2 logit margin below which an fp32 engine may legitimately pick the other token
MIN_TOPK_GAP = 1e-4  # indexer / router top-k gaps inside the model below this also disqualify a prompt
# Candidates in order of preference, (name in inputs.json, start, length or None = to the end);
# the first NUM_PROMPTS (at least MIN_PROMPTS) without any near tie (output or internal top-k) are kept. The first
# starts below the sliding window (16) and the CSA top-k threshold (8 blocks of 4), so decoding
# crosses both.
CANDIDATES = [("long", 0, 17), ("short", 0, None), ("medium", 0, None), ("long", 100, 23), ("long", 200, 60),
              ("medium", 50, 11), ("long", 30, 45), ("medium", 20, 70), ("short", 5, 30)]
MIN_PROMPTS = 2
CHECKPOINT_FILES = ("config.json", "model.safetensors")


def checkpoint_sha256(d: Path) -> str:
    h = hashlib.sha256()
    for f in CHECKPOINT_FILES:
        h.update((d / f).read_bytes())
    return h.hexdigest()


def export_rev(repo: Path, rel: Path, rev: str, dest: Path) -> None:
    """Copies the fixture's checkpoint files (and inputs.json) at git revision `rev` into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in CHECKPOINT_FILES + ("inputs.json",):
        blob = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{(rel / f).as_posix()}"], check=True,
                              capture_output=True).stdout
        (dest / f).write_bytes(blob)


@torch.no_grad()
def greedy_chain(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    toks, margins = list(prompt), []
    for _ in range(n):
        last = torch.from_numpy(hfmodel.full_logits(model, toks)[-1])
        top = torch.topk(last, 2)  # ties: torch.topk order is unspecified, so pick the lowest id below
        best = int(torch.nonzero(last == top.values[0])[0])
        margins.append(float(top.values[0] - top.values[1]))
        toks.append(best)
    return toks[len(prompt):], margins


def build(src: Path, out: Path) -> dict:
    model = hfmodel.load_fp32(src)
    inputs = json.loads((src / "inputs.json").read_text())
    result = {"checkpoint_sha256": checkpoint_sha256(src), "num_new": NUM_NEW, "near_tie": NEAR_TIE,
              "procedure": "transformers fp32 eager, full no-cache forward per step, argmax (lowest id on ties)",
              "prompts": []}
    rejected = []
    for name, start, n in CANDIDATES:
        if len(result["prompts"]) == NUM_PROMPTS:
            break
        prompt = inputs[name][start:start + n if n else None]
        t0 = time.time()
        gen, margins = greedy_chain(model, prompt, NUM_NEW)
        mon = checks.TieMonitor(model)
        hfmodel.full_logits(model, prompt + gen)
        gaps = mon.close()
        ties = [i for i, m in enumerate(margins) if m < NEAR_TIE]
        entry = {"name": f"{name}[{start}:{start + len(prompt)}]", "prompt_ids": prompt, "generated_ids": gen,
                 "margins": [round(m, 7) for m in margins], "near_tie_steps": ties,
                 "exact_prefix": ties[0] if ties else NUM_NEW,
                 "min_margin": min(margins),
                 "min_indexer_topk_gap": gaps["min_indexer_topk_gap"],
                 "min_router_topk_gap": gaps["min_router_topk_gap"]}
        internal = min(g for g in (gaps["min_indexer_topk_gap"], gaps["min_router_topk_gap"]) if g == g)
        ok = not ties and internal >= MIN_TOPK_GAP
        (result["prompts"] if ok else rejected).append(entry)
        print(f"  {entry['name']:14s} min margin {min(margins):.2e}  near ties {ties}  "
              f"indexer gap {gaps['min_indexer_topk_gap']:.2e}  router gap {gaps['min_router_topk_gap']:.2e}  "
              f"{'kept' if ok else 'REJECTED'} ({time.time() - t0:.1f} s)", flush=True)
    if len(result["prompts"]) < MIN_PROMPTS:
        raise RuntimeError(f"{src}: only {len(result['prompts'])} candidate prompts are free of near ties")
    result["rejected"] = [{k: e[k] for k in ("name", "near_tie_steps", "min_margin", "min_indexer_topk_gap",
                                              "min_router_topk_gap")} for e in rejected]
    (out / "greedy_chain.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", type=Path, default=Path("tests/data/golden"))
    ap.add_argument("--only", default="tiny,tiny_clamp")
    ap.add_argument("--rev", default=None, help="read the checkpoints from this git revision (e.g. HEAD)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    repo = Path(__file__).resolve().parent.parent
    for fixture in args.only.split(","):
        out = args.golden / fixture
        print(f"[{fixture}]" + (f" checkpoint from git {args.rev}" if args.rev else ""))
        if args.rev:
            with tempfile.TemporaryDirectory() as tmp:
                rel = out.resolve().relative_to(repo)
                export_rev(repo, rel, args.rev, Path(tmp))
                build(Path(tmp), out)
        else:
            build(out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
