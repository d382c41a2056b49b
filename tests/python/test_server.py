"""`deepinfer serve` on the bundled default model, through the official `openai` client and raw
HTTP: every endpoint streaming and not, chat prompts against hand-written ones, forced tool calls
(real DSML from the model, split across stream chunks), reasoning, errors with OpenAI bodies
and the server still serving, a client leaving mid-stream, and a small concurrent load
(bench/serve_load.py; the 200-client run is opt-in: DEEPINFER_SERVER_LOAD=1)."""
import http.client
import importlib.util
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "assets" / "default-model"
openai = pytest.importorskip("openai")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


serve = _load("deepinfer_serve", ROOT / "python" / "deepinfer" / "serve.py")
load = _load("serve_load", ROOT / "bench" / "serve_load.py")


@pytest.fixture(scope="module")
def srv():
    try:
        serve.find_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # MTP drafting off: with it, a request whose prompt + max_tokens ends one token past a 256-token
    # block fails its step ("needs 3 blocks for 513 tokens, block_table has 2"; an engine bug that
    # `deepinfer generate` shows too, reported to the lead), and the tool prompts here are ~500 tokens.
    env = dict(os.environ, DEEPINFER_USE_NEXTN_DECODE="0")
    s = serve.launch(["--model", str(MODEL), "--served-model-name", "tiny", "--max-num-seqs", "64",
                      "--max-model-len", "1024", "--max-body-mib", "1", "--max-waiting", "1024"], env=env)
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)


def raw(srv, method, path, body=None, headers=None):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    c.request(method, path, data, {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    out = r.status, r.getheaders(), r.read()
    c.close()
    return out


def error_of(status_body):
    status, _, body = status_body
    j = json.loads(body)
    assert set(j["error"]) >= {"message", "type", "param", "code"}, j
    return status, j["error"]


def metrics(srv):
    text = raw(srv, "GET", "/metrics")[2].decode()
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, v = line.rsplit(" ", 1)
            vals[name] = float(v)
    return vals


def wait_idle(srv, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics(srv)
        free = m['deepinfer_kv_cache_blocks_free{model_name="tiny"}']
        total = m['deepinfer_kv_cache_blocks_total{model_name="tiny"}']
        running = m['deepinfer_num_requests_running{model_name="tiny"}']
        waiting = m['deepinfer_num_requests_waiting{model_name="tiny"}']
        if free == total and running == 0 and waiting == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"not idle: {free}/{total} blocks free, {running} running, {waiting} waiting")


def test_health_models_metrics(srv, client):
    assert raw(srv, "GET", "/health")[0] == 200
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    m = metrics(srv)
    assert 'deepinfer_kv_cache_usage_perc{model_name="tiny"}' in m


def test_completions_stream_equals_whole(client):
    kw = dict(model="tiny", prompt="The Lord is", max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 20 and whole.usage.prompt_tokens > 0
    assert whole.usage.prompt_tokens_details.cached_tokens >= 0
    parts = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(p.choices[0].text for p in parts if p.choices)
    assert text == whole.choices[0].text
    assert parts[-1].usage.completion_tokens == 20
    # n choices and several prompts in one request; logprobs.
    many = client.completions.create(model="tiny", prompt=["a", "b"], n=2, max_tokens=4, logprobs=2, seed=1)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]
    for c in many.choices:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == 4
        assert "".join(c.logprobs.tokens) == c.text
        assert all(len(t) <= 2 for t in c.logprobs.top_logprobs)
    ids = client.completions.create(model="tiny", prompt=[0, 2525, 432], max_tokens=3, echo=True)
    assert ids.usage.prompt_tokens == 3


def test_usage_reports_cached_prompt_tokens(srv, client):
    prompt = " ".join(f"w{i}" for i in range(200))  # > one 256-token block
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens > 256
    assert again.usage.prompt_tokens_details.cached_tokens >= 256, again.usage
    assert metrics(srv)['deepinfer_prefix_cache_hits_total{model_name="tiny"}'] >= 256


def test_chat_prompt_matches_hand_written(client):
    tok = pytest.importorskip("tokenizers").Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    count = lambda s: len(tok.encode(s, add_special_tokens=False).ids)  # noqa: E731
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == count("<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜></think>")
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, reasoning_effort="high")
    assert r.usage.prompt_tokens == count("<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜><think>")
    multi = msgs + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    r = client.chat.completions.create(model="tiny", messages=multi, max_tokens=2)
    assert r.usage.prompt_tokens == count("<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜></think>Hello."
                                          "<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜></think>")


def test_chat_stream_equals_whole(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me"}], max_tokens=24, temperature=0)
    whole = client.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    parts = list(client.chat.completions.create(stream=True, **kw))
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == msg.content
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason


# An enum and a boolean: the tiny model was never trained on DSML; a string value ends only when it writes the
# closing tag, and a number may run on as 8.000... (still a JSON Schema integer). Free-text and typed
# values are covered by tests/cpp/server/tool_grammar_test.
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "hourly": {"type": "boolean"}},
    "required": ["city", "hourly"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def test_forced_tool_call_streams_arguments(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}], tools=[WEATHER, CLOCK],
              tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=200, temperature=0)
    whole = client.chat.completions.create(**kw)
    ch = whole.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Oslo") and isinstance(args["hourly"], bool)
    parts = list(client.chat.completions.create(stream=True, **kw))
    deltas = [tc for p in parts if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
    content = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert "DSML" not in content and "｜" not in content
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert len([d for d in deltas if d.function.arguments]) > 2, "arguments should arrive in pieces"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert parts[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_required_and_history(client):
    msgs = [{"role": "user", "content": "What time is it, and the weather in Oslo?"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER, CLOCK], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=300, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name in ("get_weather", "now") for c in calls)
    for c in calls:
        json.loads(c.function.arguments)
    # The calls and their results go back in as history (rendered by the template).
    msgs += [r.choices[0].message.model_dump(exclude_none=True)]
    msgs += [{"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in calls]
    r2 = client.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER, CLOCK], max_tokens=8)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    none = client.chat.completions.create(model="tiny", messages=msgs[:1], tools=[WEATHER], tool_choice="none", max_tokens=4)
    assert none.choices[0].message.tool_calls is None


def test_reasoning_split(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Think"}], max_tokens=12, temperature=0,
              reasoning_effort="high")
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message.model_dump()
    reasoning = m.get("reasoning_content") or ""
    assert reasoning or m["content"], m
    for text in (reasoning, m["content"] or ""):
        assert "<think>" not in text and "</think>" not in text
    parts = list(client.chat.completions.create(stream=True, **kw))
    sr = "".join((p.choices[0].delta.model_dump().get("reasoning_content") or "") for p in parts if p.choices)
    sc = "".join((p.choices[0].delta.content or "") for p in parts if p.choices)
    assert sr == reasoning and sc == (m["content"] or "")
    assert r.usage.completion_tokens_details.reasoning_tokens <= r.usage.completion_tokens


def test_structured_output_after_thinking(client):
    schema = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["x"]}
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x?"}], max_tokens=60,
                                       temperature=0, response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": schema}})
    assert isinstance(json.loads(r.choices[0].message.content)["x"], int)


def test_errors_fail_alone(srv, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="a", extra_body={"bogus": 1})
    assert e.value.body["param"] == "bogus"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="a", temperature="hot")
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="a")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tool_choice="required")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="a" * 6000)  # longer than --max-model-len
    status, err = error_of(raw(srv, "POST", "/v1/chat/completions", b'{"messages": [1,'))
    assert status == 400 and err["type"] == "invalid_request_error" and "JSON" in err["message"]
    status, err = error_of(raw(srv, "POST", "/v1/completions", b'"just a string"'))
    assert status == 400
    status, err = error_of(raw(srv, "POST", "/v1/completions", json.dumps({"prompt": "x" * (2 << 20)})))
    assert status == 413
    status, err = error_of(raw(srv, "DELETE", "/v1/completions"))
    assert status == 405
    status, err = error_of(raw(srv, "GET", "/v2/nothing"))
    assert status == 404
    assert client.completions.create(model="tiny", prompt="still up", max_tokens=2).choices[0].text is not None


def test_disconnect_mid_stream_frees_cache(srv):
    before = metrics(srv).get('deepinfer_request_finish_total{model_name="tiny",finished_reason="abort"}', 0)
    s = socket.create_connection((srv.host, srv.port))
    body = json.dumps({"prompt": "Once", "max_tokens": 900, "ignore_eos": True, "stream": True})
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    got = b""
    while b"data: " not in got:
        got += s.recv(4096)
    s.close()
    key = 'deepinfer_request_finish_total{model_name="tiny",finished_reason="abort"}'
    deadline = time.time() + 30
    while metrics(srv).get(key, 0) < before + 1 and time.time() < deadline:
        time.sleep(0.02)
    m = wait_idle(srv)
    assert m[key] == before + 1


def test_concurrent_streams_lose_nothing(srv):
    clients = int(os.environ.get("DEEPINFER_SERVER_LOAD_CLIENTS", "200" if os.environ.get("DEEPINFER_SERVER_LOAD") else "24"))
    r = load.run(srv.url, clients, max_tokens=int(os.environ.get("DEEPINFER_SERVER_LOAD_TOKENS", "16")))
    print(json.dumps(r))
    assert r["failed"] == 0, r["errors"]
    wait_idle(srv)
