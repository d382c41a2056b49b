#!/usr/bin/env python3
"""End-to-end check of the CUDA IPC KV hand-off (issue #18, docs/ROUTER.md) on a GPU machine: a
colocated `deepinfer serve`, a prefill and a decode `serve` (--kv-role, --kv-transport) and a
`deepinfer router --prefill --decode`, all on one GPU. Greedy answers through the router must equal
the colocated server's; the pair must have used cuda-ipc (the servers' log lines, /load
kv_payloads) and the decode server must have imported the prefixes. Standard library only.

  bench/disagg_ipc_check.py --bin build/deepinfer [--model assets/default-model] [--transport auto]
                            [--logs DIR]
Exit status 0 when everything held."""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(cmd, log_path, env):
    """Starts `cmd`, tees its stderr to log_path, returns (proc, port) once it prints its address."""
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.PIPE, text=True, env=env)
    found = {}
    ready = threading.Event()

    def pump():
        for line in proc.stderr:
            log.write(line)
            log.flush()
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m and "port" not in found:
                found["port"] = int(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(180) or "port" not in found:
        raise RuntimeError(f"{cmd[1]} did not start; see {log_path}")
    return proc, found["port"]


def request(port, method, path, body=None, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default=os.path.join(ROOT, "assets", "default-model"))
    ap.add_argument("--transport", default="auto")
    ap.add_argument("--accelerator", default="nvidia")
    ap.add_argument("--logs", default=os.environ.get("OUT", tempfile.mkdtemp(prefix="di_ipc_e2e_")))
    a = ap.parse_args()
    env = dict(os.environ)
    base = [a.bin, "serve", "--model", a.model, "--served-model-name", "tiny", "--accelerator", a.accelerator,
            "--kv-cache-gib", "1", "--max-num-seqs", "4", "--max-model-len", "2048", "--port", "0"]
    rdv = tempfile.mkdtemp(prefix="di_ipc_rdv_")
    procs = []
    ok = True
    try:
        single = start(base, os.path.join(a.logs, "single.log"), env)
        procs.append(single[0])
        kv = ["--kv-rendezvous", rdv, "--kv-transport", a.transport]
        pre = start(base + kv + ["--kv-role", "prefill", "--kv-name", "p0", "--kv-peers", "d0"],
                    os.path.join(a.logs, "prefill.log"), env)
        procs.append(pre[0])
        dec = start(base + kv + ["--kv-role", "decode", "--kv-name", "d0", "--kv-peers", "p0"],
                    os.path.join(a.logs, "decode.log"), env)
        procs.append(dec[0])
        router = start([a.bin, "router", "--prefill", f"http://127.0.0.1:{pre[1]}", "--decode",
                        f"http://127.0.0.1:{dec[1]}", "--port", "0", "--health-interval-s", "0.1"],
                       os.path.join(a.logs, "router.log"), env)
        procs.append(router[0])
        deadline = time.time() + 60
        while time.time() < deadline:
            if request(dec[1], "GET", "/load")[1].get("kv_peers_connected") == 1 and \
                    request(pre[1], "GET", "/load")[1].get("kv_peers_connected") == 1:
                break
            time.sleep(0.1)
        time.sleep(1.0)  # the hello / accept exchange and the router's first /load poll
        shared = " ".join(f"Line {k} of the shared context talks about rivers, bridges and numbers." for k in range(60))
        prompts = [shared + " First question: what comes next?", shared + " Second question, a longer one: why?",
                   "A short prompt with no shared prefix at all", shared + " First question: what comes next?"]
        for i, p in enumerate(prompts):
            body = {"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            s1, want = request(single[1], "POST", "/v1/completions", body)
            t0 = time.time()
            s2, got = request(router[1], "POST", "/v1/completions", body)
            ms = (time.time() - t0) * 1000
            same = s1 == 200 and s2 == 200 and want["choices"][0]["text"] == got["choices"][0]["text"]
            ok &= same
            cached = (got or {}).get("usage", {}).get("prompt_tokens_details", {}) or {}
            print(f"prompt {i}: {len(p)} chars, status {s1}/{s2}, equal={same}, routed {ms:.0f} ms, "
                  f"cached_tokens={cached.get('cached_tokens')}", flush=True)
        lp, ld = request(pre[1], "GET", "/load")[1], request(dec[1], "GET", "/load")[1]
        print("prefill /load:", json.dumps({k: lp.get(k) for k in ("kv_transport", "kv_transfers", "kv_payloads")}))
        print("decode  /load:", json.dumps({k: ld.get(k) for k in ("kv_transport", "kv_transfers", "kv_payloads")}))
        ipc = (lp.get("kv_payloads") or {}).get("ipc_sent", 0) > 0 and (ld.get("kv_payloads") or {}).get("ipc_received", 0) > 0
        imported = (ld.get("kv_transfers") or {}).get("imported_tokens", 0) > 0
        if a.transport != "host" and a.accelerator == "nvidia":
            ok &= ipc
        ok &= imported
        print(f"ipc used: {ipc}, decode imported: {imported}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    for name in ("prefill", "decode"):
        with open(os.path.join(a.logs, f"{name}.log")) as f:
            for line in f:
                if "kv transport" in line:
                    print(f"[{name}] {line.rstrip()}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
