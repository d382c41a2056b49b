#!/usr/bin/env python3
"""CSV and plots from `deepinfer bench-flash --json` and `bench/hf_flash_peer.py --json` lines.

  python3 bench/sweep_report.py --out DIR engine.jsonl [peer.jsonl ...]
writes DIR/sweep.csv (one row per measured point: engine, what, ctx, batch, ms, tokens/s, floor ms,
share of the floor, shared context, error) and, when matplotlib is importable, DIR/decode_tps.png
(decode tokens/s against batch size per context, both engines), DIR/decode_floor.png (share of the
floor reached against batch size) and DIR/prefill_ttft.png (TTFT against prompt length). Prints
the table as markdown, with the engine / transformers ratio where both measured the same point.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys

FIELDS = ["engine", "what", "prompt_len", "ctx", "batch", "ms", "tokens_per_s", "floor_ms", "share_of_floor", "per_layer_ms",
          "layers", "shared_context", "error"]


def load(paths: list[str]) -> list[dict]:
    rows = []
    for p in paths:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"sweep_report: {p}:{n}: not JSON ({e})")
                if r.get("what") not in ("prefill", "decode"):
                    continue  # per-op breakdown lines
                r.setdefault("engine", "deepinfer")
                ms, fl = r.get("ms"), r.get("floor_ms")
                if ms and fl:
                    r["share_of_floor"] = fl / ms
                if ms and "tokens_per_s" not in r:
                    r["tokens_per_s"] = (r["ctx"] if r["what"] == "prefill" else r["batch"]) / ms * 1e3
                rows.append(r)
    return rows


def nominal_ctx(r: dict) -> int:
    """The prompt length of a point (decode rows' "ctx" is the mean context of the timed steps)."""
    return int(r.get("prompt_len", r["ctx"]))


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in FIELDS})


def markdown(rows: list[dict]) -> str:
    peer = {(r["what"], nominal_ctx(r), r["batch"]): r for r in rows if r["engine"] != "deepinfer" and r.get("ms")}
    out = ["| what | ctx | batch | deepinfer ms | tokens/s | floor ms | share of floor | transformers ms | speed-up |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["engine"] != "deepinfer":
            continue
        p = peer.get((r["what"], nominal_ctx(r), r["batch"]))
        tag = " (shared ctx)" if r.get("shared_context") else ""
        out.append(f"| {r['what']}{tag} | {nominal_ctx(r)} | {r['batch']} | {r['ms']:.2f} | {r['tokens_per_s']:.0f} | "
                   f"{r.get('floor_ms', 0):.3f} | {100 * r.get('share_of_floor', 0):.0f}% | "
                   f"{p['ms']:.1f} | {p['ms'] / r['ms']:.1f}x |" if p else
                   f"| {r['what']}{tag} | {nominal_ctx(r)} | {r['batch']} | {r['ms']:.2f} | {r['tokens_per_s']:.0f} | "
                   f"{r.get('floor_ms', 0):.3f} | {100 * r.get('share_of_floor', 0):.0f}% | - | - |")
    for r in rows:
        if r["engine"] != "deepinfer" and r.get("error"):
            out.append(f"| {r['what']} ({r['engine']}) | {r['ctx']} | {r['batch']} | - | - | - | - | {r['error']} | - |")
    return "\n".join(out)


def plots(rows: list[dict], out: str) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []

    def save(fig, ax, name):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=120)
        plt.close(fig)
        made.append(name)

    def tag(shared):
        return " (shared context)" if shared else ""

    dec = [r for r in rows if r["what"] == "decode" and r.get("ms")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for eng in sorted({r["engine"] for r in dec}):
        for ctx in sorted({nominal_ctx(r) for r in dec if r["engine"] == eng}):
            for shared in (False, True):
                pts = sorted((r["batch"], r["tokens_per_s"]) for r in dec if r["engine"] == eng and
                             nominal_ctx(r) == ctx and bool(r.get("shared_context")) == shared)
                if pts:
                    ax.plot(*zip(*pts), marker="o", linestyle="--" if eng != "deepinfer" else ":" if shared else "-",
                            label=f"{eng}, ctx {ctx}{tag(shared)}")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="decode tokens/s", title="Decode throughput")
    save(fig, ax, "decode_tps.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ctx in sorted({nominal_ctx(r) for r in dec if r["engine"] == "deepinfer"}):
        for shared in (False, True):
            pts = sorted((r["batch"], 100 * r["share_of_floor"]) for r in dec if r["engine"] == "deepinfer" and
                         nominal_ctx(r) == ctx and bool(r.get("shared_context")) == shared and "share_of_floor" in r)
            if pts:
                ax.plot(*zip(*pts), marker="o", linestyle=":" if shared else "-", label=f"ctx {ctx}{tag(shared)}")
    ax.set(xscale="log", xlabel="batch size", ylabel="% of the floor (floor / step time)",
           title="Decode step against its floor (4.3 TB/s, 790 TFLOP/s)")
    ax.set_ylim(0, 100)
    save(fig, ax, "decode_floor.png")

    pre = [r for r in rows if r["what"] == "prefill" and r.get("ms")]
    if pre:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for eng in sorted({r["engine"] for r in pre}):
            pts = sorted((r["ctx"], r["ms"]) for r in pre if r["engine"] == eng)
            ax.plot(*zip(*pts), marker="o", label=eng)
        fl = sorted((r["ctx"], r["floor_ms"]) for r in pre if r["engine"] == "deepinfer" and r.get("floor_ms"))
        if fl:
            ax.plot(*zip(*fl), linestyle=":", color="gray", label="floor")
        ax.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="TTFT ms", title="Prefill (one prompt)")
        save(fig, ax, "prefill_ttft.png")
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for sweep.csv and the plots")
    ap.add_argument("jsonl", nargs="+")
    args = ap.parse_args()
    rows = load(args.jsonl)
    if not rows:
        sys.exit("sweep_report: no prefill/decode rows in " + ", ".join(args.jsonl))
    os.makedirs(args.out, exist_ok=True)
    write_csv(rows, os.path.join(args.out, "sweep.csv"))
    print(markdown(rows))
    made = plots(rows, args.out)
    print(f"\nsweep_report: {len(rows)} points -> {args.out}/sweep.csv" +
          (f", {', '.join(made)}" if made else " (no plots: matplotlib is not installed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
