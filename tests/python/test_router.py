"""`deepinfer router` over two `deepinfer serve` processes on the bundled default model, through
the official `openai` client: completions and chat, streamed and not, equal to a replica's own
greedy answer; a replica killed (SIGKILL) during a burst: every request still answered, the
replica out of the pool, then back when it restarts on its port. docs/ROUTER.md."""
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_common import MODEL, client, get, serve

openai = pytest.importorskip("openai")
SERVE_ARGS = ["--model", str(MODEL), "--served-model-name", "tiny", "--max-num-seqs", "8", "--max-model-len", "512"]
ENV = dict(os.environ, DEEPINFER_USE_NEXTN_DECODE="0", OMP_NUM_THREADS="1")


def start(args, kind="serve"):
    srv = serve.start_command(kind, args, env=ENV)
    return srv.proc, srv.port, srv.log


@pytest.fixture(scope="module")
def cluster():
    try:
        serve.find_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    reps = [start(SERVE_ARGS + ["--port", "0"]) for _ in range(2)]
    urls = ",".join(f"http://127.0.0.1:{p}" for _, p, _ in reps)
    router = start(["--backends", urls, "--port", "0", "--health-interval-s", "0.1"], kind="router")
    yield {"reps": reps, "router": router}
    for proc, _, _ in [router, *reps]:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


def test_answers_equal_a_replicas_own(cluster):
    r = client(cluster["router"][1])
    d = client(cluster["reps"][0][1])
    kw = dict(model="tiny", max_tokens=12, temperature=0)
    want = d.completions.create(prompt="The router test says", **kw).choices[0].text
    assert r.completions.create(prompt="The router test says", **kw).choices[0].text == want
    streamed = "".join(c.choices[0].text for c in r.completions.create(prompt="The router test says", stream=True, **kw))
    assert streamed == want
    msgs = [{"role": "user", "content": "Say hello to the router."}]
    want_chat = d.chat.completions.create(messages=msgs, **kw).choices[0].message.content
    assert r.chat.completions.create(messages=msgs, **kw).choices[0].message.content == want_chat
    parts = [c.choices[0].delta.content or "" for c in r.chat.completions.create(messages=msgs, stream=True, **kw)
             if c.choices]
    assert "".join(parts) == want_chat
    assert [m.id for m in r.models.list().data] == ["tiny"]
    status, body = get(cluster["router"][1], "/health")
    assert status == 200 and json.loads(body)["backends_up"] == 2


def test_replica_killed_during_burst_then_back(cluster):
    r = client(cluster["router"][1])
    victim, vport, _ = cluster["reps"][1]

    def one(i):
        return r.completions.create(model="tiny", prompt=f"burst request {i} asks", max_tokens=24, temperature=0,
                                    extra_body={"ignore_eos": True})

    with ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(one, i) for i in range(8)]
        time.sleep(0.5)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        results = [f.result() for f in futs]  # raises if any request was lost
    assert all(x.usage.completion_tokens == 24 for x in results)
    deadline = time.time() + 10
    while time.time() < deadline and json.loads(get(cluster["router"][1], "/health")[1]).get("backends_up") != 1:
        time.sleep(0.1)
    assert json.loads(get(cluster["router"][1], "/health")[1])["backends_up"] == 1
    # Back on its port: the router's health checks put it in the pool again.
    cluster["reps"][1] = start(SERVE_ARGS + ["--port", str(vport)])
    deadline = time.time() + 20
    while time.time() < deadline and json.loads(get(cluster["router"][1], "/health")[1]).get("backends_up") != 2:
        time.sleep(0.1)
    assert json.loads(get(cluster["router"][1], "/health")[1])["backends_up"] == 2
    assert one(99).usage.completion_tokens == 24
