#!/usr/bin/env python3
"""Load test of `deepinfer serve`: N concurrent streaming clients over loopback.

Each client streams one /v1/completions request (ignore_eos, max_tokens M, logprobs 0 so that
every chunk names its tokens) and checks that nothing was lost or duplicated: the tokens listed
across its chunks number exactly M, their text joined equals the streamed text, usage agrees.
Prints a JSON summary: requests ok/failed, output tokens/s, TTFT and TPOT percentiles (ms).

    python3 bench/serve_load.py --url http://127.0.0.1:8000 --clients 200 --max-tokens 32
    python3 bench/serve_load.py --launch "--model assets/default-model" --clients 200
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def one_client(host, port, i, max_tokens, prompt, out, timeout):
    body = json.dumps({"prompt": f"{prompt} {i}", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                       "logprobs": 0, "temperature": 0.8, "seed": i, "skip_special_tokens": False,
                       "stream_options": {"include_usage": True}})
    r = {"ok": False, "error": None}
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection(host, port, timeout=timeout)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            r["error"] = f"status {resp.status}: {resp.read()[:200]!r}"
            out[i] = r
            return
        text, tokens, times, usage, done = "", [], [], None, False
        buf = b""
        while True:
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: "):
                    continue
                data = ev[6:]
                if data == b"[DONE]":
                    done = True
                    continue
                j = json.loads(data)
                if "error" in j:
                    raise RuntimeError(j["error"]["message"])
                if not j["choices"]:
                    usage = j.get("usage")
                    continue
                ch = j["choices"][0]
                if ch["logprobs"] and ch["logprobs"]["tokens"]:
                    times.append(time.perf_counter())
                    tokens += ch["logprobs"]["tokens"]
                text += ch["text"]
        c.close()
        problems = []
        if not done:
            problems.append("no [DONE]")
        if len(tokens) != max_tokens:
            problems.append(f"{len(tokens)} tokens listed, {max_tokens} expected")
        # A token that ends inside a UTF-8 character is listed as U+FFFD while the text holds its
        # bytes back: compare the text only when no token is such a piece.
        if "\ufffd" not in "".join(tokens) and "".join(tokens) != text:
            problems.append("tokens joined differ from the text")
        if not usage or usage["completion_tokens"] != max_tokens:
            problems.append(f"usage {usage}")
        r.update(ok=not problems, error="; ".join(problems) or None, ttft=(times[0] - t0) if times else None,
                 tpot=((times[-1] - times[0]) / (len(times) - 1)) if len(times) > 1 else None, tokens=len(tokens))
    except Exception as e:  # noqa: BLE001 (reported per client)
        r["error"] = f"{type(e).__name__}: {e}"
    out[i] = r


def run(url, clients, max_tokens, prompt="The meaning of", timeout=600):
    u = urllib.parse.urlparse(url)
    out = [None] * clients
    threads = [threading.Thread(target=one_client, args=(u.hostname, u.port, i, max_tokens, prompt, out, timeout))
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in out if r and r["ok"]]
    ttft = [r["ttft"] * 1e3 for r in ok if r.get("ttft") is not None]
    tpot = [r["tpot"] * 1e3 for r in ok if r.get("tpot") is not None]
    toks = sum(r["tokens"] for r in ok)
    return {
        "clients": clients, "max_tokens": max_tokens, "ok": len(ok), "failed": clients - len(ok),
        "errors": sorted({r["error"] for r in out if r and not r["ok"]})[:5],
        "wall_s": round(wall, 3), "output_tokens": toks, "output_tok_per_s": round(toks / wall, 1),
        "ttft_ms": {p: round(pct(ttft, p), 1) for p in (50, 90, 99)} if ttft else None,
        "tpot_ms": {p: round(pct(tpot, p), 2) for p in (50, 90, 99)} if tpot else None,
        "ttft_mean_ms": round(statistics.mean(ttft), 1) if ttft else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server, http://HOST:PORT")
    ap.add_argument("--launch", help="start `deepinfer serve` with these arguments instead")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    srv = None
    url = a.url
    if a.launch:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "deepinfer"))
        import serve  # noqa: E402  (python/deepinfer/serve.py without the package's extension)
        srv = serve.launch(a.launch.split())
        url = srv.url
    try:
        print(json.dumps(run(url, a.clients, a.max_tokens), indent=1))
    finally:
        if srv:
            srv.stop()


if __name__ == "__main__":
    main()
