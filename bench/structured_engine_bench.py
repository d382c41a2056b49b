#!/usr/bin/env python3
"""Structured outputs through the engine (benchmark, not a test): `deepinfer bench-structured`
on N MaskBench-dev schemas of one split (every len/N-th schema deepinfer compiles), one request
each, generated together on the bundled default model (CPU), with the mask precompute off and on.

Prints bench-structured's JSON line per run (per-step mask wait: the time each step waits for
its grammar masks; add_request time; totals) and a summary table of the best run per setting.

  DEEPINFER_SHARED_DIR=/work/shared python3 bench/structured_engine_bench.py --cli build/deepinfer \\
      --split Glaiveai2K --n 16 --precompute-ms 0,50 --repeat 3
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structured_bench import load_cases  # noqa: E402  (maskbench-dev, DEEPINFER_SHARED_DIR)


def compiling_schemas(cli, split, n):
    """Every k-th schema of the split that deepinfer compiles (so-check on an empty input)."""
    cases = load_cases(0, split)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for _, schema, _ in cases:
            f.write(json.dumps({"input": "", "so_args": {"json_schema": schema}}) + "\n")
    out = subprocess.run([cli, "so-check", "--tokenizer", "bytes", "--inputs", f.name],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    ok = [json.dumps(c[1], separators=(",", ":")) for c, line in zip(cases, out) if "error" not in json.loads(line)]
    if len(ok) < n:
        sys.exit(f"only {len(ok)} schemas of {split} compile, {n} asked")
    step = len(ok) / n
    return [ok[int(i * step)] for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/deepinfer")
    ap.add_argument("--split", default="Glaiveai2K")
    ap.add_argument("--n", type=int, default=16, help="requests (schemas)")
    ap.add_argument("--precompute-ms", default="0,50")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--extra", default="", help="more bench-structured flags, space-separated")
    a = ap.parse_args()
    schemas = compiling_schemas(a.cli, a.split, a.n)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("\n".join(schemas) + "\n")
    cmd = [a.cli, "bench-structured", "--schemas", f.name, "--precompute-ms", a.precompute_ms,
           "--repeat", str(a.repeat), "--max-tokens", str(a.max_tokens)] + a.extra.split()
    print(" ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(p.stderr[-2000:])
    if p.returncode:
        sys.exit(p.returncode)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(json.dumps(r))
    best = {}
    for r in rows:  # best of the repeats by total mask wait
        k = r["precompute_ms"]
        if k not in best or r["mask_ms_total"] < best[k]["mask_ms_total"]:
            best[k] = r
    cols = ["precompute_ms", "mask_ms_total", "mask_ms_first_step", "mask_ms_step_p50", "mask_ms_step_p99",
            "mask_ms_step_max", "step_ms_p50", "mask_share_of_steps", "add_request_ms", "add_request_max_ms",
            "wall_ms", "mask_steps", "tokens", "stopped"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for k in sorted(best):
        print("| " + " | ".join(str(best[k][c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
