"""Prefill/decode disaggregation with speculative decoding on the decode side (issue #18's identity
check): `deepinfer serve --kv-role prefill` and `--kv-role decode` on the bundled default model
(which has an MTP drafter: drafting is on by default), joined by the KV transport (gloo over
loopback), behind `deepinfer router --prefill --decode`. Greedy answers, streamed and not, equal a
single colocated server's with the same drafting, the decode server imported the prefixes
(cached prompt tokens, /load kv_transfers) and really verified drafts (its spec-decode counters
grew). docs/ROUTER.md."""
import json
import os
import re
import tempfile
import time

import pytest

from serve_common import MODEL, client, serve
from serve_common import get as get_bytes

openai = pytest.importorskip("openai")
BASE = ["--model", str(MODEL), "--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "1024",
        "--port", "0"]
# Drafting as a user gets it (3 drafts per step), on every server, so the colocated answer is
# the one a drafting engine gives.
ENV = dict(os.environ, DEEPINFER_USE_NEXTN_DECODE="3", OMP_NUM_THREADS="1")
ENV.pop("DEEPINFER_ACCELERATOR", None)


def start(args, kind="serve"):
    srv = serve.start_command(kind, args, env=ENV)
    return srv.proc, srv.port


def get(port, path):
    status, body = get_bytes(port, path)
    return status, body.decode()


def metric(port, name):
    _, body = get(port, "/metrics")
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def servers():
    try:
        serve.find_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    procs = []
    try:
        rdv = tempfile.mkdtemp(prefix="di_kv_spec_")
        single = start(BASE)
        procs.append(single[0])
        pre = start(BASE + ["--kv-role", "prefill", "--kv-rendezvous", rdv, "--kv-name", "p0", "--kv-peers", "d0"])
        procs.append(pre[0])
        dec = start(BASE + ["--kv-role", "decode", "--kv-rendezvous", rdv, "--kv-name", "d0", "--kv-peers", "p0"])
        procs.append(dec[0])
        router = start(["--prefill", f"http://127.0.0.1:{pre[1]}", "--decode", f"http://127.0.0.1:{dec[1]}",
                        "--port", "0", "--health-interval-s", "0.1"], kind="router")
        procs.append(router[0])
        # The pair connects in the background; the router learns the decode side's name from /load.
        deadline = time.time() + 60
        while time.time() < deadline and json.loads(get(dec[1], "/load")[1]).get("kv_name") != "d0":
            time.sleep(0.1)
        time.sleep(0.5)
        yield {"single": single[1], "prefill": pre[1], "decode": dec[1], "router": router[1]}
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(30)


def test_disaggregated_with_drafting_equals_colocated(servers):
    shared = " ".join(f"Line {k} of the shared context talks about rivers and numbers." for k in range(40))
    prompts = [shared + " First question: what comes next?", shared + " Second question, a longer one: why?",
               "A short prompt with no shared prefix", shared + " First question: what comes next?"]
    kw = dict(model="tiny", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    single, routed = client(servers["single"], timeout=300), client(servers["router"], timeout=300)
    drafts0 = metric(servers["decode"], "deepinfer_spec_decode_num_draft_tokens_total")
    cached = 0
    for i, p in enumerate(prompts):
        want = single.completions.create(prompt=p, **kw)
        got = routed.completions.create(prompt=p, **kw)
        assert got.choices[0].text == want.choices[0].text, f"prompt {i}"
        assert got.usage.completion_tokens == 40
        cached += (got.usage.prompt_tokens_details.cached_tokens or 0) if got.usage.prompt_tokens_details else 0
        streamed = "".join(c.choices[0].text for c in routed.completions.create(prompt=p, stream=True, **kw))
        assert streamed == want.choices[0].text, f"prompt {i} streamed"
    load = json.loads(get(servers["decode"], "/load")[1])
    assert load["kv_transfers"]["received"] >= 2 * 3, load["kv_transfers"]  # the short prompt has no full block
    assert load["kv_transfers"]["timed_out"] == 0
    assert load["kv_transfers"]["imported_tokens"] > 0
    assert cached > 0
    # The decode side drafted and verified (so the identity above covers speculative decoding).
    drafted = metric(servers["decode"], "deepinfer_spec_decode_num_draft_tokens_total") - drafts0
    assert drafted > 0
    assert metric(servers["decode"], "deepinfer_spec_decode_num_accepted_tokens_total") > 0
