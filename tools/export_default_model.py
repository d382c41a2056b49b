#!/usr/bin/env python3
"""Ship a trained default model (issue #21): release layout, held-out evaluation, golden logits.

    tools/export_default_model.py --ckpt RUN_DIR --corpus .corpus [--out assets/default-model]
                                  [--golden tests/data/golden/default_model] [--eval-windows 24]

- Writes the DeepSeek release layout (tools/golden_lib/official.py): BF16 embed/head/norms/
  compressors, FP8 e4m3 128x128 (e8m0 scales) dense linears, FP4 e2m1 routed experts, F32 mHC,
  main model in shard 1, mtp.0.* in shard 2, index, config.json in release field names, and the
  tokenizer (CORPUS/tokenizer/).
- Evaluates on held-out windows with transformers fp32 on CPU: perplexity of the bf16 weights,
  FP8 dense only, FP4 experts only, and both (= what ships), a unigram baseline on the same
  tokens, MTP draft agreement. Writes OUT/eval.json.
- Golden logits of the shipped weights (transformers fp32, one full forward) for two held-out
  sequences, stored compactly (256 fixed columns + logsumexp + argmax per row), with
  transformers' own chunked / prefill+decode self-consistency measured.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from default_model_lib import ckpt, evaluate, spec  # noqa: E402
from golden_lib import build_official, checks, hfmodel, mtp, official  # noqa: E402
from transformers import DeepseekV4ForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def load(run: Path):
    parts, meta = ckpt.load_sharded(run, "ckpt")
    cfg = spec.make_config(meta["spec"])
    model = DeepseekV4ForCausalLM(cfg).eval()
    model.load_state_dict(parts["model"], strict=True)
    head = mtp.MtpRef(cfg).eval()
    head.load_state_dict(parts["mtp"], strict=True)
    return cfg, model, head, meta


def variants(sd: dict, deq: dict) -> dict:
    """State dicts for each format mix: bf16, FP8 dense only, FP4 experts only, shipped."""
    is_exp = lambda k: k.endswith(EXPERTS)  # noqa: E731
    return {"bf16": sd,
            "fp8_dense": {k: (sd[k] if is_exp(k) else deq[k]) for k in sd},
            "fp4_experts": {k: (deq[k] if is_exp(k) else sd[k]) for k in sd},
            "shipped": deq}


def golden_inputs(held: np.ndarray) -> dict:
    """Two held-out sequences starting at document starts (bos = 0): long (300) and short (40)."""
    starts = np.flatnonzero(held == 0)
    long_start = next(s for s in starts if s + 300 <= len(held))
    short_start = next(s for s in starts if s > long_start + 300 and s + 40 <= len(held))
    return {"long": held[long_start:long_start + 300].astype(int).tolist(),
            "short": held[short_start:short_start + 40].astype(int).tolist()}


def write_golden(model, inputs: dict, out: Path, vocab: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cols = np.sort(np.random.default_rng(21).choice(vocab, 256, replace=False))
    arrays, report = {"cols": cols}, {}
    for name, ids in inputs.items():
        mon = checks.TieMonitor(model)
        logits = hfmodel.full_logits(model, ids).astype(np.float64)
        gaps = mon.close()
        diffs = checks.consistency(model, ids, logits.astype(np.float32))
        m = logits.max(-1, keepdims=True)
        arrays[f"{name}_ids"] = np.array(ids, dtype=np.int64)
        arrays[f"{name}_logits"] = logits[:, cols].astype(np.float32)
        arrays[f"{name}_lse"] = (m[:, 0] + np.log(np.exp(logits - m).sum(-1))).astype(np.float32)
        arrays[f"{name}_argmax"] = logits.argmax(-1).astype(np.int64)
        top2 = np.sort(logits, -1)[:, -2:]
        report[name] = {"T": len(ids), "logit_absmax": float(np.abs(logits).max()), **diffs, **gaps,
                        "min_top1_gap": float((top2[:, 1] - top2[:, 0]).min())}
        print(f"  golden {name}: " + json.dumps(report[name]), flush=True)
    np.savez(out / "reference.npz", **arrays)
    (out / "meta.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="folder with ckpt-*.pt from tools/train_default_model.py")
    ap.add_argument("--corpus", default=str(ROOT / ".corpus"))
    ap.add_argument("--out", default=str(ROOT / "assets/default-model"))
    ap.add_argument("--golden", default=str(ROOT / "tests/data/golden/default_model"))
    ap.add_argument("--eval-windows", type=int, default=24)
    ap.add_argument("--eval-seq", type=int, default=spec.CONTEXT)
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()
    run, out, corpus = Path(args.ckpt), Path(args.out), Path(args.corpus)
    cfg, model, head, meta = load(run)
    sd = {k: v.clone() for k, v in model.state_dict().items()}   # load_state_dict below writes in place
    main_t, deq = official.encode_main(sd, cfg.num_hidden_layers)
    mtp_t, mdeq = official.encode_mtp(head.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    build_official.write_checkpoint(out, main_t, mtp_t, official.official_config(cfg, 1))
    build_official.check_roundtrip(out, main_t, mtp_t, deq, mdeq)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(corpus / "tokenizer" / f, out / f)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out}: {len(main_t)} main + {len(mtp_t)} MTP tensors, {size / 1e6:.2f} MB", flush=True)

    held = np.fromfile(corpus / "heldout.u16", dtype=np.uint16)
    train = np.fromfile(corpus / "train.u16", dtype=np.uint16)
    wins = evaluate.windows(held, args.eval_seq, args.eval_windows)
    report = {"train_meta": {k: v for k, v in meta.items() if k != "spec"}, "folder_bytes": size,
              "unigram": evaluate.unigram(train, wins, cfg.vocab_size), "formats": {}}
    shipped_head = mtp.MtpRef(cfg).eval()
    shipped_head.load_state_dict(mdeq, strict=True)
    for name, state in variants(sd, deq).items():
        model.load_state_dict(state, strict=True)
        h = head if name == "bf16" else shipped_head if name == "shipped" else None
        report["formats"][name] = evaluate.perplexity(model, wins, h)
        print(f"  {name:12s} " + json.dumps(report["formats"][name]), flush=True)
    print(f"  unigram      {json.dumps(report['unigram'])}", flush=True)
    model.load_state_dict(deq, strict=True)       # goldens are of what ships
    report["golden"] = write_golden(model, golden_inputs(held), Path(args.golden), cfg.vocab_size)
    report["seconds"] = round(time.time() - t0, 1)
    (out / "eval.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"done in {report['seconds']} s")


if __name__ == "__main__":
    main()
