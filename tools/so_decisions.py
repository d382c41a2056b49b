#!/usr/bin/env python3
"""Decisions of `deepinfer so-check` over every MaskBench-dev instance, for before/after checks.

A change meant to make compiling faster must not change any decision. This writes one JSON line
per instance (schema file, instance index, accepted, compile error text, mask mismatch flag), the
so-check output minus its timing and cache fields, and compares two such files.

  python3 tools/so_decisions.py --cli <old build>/deepinfer --out /tmp/before.jsonl
  python3 tools/so_decisions.py --cli <new build>/deepinfer --out /tmp/after.jsonl
  python3 tools/so_decisions.py --compare /tmp/before.jsonl /tmp/after.jsonl   # exit 1 on a difference

--mask-hash also records each instance's mask_hash (so-check --mask-hash: every bit of every mask
of the walk), so a change to the mask walks can be checked mask for mask, not only by decisions.
Both files must be written with it for the hashes to be compared.

A compile error on both sides where one side ran out of time is reported apart (its text depends
on speed: a faster build may hit a state limit before the time limit) and does not fail.

The instances come from bench/structured_bench.py load_cases(0) (all of maskbench-dev).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import structured_bench  # noqa: E402

# Fields that measure time or depend on cache hits, not on the grammar's meaning.
VOLATILE = ("compile_ms", "cached", "mask_us", "mask_us_mean")
# The time-limit error names the budget left when the compile began (so-check's deadline runs
# per input), which varies from run to run; the decision (that it ran out) is what is compared.
TIME_LIMIT = re.compile(r"(exceeded its time limit of )[0-9.]+( ms)")


def normalized(r):
    r = {k: v for k, v in r.items() if k not in VOLATILE}
    if "error" in r:
        r["error"] = TIME_LIMIT.sub(r"\1<t>\2", r["error"])
    return r


def decisions(cli, tokenizer, mask_hash=False, split=None):
    cases = structured_bench.load_cases(0, split)
    index = []
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for name, schema, tests in cases:
            for i, (text, _valid) in enumerate(tests):
                f.write(json.dumps({"input": text, "so_args": {"json_schema": schema}}, ensure_ascii=False) + "\n")
                index.append((name, i))
        path = f.name
    try:
        out = subprocess.run([cli, "so-check", "--tokenizer", tokenizer, "--inputs", path] + (["--mask-hash"] if mask_hash else []),
                             capture_output=True, text=True, check=True).stdout.splitlines()
    finally:
        os.unlink(path)
    if len(out) != len(index):
        sys.exit(f"so-check wrote {len(out)} lines for {len(index)} instances")
    rows = []
    for (name, i), line in zip(index, out):
        rows.append({"case": name, "instance": i, **normalized(json.loads(line))})
    return rows


def compare(a, b):
    ra = [normalized(json.loads(x)) for x in Path(a).read_text().splitlines()]
    rb = [normalized(json.loads(x)) for x in Path(b).read_text().splitlines()]
    if len(ra) != len(rb):
        print(f"different instance counts: {len(ra)} vs {len(rb)}")
        return 1
    diff = [(x, y) for x, y in zip(ra, rb) if x != y]
    # A compile that ran out of time on one side and failed otherwise on the other is decided by
    # speed, not by meaning (a faster build may reach a state limit first): listed apart.
    def timed_out(r):
        return "exceeded its time limit" in r.get("error", "")
    timing = [(x, y) for x, y in diff if "error" in x and "error" in y and (timed_out(x) or timed_out(y))]
    real = [d for d in diff if d not in timing]
    for label, rows in (("differs", real), ("time-bound (both compile errors, one a time limit)", timing)):
        for x, y in rows[:20]:
            print(f"{label}: before:", json.dumps(x, ensure_ascii=False)[:300])
            print(f"{label}: after: ", json.dumps(y, ensure_ascii=False)[:300])
    print(f"{len(ra)} instances, {len(real)} differ, {len(timing)} time-bound compile errors differ in text")
    return 1 if real else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", help="deepinfer binary")
    ap.add_argument("--out", help="decisions file to write")
    ap.add_argument("--tokenizer", default=str(structured_bench.SHARED / "data/tokenizers/deepseek-v3/tokenizer.json"))
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--mask-hash", action="store_true", help="also compare every mask (so-check --mask-hash)")
    ap.add_argument("--split", default=None, help="only this MaskBench split (default: all of maskbench-dev)")
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.cli or not args.out:
        ap.error("--cli and --out (or --compare)")
    rows = decisions(args.cli, args.tokenizer, args.mask_hash, args.split)
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} instances -> {args.out}")


if __name__ == "__main__":
    main()
