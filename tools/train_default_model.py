#!/usr/bin/env python3
"""Train deepinfer's bundled default model: a small DeepSeek-V4 with its MTP block (issue #21).

    tools/train_default_model.py --data DIR --out DIR [--time-budget 420] [--device cuda]

DIR holds train.u16 / heldout.u16 from tools/corpus/train_tokenizer.py (uint16 ids, documents as
bos + text + eos). The trunk is transformers' DeepseekV4ForCausalLM (architecture in
tools/default_model_lib/spec.py); the MTP block and its loss are tools/default_model_lib/mtp_head.py.
Loss = CE(next token) + mtp_weight * CE(MTP draft of token t+2) + indexer_weight * KL(indexer || attention).
bf16 autocast, AdamW, linear warm-up then cosine decay over the wall-clock budget (the run stops
at --time-budget seconds and always writes a checkpoint), hash tables fixed at init, router
biases balanced without an auxiliary loss. Writes OUT/ckpt-*.pt (<= 12 MB each) and OUT/train_log.json.

The shipped model (assets/default-model, card in its README.md) was trained on one H200 with
    tools/train_default_model.py --data DIR --out OUT --time-budget 330 --batch 64 --seq 1024 \
        --save-every 100 --eval-tokens 60000
(all other options at their defaults, seed 0): 906 steps, 59.4M tokens, ~180K tokens/s, then
exported with tools/export_default_model.py.
"""
from __future__ import annotations

import argparse
import json
import lzma
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from default_model_lib import ckpt, spec, train_patches  # noqa: E402
from default_model_lib.mtp_head import MtpHead  # noqa: E402
from transformers import DeepseekV4ForCausalLM  # noqa: E402


def build(seed: int, device):
    torch.manual_seed(seed)
    cfg = spec.make_config()
    model = DeepseekV4ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    mtp = MtpHead(cfg)
    mtp.init_weights(cfg.initializer_range, gen)
    with torch.no_grad():   # hash routing: 2 distinct experts per token id, fixed for good
        for layer in model.model.layers:
            g = layer.mlp.gate
            if hasattr(g, "tid2eid"):
                rows = [torch.randperm(cfg.n_routed_experts, generator=gen)[: g.top_k] for _ in range(cfg.vocab_size)]
                g.tid2eid.copy_(torch.stack(rows))
    return cfg, model.to(device), mtp.to(device)


def forward_losses(model, mtp, batch, distill):
    """batch [B, T+1] ids -> (main CE, MTP CE, indexer KL). Main predicts t+1 from 0..t; MTP at t
    (t <= T-2) predicts t+2 from the main streams at t and the true token t+1."""
    x = batch[:, :-1]
    got = {}
    h = model.model.hc_head.register_forward_hook(lambda mod, a, o: got.__setitem__("s", a[0]))
    try:
        hidden = model.model(input_ids=x, use_cache=False).last_hidden_state
    finally:
        h.remove()
    logits = model.lm_head(hidden)
    main = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    draft = mtp.hidden(model, got["s"][:, :-1], batch[:, 1:-1])
    mtp_logits = model.lm_head(draft)
    mtp_ce = F.cross_entropy(mtp_logits.float().flatten(0, 1), batch[:, 2:].flatten())
    kl = distill.loss() if distill is not None else torch.zeros((), device=batch.device)
    return main, mtp_ce, kl


def lr_at(frac: float, step: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def sample(data: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - seq - 2, (batch,), generator=gen, device="cpu").to(data.device)
    idx = starts.view(-1, 1) + torch.arange(seq + 1, device=data.device).view(1, -1)
    return data[idx].long()


@torch.no_grad()
def evaluate(model, mtp, data: torch.Tensor, seq: int, max_tokens: int, amp_dtype) -> dict:
    """Held-out main CE, MTP CE and MTP acceptance (draft argmax == main argmax at t+1) over
    consecutive windows."""
    model.eval()
    mtp.eval()
    n_win = max(1, min(max_tokens, data.numel() - 2) // (seq + 1))
    tot = {"main": 0.0, "mtp": 0.0, "agree": 0.0, "n_main": 0, "n_mtp": 0}
    for w in range(n_win):
        b = data[w * (seq + 1): (w + 1) * (seq + 1)].long().view(1, -1)
        with torch.autocast(b.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            got = {}
            h = model.model.hc_head.register_forward_hook(lambda mod, a, o: got.__setitem__("s", a[0]))
            hidden = model.model(input_ids=b[:, :-1], use_cache=False).last_hidden_state
            h.remove()
            logits = model.lm_head(hidden).float()
            dl = model.lm_head(mtp.hidden(model, got["s"][:, :-1], b[:, 1:-1])).float()
        tot["main"] += float(F.cross_entropy(logits[0], b[0, 1:], reduction="sum"))
        tot["mtp"] += float(F.cross_entropy(dl[0], b[0, 2:], reduction="sum"))
        tot["agree"] += float((dl[0].argmax(-1) == logits[0, 1:].argmax(-1)).sum())
        tot["n_main"] += logits.shape[1]
        tot["n_mtp"] += dl.shape[1]
    model.train()
    mtp.train()
    return {"heldout_ce": tot["main"] / tot["n_main"], "heldout_ppl": math.exp(tot["main"] / tot["n_main"]),
            "mtp_ce": tot["mtp"] / tot["n_mtp"], "mtp_agreement": tot["agree"] / tot["n_mtp"],
            "tokens": tot["n_main"]}


def load_ids(path: Path) -> np.ndarray:
    """uint16 ids from PATH, or from PATH.xz (how the ids travel to the GPU machine)."""
    if path.exists():
        return np.fromfile(path, dtype=np.uint16)
    return np.frombuffer(lzma.decompress(Path(str(path) + ".xz").read_bytes()), dtype=np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--time-budget", type=float, default=420.0, help="seconds of training before the final save")
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=spec.CONTEXT)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--indexer-weight", type=float, default=0.1)
    ap.add_argument("--router-bias-rate", type=float, default=1e-3)
    ap.add_argument("--save-every", type=float, default=120.0, help="seconds between checkpoints")
    ap.add_argument("--eval-tokens", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-amp", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp = None if args.no_amp else torch.bfloat16
    data_dir, out = Path(args.data), Path(args.out)
    train = torch.from_numpy(load_ids(data_dir / "train.u16").astype(np.int32)).to(dev)
    held = torch.from_numpy(load_ids(data_dir / "heldout.u16").astype(np.int32)).to(dev)
    cfg, model, mtp = build(args.seed, dev)
    train_patches.use_dense_experts()
    distill = train_patches.IndexerDistill(model) if args.indexer_weight > 0 else None
    balance = train_patches.RouterBalance([model, mtp], rate=args.router_bias_rate)
    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            eps=1e-8, fused=dev.type == "cuda")
    n_params = sum(p.numel() for p in params)
    print(f"params {n_params / 1e6:.2f}M  train tokens {train.numel()}  held-out {held.numel()}  device {dev}",
          flush=True)
    gen = torch.Generator().manual_seed(args.seed + 2)
    log = {"args": vars(args), "params": n_params, "steps": []}
    meta = {"spec": spec.DEFAULT_SPEC, "context": args.seq}
    step, tokens, t_train, last_save, last_print = 0, 0, time.time(), time.time(), time.time()
    while step < args.max_steps and time.time() - t_train < args.time_budget:
        frac = (time.time() - t_train) / args.time_budget
        lr = lr_at(frac, step, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = sample(train, args.batch, args.seq, gen)
        opt.zero_grad(set_to_none=True)
        try:
            with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                main, mtp_ce, kl = forward_losses(model, mtp, batch, distill)
                loss = main + args.mtp_weight * mtp_ce + args.indexer_weight * kl
            loss.backward()
        except torch.cuda.OutOfMemoryError:
            if step > 0 or args.batch == 1:
                raise
            # Only the first step may shrink the batch: the budget allows no second attempt.
            args.batch //= 2
            print(f"out of memory: batch -> {args.batch}", flush=True)
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            continue
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        load = balance.step()
        step += 1
        tokens += batch.numel() - batch.shape[0]
        if time.time() - last_print > 10 or step <= 3:
            if step == 1 and dev.type == "cuda":
                print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
            el = time.time() - t_train
            rec = {"step": step, "t": round(el, 1), "lr": lr, "loss": float(main.detach()),
                   "mtp": float(mtp_ce.detach()), "kl": float(kl.detach()), "gnorm": float(gnorm),
                   "load": round(load, 2), "tok_s": round(tokens / el)}
            log["steps"].append(rec)
            print(json.dumps(rec), flush=True)
            last_print = time.time()
        if time.time() - last_save > args.save_every:
            ckpt.save_sharded({"model": model.state_dict(), "mtp": mtp.state_dict()}, out, "ckpt",
                              dict(meta, step=step))
            last_save = time.time()
    ckpt.save_sharded({"model": model.state_dict(), "mtp": mtp.state_dict()}, out, "ckpt", dict(meta, step=step))
    if distill is not None:
        distill.enabled = False
    log["final"] = evaluate(model, mtp, held, args.seq, args.eval_tokens, amp)
    log["final"].update(steps=step, train_tokens=tokens, train_seconds=round(time.time() - t_train, 1),
                        total_seconds=round(time.time() - t_start, 1))
    print(json.dumps(log["final"]), flush=True)
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    main()
