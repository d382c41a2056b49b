"""Structured outputs through the Python API on the random test model (models/random:
tiny random DeepSeek-V4 weights with the real DeepSeek tokenizer), greedy."""
import json
import os
import re

import pytest

from deepinfer import LLM, SamplingParams

DEFAULT = os.path.join(os.path.dirname(__file__), "..", "..", "models", "random")
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "ok": {"type": "boolean"},
                                           "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["id", "ok", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm():
    if not os.path.exists(os.path.join(DEFAULT, "config.json")):
        pytest.skip("models/random absent (./build.sh or `deepinfer make-random-model`)")
    return LLM(DEFAULT)


def _greedy(so, n=48):
    return SamplingParams(temperature=0, max_tokens=n, so_args=so)


def _skip_without_grammar(out):
    if out.error and "grammar module" in out.error:
        pytest.skip(out.error)


def test_regex_and_json_schema_greedy(llm):
    outs = llm.generate(["The code is", "Give me JSON:"],
                        [_greedy({"regex": "[0-9]{3}-[a-z]{2}"}), _greedy({"json": SCHEMA}, 64)], use_tqdm=False)
    _skip_without_grammar(outs[0])
    a, b = outs[0].outputs[0], outs[1].outputs[0]
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", a.text), a.text
    assert a.finish_reason == "stop"
    obj = json.loads(b.text)
    assert set(obj) == {"id", "ok", "tag"} and b.finish_reason == "stop", b.text
    # JSON Schema counts 302.0 as an integer (zero fraction), and the grammar allows that form.
    assert isinstance(obj["id"], (int, float)) and float(obj["id"]).is_integer() and 0 <= obj["id"] <= 999
    assert isinstance(obj["ok"], bool)
    assert obj["tag"] in ("red", "green", "blue")
    # Unconstrained, the same model says something else entirely.
    free = llm.generate("The code is", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert not re.fullmatch(r"[0-9]{3}-[a-z]{2}", free.text)


def test_bad_specs_rejected_alone(llm):
    good = _greedy({"regex": "[a-c]{4}"})
    outs = llm.generate(["one", "two", "three", "four"],
                        [good, SamplingParams(so_args={"regexp": "a"}), _greedy({"regex": "[0-9"}), good],
                        use_tqdm=False)
    _skip_without_grammar(outs[0])
    assert "so_args" in outs[1].error and "regexp" in outs[1].error
    assert outs[2].error and "regex" in outs[2].error.lower(), outs[2].error
    for o in (outs[0], outs[3]):
        assert o.error is None and re.fullmatch(r"[a-c]{4}", o.outputs[0].text), o.outputs[0].text


def test_deepinfer_so_args_names(llm):
    """so_args as DeepInfer spells them (json_schema, ebnf) mean the same as vLLM's (json, grammar)."""
    outs = llm.generate(["a", "b", "a"], [_greedy({"json_schema": SCHEMA}), _greedy({"ebnf": 'root ::= "yes" | "no"'}),
                                          _greedy({"json": SCHEMA})])
    _skip_without_grammar(outs[0])
    assert outs[0].error is None and outs[1].error is None
    assert outs[0].outputs[0].text == outs[2].outputs[0].text
    assert json.loads(outs[0].outputs[0].text)["tag"] in ("red", "green", "blue")
    assert outs[1].outputs[0].text in ("yes", "no")
