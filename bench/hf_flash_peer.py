#!/usr/bin/env python3
"""transformers' DeepseekV4ForCausalLM as the peer of `deepinfer bench-flash`, on the same GPU.

Builds the model from a `deepinfer make-flash-stack` folder's config.json (same widths, layers and
schedule; bf16 weights, eager attention, random values: timing does not depend on them, except the
routing, which is spread over the experts as in the engine's random stack) and times:
  * prefill: one prompt of CTX tokens in one forward (TTFT);
  * decode at (CTX, B): B prompts of CTX tokens prefilled in chunks through one DynamicCache, then
    --steps single-token steps (median step time).
Each grid point that does not fit the GPU is recorded as out of memory, not skipped silently.
Writes JSON lines with the keys of bench-flash --json (what, batch, ctx, ms, tokens_per_s) plus
"engine": "transformers", for bench/sweep_report.py.

  python3 bench/hf_flash_peer.py --model STACK --grid "4096:1,8;1024:32" --json OUT.jsonl
Needs torch and transformers (>= 5.17, with deepseek_v4); on a machine without a GPU --device cpu
runs the same code (use a --small stack and short contexts).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

# Keys of the release config.json that transformers' DeepseekV4Config does not take (or takes
# under another name).
_DROP = {"architectures", "quantization_config", "expert_dtype", "torch_dtype", "topk_method", "model_type",
         "rope_scaling", "dtype", "transformers_version"}


def parse_grid(spec: str) -> list[tuple[int, list[int]]]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        ctx, _, bs = item.partition(":")
        out.append((int(ctx), [int(b) for b in bs.split(",") if b] if bs else []))
    return out


def build_model(stack: str, device: str):
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    raw = json.load(open(f"{stack}/config.json"))
    kwargs = {k: v for k, v in raw.items() if k not in _DROP}
    rope = dict(raw.get("rope_scaling") or {})
    if "type" in rope:
        rope["rope_type"] = rope.pop("type")
    if rope:
        kwargs["rope_parameters"] = rope
    kwargs["num_nextn_predict_layers"] = 0
    cfg = DeepseekV4Config(**kwargs)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = DeepseekV4ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    gen = torch.Generator(device=device).manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dtype.is_floating_point:
                if "norm" in name:
                    p.fill_(1.0)
                elif leaf in ("sinks", "e_score_correction_bias", "position_bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02, generator=gen)
        # Hash-routed layers: spread tokens over the experts as the engine's random stack does.
        for name, b in model.named_buffers():
            if "tid2eid" in name and not b.dtype.is_floating_point:
                b.copy_(torch.randint(0, cfg.n_routed_experts, b.shape, generator=gen, device=device).to(b.dtype))
    return model, cfg


def sync(device: str):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def is_oom(e: BaseException) -> bool:
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def free(device: str):
    import gc
    import torch
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="make-flash-stack folder (its config.json)")
    ap.add_argument("--grid", default="4096:1,8;1024:32", help='"CTX:B,B;CTX:B" decode points (prefill at each CTX)')
    ap.add_argument("--steps", type=int, default=8, help="timed decode steps per point")
    ap.add_argument("--warmup", type=int, default=2, help="decode steps before timing")
    ap.add_argument("--chunk", type=int, default=1024, help="prefill chunk for the decode contexts")
    ap.add_argument("--no-prefill", action="store_true", help="skip the prefill timings")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", help="append results here as JSON lines")
    ap.add_argument("--time-limit", type=float, default=0, help="stop starting new points after this many seconds")
    args = ap.parse_args()
    try:
        grid = parse_grid(args.grid)
    except ValueError:
        ap.error(f'--grid {args.grid!r}: expected "CTX:B,B;CTX:B" with whole numbers')
    if not grid or any(c < 1 or any(b < 1 for b in bs) for c, bs in grid):
        ap.error(f"--grid {args.grid!r}: contexts and batches must be >= 1")
    for name in ("steps", "chunk"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {args.warmup}")

    import torch
    import transformers
    from transformers import DynamicCache

    t_start = time.time()
    model, cfg = build_model(args.model, args.device)
    load_s = time.time() - t_start
    L = cfg.num_hidden_layers
    print(f"hf_flash_peer: transformers {transformers.__version__}, torch {torch.__version__}, {L} layers "
          f"{cfg.layer_types}, hidden {cfg.hidden_size}, built in {load_s:.1f} s on {args.device}", flush=True)
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(7)

    def ids(b: int, n: int):
        return torch.randint(2, cfg.vocab_size, (b, n), generator=gen).to(args.device)

    def record(row):
        row.update(engine="transformers", layers=L)
        rows.append(row)
        print("hf_flash_peer:", json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    def out_of_time() -> bool:
        return args.time_limit > 0 and time.time() - t_start > args.time_limit

    with torch.no_grad():
        for ctx, batches in grid:
            if not args.no_prefill and not out_of_time():
                try:
                    x = ids(1, ctx)
                    model(input_ids=x[:, : min(ctx, 256)], use_cache=True)  # warm-up
                    times = []
                    for _ in range(2):
                        cache = DynamicCache(config=cfg)
                        sync(args.device)
                        t0 = time.perf_counter()
                        model(input_ids=x, past_key_values=cache, use_cache=True)
                        sync(args.device)
                        times.append(time.perf_counter() - t0)
                        del cache
                    ms = min(times) * 1e3
                    record(dict(what="prefill", batch=1, ctx=ctx, prompt_len=ctx, ms=ms, tokens_per_s=ctx / ms * 1e3,
                                per_layer_ms=ms / L))
                except Exception as e:  # noqa: BLE001 - every failure is recorded with its reason
                    record(dict(what="prefill", batch=1, ctx=ctx, prompt_len=ctx, error="out of memory" if is_oom(e) else repr(e)[:200]))
                free(args.device)
            for b in batches:
                if out_of_time():
                    record(dict(what="decode", batch=b, ctx=ctx, prompt_len=ctx, error="skipped: --time-limit reached"))
                    continue
                try:
                    cache = DynamicCache(config=cfg)
                    x = ids(b, ctx)
                    for s in range(0, ctx, args.chunk):
                        out = model(input_ids=x[:, s:s + args.chunk], past_key_values=cache, use_cache=True)
                    nxt = out.logits[:, -1:].argmax(-1)
                    del out
                    times = []
                    for i in range(args.warmup + args.steps):
                        sync(args.device)
                        t0 = time.perf_counter()
                        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                        nxt = out.logits[:, -1:].argmax(-1)
                        sync(args.device)
                        if i >= args.warmup:
                            times.append(time.perf_counter() - t0)
                        del out
                    ms = statistics.median(times) * 1e3
                    record(dict(what="decode", batch=b, ctx=ctx + args.warmup + args.steps // 2, prompt_len=ctx, ms=ms,
                                tokens_per_s=b / ms * 1e3, per_layer_ms=ms / L))
                except Exception as e:  # noqa: BLE001
                    record(dict(what="decode", batch=b, ctx=ctx, prompt_len=ctx, error="out of memory" if is_oom(e) else repr(e)[:200]))
                finally:
                    cache = None
                    free(args.device)
    print(f"hf_flash_peer: {len(rows)} points in {time.time() - t_start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
