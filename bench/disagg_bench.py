"""TTFT / TPOT percentiles and throughput, prefill/decode disaggregated vs colocated, through
`deepinfer router` (docs/ROUTER.md), on a mixed long-prompt / long-output workload.

    python3 bench/disagg_bench.py [--model assets/default-model] [--requests 16] [--concurrency 4]

Colocated: two `serve` replicas behind `router --backends`. Disaggregated: one prefill and one
decode `serve` (joined by the KV transport) behind `router --prefill --decode`. Same number of
engines, each with OMP_NUM_THREADS=1. Requests are streamed; TTFT = first content event,
TPOT = (last - first) / (tokens - 1). Prints one JSON line per mode and a table.
"""
import argparse
import http.client
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("deepinfer_serve", ROOT / "python" / "deepinfer" / "serve.py")
serve_mod = importlib.util.module_from_spec(_spec)  # the launcher alone (no native extension needed)
_spec.loader.exec_module(serve_mod)


def start(args, env):
    """`deepinfer ARGS` (serve or router) listening: (process, port)."""
    srv = serve_mod.start_command(args[0], args[1:], timeout=180, env=env)
    return srv.proc, srv.port


def stream_one(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    times, buf = [], b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            data = ev[len(b"data: "):]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("choices") and j["choices"][0].get("text"):
                times.append(time.perf_counter())
    c.close()
    n = body["max_tokens"]
    ttft = times[0] - t0 if times else float("nan")
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
    return ttft, tpot, n, times[-1] - t0 if times else float("nan")


def pct(xs, p):
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def workload(n):
    out = []
    for i in range(n):
        long = i % 2 == 0
        prompt = (f"Request {i}. " + "The quick brown fox jumps over the lazy dog. " * (40 if long else 2))
        out.append({"model": "m", "prompt": prompt, "max_tokens": 48 if long else 96, "temperature": 0,
                    "ignore_eos": True, "stream": True})
    return out


def run_mode(model, mode, args, env):
    procs = []
    base = ["serve", "--model", model, "--served-model-name", "m", "--max-num-seqs", "8", "--max-model-len", "1024",
            "--port", "0"]
    try:
        if mode == "colocated":
            ports = []
            for _ in range(2):
                p, port = start(base, env)
                procs.append(p)
                ports.append(port)
            rargs = ["router", "--backends", ",".join(f"http://127.0.0.1:{p}" for p in ports)]
        else:
            rdv = tempfile.mkdtemp(prefix="di_kv_bench_")
            p1, pp = start(base + ["--kv-role", "prefill", "--kv-rendezvous", rdv, "--kv-name", "p0",
                                        "--kv-peers", "d0"], env)
            p2, dp = start(base + ["--kv-role", "decode", "--kv-rendezvous", rdv, "--kv-name", "d0",
                                        "--kv-peers", "p0"], env)
            procs += [p1, p2]
            rargs = ["router", "--prefill", f"http://127.0.0.1:{pp}", "--decode", f"http://127.0.0.1:{dp}"]
        rp, rport = start(rargs + ["--port", "0", "--health-interval-s", "0.2"], env)
        procs.append(rp)
        time.sleep(1.0)  # the KV pair connects, the router's first polls see the names
        stream_one(rport, dict(workload(1)[0], max_tokens=4))  # warm-up
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as ex:
            res = list(ex.map(lambda b: stream_one(rport, b), workload(args.requests)))
        wall = time.perf_counter() - t0
        ttft = [r[0] for r in res]
        tpot = [r[1] for r in res]
        toks = sum(r[2] for r in res)
        return {"mode": mode, "requests": len(res), "wall_s": round(wall, 2), "output_tok_s": round(toks / wall, 1),
                **{f"ttft_p{p}_ms": round(pct(ttft, p) * 1000, 1) for p in (50, 90, 99)},
                **{f"tpot_p{p}_ms": round(pct(tpot, p) * 1000, 1) for p in (50, 90, 99)}}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "assets" / "default-model"))
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    serve_mod.find_executable()  # fails early, naming where it looked
    env = dict(os.environ, OMP_NUM_THREADS="1", DEEPINFER_USE_NEXTN_DECODE="0")
    rows = [run_mode(args.model, m, args, env) for m in ("colocated", "disaggregated")]
    for r in rows:
        print(json.dumps(r))
    keys = [k for k in rows[0] if k != "mode"]
    print("| mode | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for r in rows:
        print(f"| {r['mode']} | " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
