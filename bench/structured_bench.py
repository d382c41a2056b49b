#!/usr/bin/env python3
"""MaskBench side by side: deepinfer vs xgrammar vs llguidance (benchmark, not a test).

For every schema of maskbench-dev (or a deterministic sample): compile, then walk each test
instance (compact JSON, DeepSeek tokenizer ids) token by token, computing the full-vocabulary
mask before every token, and finally check the end-of-sequence. A schema passes when it
compiles and every valid instance is accepted and every invalid one rejected.

Reports per engine: passing schemas, compile errors, false accepts / rejects, compile time
p50/p99 and per-token mask time p50/p99/p99.9. deepinfer runs through `deepinfer so-check
--mask-times` (same process for all schemas; grammars reused across a schema's instances).

  python3 bench/structured_bench.py --limit 500 --engines deepinfer,xgrammar,llguidance
  python3 bench/structured_bench.py --limit 300 --engines deepinfer,llguidance --repeat 3   # best of 3
  python3 bench/structured_bench.py --split JME --engines deepinfer,llguidance --cpu-clock   # busy machine

--cpu-clock times masks and compiles in the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID /
time.thread_time) instead of wall time: on a shared machine a wall-clock mask includes the time
slices other processes ran in. xgrammar compiles on a thread pool, so its compiles are timed in the
process's CPU time (every thread) instead; deepinfer so-check and llguidance compile and mask in
the caller. xgrammar needs torch (pip install xgrammar brings it, ~3 GB with its CUDA wheels).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DEEPINFER_SHARED_DIR", ROOT.parent / "shared"))


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100.0 * len(xs)))]


def load_cases(limit, split=None):
    tmp = Path(tempfile.gettempdir()) / "deepinfer-maskbench"
    if not (tmp / "maskbench-dev").exists():
        with tarfile.open(SHARED / "data/structured/maskbench-dev.tar.gz") as t:
            t.extractall(tmp)
    files = sorted((tmp / "maskbench-dev").glob("*.json"))
    if split:  # file names are SPLIT---ID.json, or BFCL_..., JME_... for those splits
        files = [f for f in files if (f.name.split("---")[0] if "---" in f.name else f.name.split("_")[0]) == split]
    if limit and limit < len(files):
        step = len(files) / limit
        files = [files[int(i * step)] for i in range(limit)]
    cases = []
    for f in files:
        d = json.loads(f.read_text())
        tests = [(json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False), t["valid"]) for t in d["tests"]]
        cases.append((f.name, d["schema"], tests))
    return cases


class Stats:
    def __init__(self, name):
        self.name = name
        self.passed = self.compile_errors = self.fa = self.fr = self.schemas = 0
        self.compile_ms = []
        self.mask_us = []
        self.mask_where = []  # deepinfer: (schema, instance, token) of each mask_us entry, for --slowest
        self.precompute_ms = []  # deepinfer --precompute-ms: the fill before each first mask

    def row(self):
        return {
            "engine": self.name, "schemas": self.schemas, "passed": self.passed,
            "compile_errors": self.compile_errors, "false_accepts": self.fa, "false_rejects": self.fr,
            "compile_ms_p50": round(pct(self.compile_ms, 50), 3), "compile_ms_p99": round(pct(self.compile_ms, 99), 3),
            "mask_us_p50": round(pct(self.mask_us, 50), 2), "mask_us_p99": round(pct(self.mask_us, 99), 2),
            "mask_us_p99.9": round(pct(self.mask_us, 99.9), 2),
            "mask_us_max": round(max(self.mask_us), 1) if self.mask_us else float("nan"), "masks": len(self.mask_us),
            **({"precompute_ms_p50": round(pct(self.precompute_ms, 50), 2),
                "precompute_ms_p99": round(pct(self.precompute_ms, 99), 2)} if self.precompute_ms else {}),
        }

    def best_of(self, other):
        """Per-mask and per-compile minimum with another run of the same cases (the load on a
        shared machine adds noise to single runs; the minimum is the engine's own cost)."""
        if len(other.mask_us) == len(self.mask_us):
            self.mask_us = [min(a, b) for a, b in zip(self.mask_us, other.mask_us)]
        if len(other.compile_ms) == len(self.compile_ms):
            self.compile_ms = [min(a, b) for a, b in zip(self.compile_ms, other.compile_ms)]


def record(st, results):
    ok = True
    for got, want in results:
        if got != want:
            ok = False
            if got:
                st.fa += 1
            else:
                st.fr += 1
    st.passed += ok


def run_deepinfer(cases, tok_path, exe, cpu_clock=False, precompute_ms=0.0, precompute_cpu=False):
    st = Stats("deepinfer")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        index = []
        for ci, (_, schema, tests) in enumerate(cases):
            for text, valid in tests:
                f.write(json.dumps({"input": text, "so_args": {"json_schema": schema}}, ensure_ascii=False) + "\n")
                index.append((ci, valid))
        path = f.name
    out = subprocess.run([exe, "so-check", "--tokenizer", tok_path, "--inputs", path, "--mask-times"] + (["--cpu-clock"] if cpu_clock else [])
                         + (["--precompute-ms", str(precompute_ms)] if precompute_ms > 0 else [])
                         + (["--precompute-cpu"] if precompute_cpu and precompute_ms > 0 else []),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    os.unlink(path)
    per_case = {}
    for (ci, valid), line in zip(index, out):
        r = json.loads(line)
        per_case.setdefault(ci, []).append((r, valid))
    for ci in range(len(cases)):
        rows = per_case.get(ci, [])
        if not rows:  # a schema without test instances
            continue
        st.schemas += 1
        if rows and "error" in rows[0][0] and "compile_ms" not in rows[0][0]:
            st.compile_errors += 1
            continue
        st.compile_ms.append(rows[0][0]["compile_ms"])
        if "precompute_ms" in rows[0][0]:
            st.precompute_ms.append(rows[0][0]["precompute_ms"])
        for ii, (r, _) in enumerate(rows):
            us = r.get("mask_us", [])
            st.mask_us.extend(us)
            st.mask_where.extend((cases[ci][0], ii, t) for t in range(len(us)))
        record(st, [(r["accepted"], v) for r, v in rows])
    return st


CLOCK = time.perf_counter  # time.thread_time with --cpu-clock


def walk(tokens, fill_mask, consume, accept_eos):
    """fill_mask() -> (time_us, allowed_fn); consume(tok) -> bool."""
    times = []
    for t in tokens:
        t0 = CLOCK()
        allowed = fill_mask()
        times.append((CLOCK() - t0) * 1e6)
        if not allowed(t) or not consume(t):
            return False, times
    return accept_eos(), times


def run_xgrammar(cases, hf_tok, vocab_bytes, eos):
    import torch
    import xgrammar as xgr
    st = Stats("xgrammar")
    info = xgr.TokenizerInfo(vocab_bytes, vocab_type=xgr.VocabType.RAW, vocab_size=len(vocab_bytes), stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    for _, schema, tests in cases:
        if not tests:
            continue
        st.schemas += 1
        # xgrammar compiles on its own thread pool: with --cpu-clock its compile is timed in the
        # process's CPU time (all threads), so the pool's work counts, not only the caller's wait.
        cclock = time.process_time if CLOCK is time.thread_time else CLOCK
        try:
            t0 = cclock()
            cg = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                              strict_mode=False)
            st.compile_ms.append((cclock() - t0) * 1e3)
        except Exception:
            st.compile_errors += 1
            continue
        results = []
        for text, valid in tests:
            m = xgr.GrammarMatcher(cg)

            def fill():
                m.fill_next_token_bitmask(mask)
                row = mask[0]
                return lambda t: bool((int(row[t >> 5]) >> (t & 31)) & 1)

            ok, times = walk(hf_tok.encode(text, add_special_tokens=False).ids, fill, m.accept_token,
                             lambda: m.accept_token(eos))
            st.mask_us.extend(times)
            results.append((ok, valid))
        record(st, results)
    return st


def run_llguidance(cases, tok_json, eos):
    import llguidance as llg
    st = Stats("llguidance")
    tok = llg.LLTokenizer(tok_json, eos_token=eos)
    from tokenizers import Tokenizer
    hf_tok = Tokenizer.from_str(tok_json)
    for _, schema, tests in cases:
        if not tests:
            continue
        st.schemas += 1
        t0 = CLOCK()
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults={"whitespace_flexible": False})
        m0 = llg.LLMatcher(tok, grammar, log_level=0)
        if m0.is_error():
            st.compile_errors += 1
            continue
        st.compile_ms.append((CLOCK() - t0) * 1e3)
        results = []
        for text, valid in tests:
            m = llg.LLMatcher(tok, grammar, log_level=0)

            def fill():
                b = m.compute_bitmask()
                return lambda t: bool(b[t >> 3] >> (t & 7) & 1)

            ok, times = walk(hf_tok.encode(text, add_special_tokens=False).ids, fill, m.consume_token,
                             lambda: m.consume_token(eos) or m.is_accepting())
            st.mask_us.extend(times)
            results.append((ok and not m.is_error(), valid))
        record(st, results)
    return st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="deterministic sample of N schemas (0 = all)")
    ap.add_argument("--engines", default="deepinfer,xgrammar,llguidance")
    ap.add_argument("--tokenizer", default=str(SHARED / "data/tokenizers/deepseek-v3/tokenizer.json"))
    ap.add_argument("--cli", default=os.environ.get("DEEPINFER_CLI") or next(iter([c for c in [str(ROOT / "build" / "deepinfer")] if os.path.exists(c)] + sorted(glob.glob(str(ROOT / "build*/deepinfer")))), None))
    ap.add_argument("--split", default=None, help="only this MaskBench split (Github_easy, JME, BFCL, ...)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per engine, interleaved; reports per-mask / per-compile best of N")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="time in each engine's calling-thread CPU time instead of wall time (see above)")
    ap.add_argument("--precompute-ms", type=float, default=0.0,
                    help="deepinfer: fill mask caches for up to this many ms after each compile, before the "
                         "first mask (the engine's worker does so while the prompt is prefilled); 0 = off")
    ap.add_argument("--precompute-cpu", action="store_true",
                    help="deepinfer: count --precompute-ms in the filling thread's CPU time, not wall time (on a "
                         "loaded machine that thread gets part of a core; an engine's worker has one)")
    ap.add_argument("--slowest", type=int, default=0,
                    help="deepinfer: also print the N slowest single masks (best of --repeat) with schema, "
                         "instance and token index")
    args = ap.parse_args()
    if args.cpu_clock:
        global CLOCK
        CLOCK = time.thread_time
    cases = load_cases(args.limit, args.split)
    tok_json = Path(args.tokenizer).read_text()
    from tokenizers import Tokenizer
    hf_tok = Tokenizer.from_str(tok_json)
    cfg = json.loads((Path(args.tokenizer).parent / "tokenizer_config.json").read_text())
    eos_tok = cfg["eos_token"]["content"] if isinstance(cfg["eos_token"], dict) else cfg["eos_token"]
    eos = hf_tok.token_to_id(eos_tok)
    n = max(hf_tok.get_vocab(with_added_tokens=True).values()) + 1
    rows = []
    best, wall = {}, {}
    engines = args.engines.split(",")
    for rep in range(max(1, args.repeat)):
        for eng in engines:
            t0 = time.time()
            st = run_engine(eng, cases, args, tok_json, hf_tok, eos, n)
            wall[eng] = wall.get(eng, 0) + time.time() - t0
            if eng in best:
                best[eng].best_of(st)
            else:
                best[eng] = st
            print(json.dumps(dict(st.row(), run=rep + 1)), flush=True)
    for eng in engines:
        row = best[eng].row()
        row["runs"] = max(1, args.repeat)
        row["wall_s"] = round(wall[eng], 1)
        rows.append(row)
    if args.slowest and "deepinfer" in best and best["deepinfer"].mask_where:
        st = best["deepinfer"]
        top = sorted(range(len(st.mask_us)), key=lambda i: -st.mask_us[i])[:args.slowest]
        for i in top:
            name, inst, tok = st.mask_where[i]
            print(json.dumps({"slowest_us": round(st.mask_us[i], 1), "schema": name, "instance": inst, "token": tok}))
    keys = list(rows[0].keys())
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "–")) for k in keys) + " |")


def run_engine(eng, cases, args, tok_json, hf_tok, eos, n):
    if eng == "deepinfer":
        st = run_deepinfer(cases, args.tokenizer, args.cli, args.cpu_clock, args.precompute_ms, args.precompute_cpu)
    elif eng == "xgrammar":
        added = {i: t.content for i, t in hf_tok.get_added_tokens_decoder().items()}
        vocab_bytes = [added[i].encode() if i in added else _bytes_of(hf_tok, i) for i in range(n)]
        st = run_xgrammar(cases, hf_tok, vocab_bytes, eos)
    elif eng == "llguidance":
        st = run_llguidance(cases, tok_json, eos)
    else:
        sys.exit(f"unknown engine {eng}")
    return st


_BYTE_DEC = None


def _bytes_of(hf_tok, i):
    """Raw bytes of a byte-level BPE token (GPT-2 byte-to-unicode alphabet)."""
    global _BYTE_DEC
    if _BYTE_DEC is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        k = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + k)
                k += 1
        _BYTE_DEC = {chr(c): b for b, c in zip(bs, cs)}
    s = hf_tok.id_to_token(i)
    if s is None:
        return b""
    try:
        return bytes(_BYTE_DEC[ch] for ch in s)
    except KeyError:
        return s.encode()


if __name__ == "__main__":
    main()
