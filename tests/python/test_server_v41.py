"""The DeepSeek-V4.1 chat format through `deepinfer serve` (#17), with a V4.1-vocabulary
tokenizer: models/random (DeepSeek's 129,280-id BPE, random weights; ./build.sh makes it) with
the special tokens V4 / V4.1 add at their ids (<think> 128821, </think> 128822, ｜DSML｜ 128825,
<｜deepseek_image｜> 129264; <｜System｜>'s id is not in the spec, an unused one stands in) and
`--chat-format v41`. No V4.1 tokenizer ships anywhere (the v41_* golden fixtures have 256/320-id
vocabularies and no tokenizer files), hence this one. Prompts are compared as token ids
(return_token_ids) with the hand-written V4.1 prompts, written as ids (the rules of shared/docs/MODEL-DEEPSEEK-V41.md
§8, as tests/cpp/model_v41/chat_v41_test.cc), and a forced tool call comes back parsed from V4.1's
DSML."""
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANDOM = ROOT / "models" / "random"
openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")
spec = importlib.util.spec_from_file_location("deepinfer_serve", ROOT / "python" / "deepinfer" / "serve.py")
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)

BOS = "<｜begin▁of▁sentence｜>"
EFFORT = " (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
V41_TOKENS = {128821: "<think>", 128822: "</think>", 128825: "｜DSML｜", 128830: "<｜System｜>", 129264: "<｜deepseek_image｜>"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if not (RANDOM / "tokenizer.json").exists():
        pytest.skip("models/random absent (./build.sh makes it)")
    d = tmp_path_factory.mktemp("v41model")
    for f in RANDOM.iterdir():
        if f.suffix == ".safetensors" or f.name in ("config.json", "model.safetensors.index.json", "tokenizer_config.json"):
            (d / f.name).symlink_to(f)
    tj = json.loads((RANDOM / "tokenizer.json").read_text(encoding="utf-8"))
    taken = {t["id"] for t in tj["added_tokens"]}
    assert not taken & set(V41_TOKENS), "the V4.1 ids are taken in this vocabulary"
    for i, text in V41_TOKENS.items():
        tj["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": True})
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def tok(model_dir):
    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def client(model_dir):
    try:
        serve.find_executable()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    env = dict(os.environ, DEEPINFER_USE_NEXTN_DECODE="0")
    s = serve.launch(["--model", str(model_dir), "--served-model-name", "v41", "--chat-format", "v41",
                      "--max-model-len", "1024"], env=env)
    yield openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=120)
    assert s.stop() == 0, "".join(s.log)


def prompt_ids(client, **kw):
    r = client.chat.completions.create(model="v41", max_tokens=2, temperature=0, extra_body={"return_token_ids": True, **kw.pop("extra", {})}, **kw)
    return r.model_extra["prompt_token_ids"], r


MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]


# Special ids (V4 §8.2 / V41 §8; <｜System｜> the stand-in).
BOS_ID, EOS_ID, USER, ASSISTANT, THINK, END_THINK, SYSTEM = 0, 1, 128803, 128804, 128821, 128822, 128830


def test_v41_prompts_are_the_hand_written_ones(client, tok):
    # The expected prompts, written as ids: special tokens by id, text through HF tokenizers (no
    # special token in it). (HF renumbers added tokens that leave gaps in the id space, so it cannot
    # encode the special tokens of this file itself; deepinfer keeps the file's ids, as it must.)
    def want(*parts):
        out = []
        for p in parts:
            out += [p] if isinstance(p, int) else tok.encode(p, add_special_tokens=False).ids
        return out

    ids, _ = prompt_ids(client, messages=MSGS)
    assert ids == want(BOS_ID, SYSTEM, "You are terse.", USER, "Hi", ASSISTANT, END_THINK)
    ids, _ = prompt_ids(client, messages=MSGS, reasoning_effort="low")
    assert ids == want(BOS_ID, SYSTEM, "Reasoning Effort: 50" + EFFORT + "You are terse.", USER, "Hi", ASSISTANT, THINK)
    ids, _ = prompt_ids(client, messages=MSGS, extra={"chat_template_kwargs": {"thinking": True}})
    assert ids == want(BOS_ID, SYSTEM, "Reasoning Effort: 75" + EFFORT + "You are terse.", USER, "Hi", ASSISTANT, THINK)
    # A mid-conversation system message is a user turn in V4.1.
    multi = MSGS + [{"role": "assistant", "content": "Hello."}, {"role": "system", "content": "Be brief."}]
    ids, _ = prompt_ids(client, messages=multi)
    assert ids == want(BOS_ID, SYSTEM, "You are terse.", USER, "Hi", ASSISTANT, END_THINK, "Hello.", EOS_ID,
                       SYSTEM, "Be brief.", ASSISTANT, END_THINK)
    with pytest.raises(openai.BadRequestError) as e:
        prompt_ids(client, messages=MSGS, reasoning_effort="extreme")
    assert e.value.body["param"] in ("messages", "reasoning_effort"), e.value.body


def test_v41_forced_tool_call_is_parsed(client):
    tool = {"type": "function", "function": {"name": "set_flag", "description": "Set a flag",
            "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
    r = client.chat.completions.create(model="v41", messages=[{"role": "user", "content": "Turn it on"}], tools=[tool],
                                       tool_choice={"type": "function", "function": {"name": "set_flag"}},
                                       max_tokens=64, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", (c.finish_reason, c.message)
    assert len(c.message.tool_calls) == 1 and c.message.tool_calls[0].function.name == "set_flag"
    args = json.loads(c.message.tool_calls[0].function.arguments)
    assert set(args) == {"on"} and isinstance(args["on"], bool)
    assert "DSML" not in (c.message.content or "")
