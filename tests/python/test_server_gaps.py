"""#17's remaining request fields on a real `deepinfer serve` (the bundled default model): best_of
(best_of candidates, the n with the highest cumulative logprob returned, as vLLM; not streamed),
suffix refused naming the field (no fill-in-the-middle format in DeepSeek-V4; vLLM refuses it
too), return_token_ids (vLLM's: prompt_token_ids and per-choice token_ids), checked against the
hand-written V4 chat prompt. The V4.1 format through the server: test_server_v41.py."""
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "assets" / "default-model"
openai = pytest.importorskip("openai")
spec = importlib.util.spec_from_file_location("deepinfer_serve", ROOT / "python" / "deepinfer" / "serve.py")
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)


@pytest.fixture(scope="module")
def client():
    try:
        serve.find_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    env = dict(os.environ, DEEPINFER_USE_NEXTN_DECODE="0")  # as test_server.py (engine bug noted there)
    s = serve.launch(["--model", str(MODEL), "--served-model-name", "tiny", "--max-model-len", "512"], env=env)
    yield openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=120)
    assert s.stop() == 0, "".join(s.log)


def test_best_of_returns_the_n_most_likely_candidates(client):
    args = dict(model="tiny", prompt="The quick brown", max_tokens=6, temperature=1.0, seed=11)
    # The same engine request (4 seeded samples, their logprobs) seen whole: the reference ranking.
    every = client.completions.create(n=4, logprobs=0, **args)
    assert len(every.choices) == 4
    score = [sum(c.logprobs.token_logprobs) for c in every.choices]
    assert len(set(round(s, 6) for s in score)) > 1, "candidates too alike to test the ranking"
    ranked = sorted(range(4), key=lambda i: -score[i])
    best = client.completions.create(n=2, best_of=4, **args)
    assert [c.text for c in best.choices] == [every.choices[i].text for i in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)  # not asked for
    assert best.usage.completion_tokens == sum(len(every.choices[i].logprobs.tokens) for i in ranked[:2])
    one = client.completions.create(best_of=4, **args)  # n defaults to 1
    assert [c.text for c in one.choices] == [every.choices[ranked[0]].text]


def test_best_of_refusals_name_the_field(client):
    for extra in (dict(n=3, best_of=2), dict(best_of=2, stream=True)):
        with pytest.raises(openai.BadRequestError) as e:
            r = client.completions.create(model="tiny", prompt="a", max_tokens=2, **extra)
            list(r) if extra.get("stream") else None
        assert e.value.body["param"] == "best_of", e.value.body


def test_suffix_is_refused(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="def f(", suffix="    return x", max_tokens=2)
    assert e.value.body["param"] == "suffix"
    assert "fill-in-the-middle" in e.value.body["message"]
    # An empty suffix asks for nothing: accepted.
    assert client.completions.create(model="tiny", prompt="def f(", suffix="", max_tokens=2).choices


def test_return_token_ids_chat_and_completions(client):
    tok = pytest.importorskip("tokenizers").Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                       extra_body={"return_token_ids": True})
    want = tok.encode("<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi<｜Assistant｜></think>", add_special_tokens=False).ids
    assert r.model_extra["prompt_token_ids"] == want
    ids = r.choices[0].model_extra["token_ids"]
    assert len(ids) == r.usage.completion_tokens and 0 < len(ids) <= 4
    c = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=3, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert c.choices[0].model_extra["prompt_token_ids"] == [5, 6, 7]
    assert len(c.choices[0].model_extra["token_ids"]) == c.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as e:
        list(client.chat.completions.create(model="tiny", messages=msgs, stream=True, extra_body={"return_token_ids": True}))
    assert e.value.body["param"] == "return_token_ids"
