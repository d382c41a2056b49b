#!/usr/bin/env python3
"""Instruction mix of a kernel's hottest loop in `cuobjdump -sass` output (issue #13 evidence).

usage: sass_loop_count.py FILE.sass FUNCTION_SUBSTRING [--mma-per-chunk N --bytes-per-chunk B]

Finds the function whose (demangled or mangled) name contains the substring, takes the largest
backward branch's body (the K loop: the loop with the most instructions), and prints the opcode
histogram of that body. With --mma-per-chunk (HMMA per 128-input chunk) it normalises the counts
to one chunk, and with --bytes-per-chunk (weight bytes a warp reads per chunk) to instructions per
weight byte (warp instructions, i.e. per 32 lanes).
"""
import argparse
import collections
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("sass")
ap.add_argument("func", nargs="+", help="substrings, all must occur in the demangled name")
ap.add_argument("--mma-per-chunk", type=int, default=0)
ap.add_argument("--bytes-per-chunk", type=int, default=0)
a = ap.parse_args()

text = open(a.sass).read().split("\n")
funcs, cur = {}, None
for line in text:
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1)
        funcs[cur] = []
    elif cur is not None:
        funcs[cur].append(line)
try:
    dem = dict(zip(funcs, subprocess.run(["c++filt"], input="\n".join(funcs), capture_output=True, text=True).stdout.split("\n")))
except OSError:
    dem = {f: f for f in funcs}
hits = [f for f in funcs if all(s in dem[f] for s in a.func)]
if len(hits) != 1:
    sys.exit(f"{len(hits)} functions match: " + "; ".join(dem[f] for f in hits))
ins = []  # (address, opcode, text)
for line in funcs[hits[0]]:
    m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if not m:
        continue
    body = re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())
    ins.append((int(m.group(1), 16), body.split()[0], m.group(2)))
addr = {ad: i for i, (ad, _, _) in enumerate(ins)}
best = None
for i, (ad, op, t) in enumerate(ins):
    if op.startswith("BRA"):
        m = re.search(r"0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) <= ad and int(m.group(1), 16) in addr:
            j = addr[int(m.group(1), 16)]
            if best is None or i - j > best[1] - best[0]:
                best = (j, i)
if best is None:
    sys.exit("no backward branch")
body = ins[best[0]:best[1] + 1]
hist = collections.Counter(op.split(".")[0] for _, op, _ in body)
n = len(body)
print(f"{dem[hits[0]]}\nloop body {n} instructions (0x{body[0][0]:x}..0x{body[-1][0]:x})")
mma = hist.get("HMMA", 0)
chunks = mma / a.mma_per_chunk if a.mma_per_chunk and mma else 0
for op, c in hist.most_common():
    extra = f"  {c / chunks:7.1f}/chunk" if chunks else ""
    print(f"  {op:10s} {c:5d}{extra}")
if chunks:
    print(f"chunks per trip {chunks:g}: {n / chunks:.1f} instructions per chunk", end="")
    if a.bytes_per_chunk:
        print(f", {n / chunks / a.bytes_per_chunk * 1024:.1f} per KiB of weights ({a.bytes_per_chunk} B/chunk)", end="")
    print()
