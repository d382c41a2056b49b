"""DeepInfer's so_args spellings through SamplingParams: {"schema_type", "schema"} and
trigger_token_ids / bound_token_id (free text until the trigger, then the grammar), on the
built-in toy model with logit_bias forcing the free-phase tokens."""
import re

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer.sampling_params import StructuredOutputsParams


def tok(ch):  # the toy codec: 2 + byte
    return 2 + ord(ch)


def test_schema_type_forms_map_to_fields():
    p = StructuredOutputsParams.from_any({"schema_type": "json", "schema": {"type": "integer"}})
    assert p.json == {"type": "integer"}
    assert StructuredOutputsParams.from_any({"schema_type": "regex", "schema": "a+"}).regex == "a+"
    assert StructuredOutputsParams.from_any({"schema_type": "ebnf", "schema": "root ::= \"a\""}).grammar
    t = StructuredOutputsParams.from_any({"regex": "a", "trigger_token_ids": [5, 6], "bound_token_id": 0})
    c = t.to_cpp()
    assert list(c.trigger_token_ids) == [5, 6] and c.bound_token_id == 0
    for bad in ({"schema_type": "xml", "schema": "a"}, {"schema_type": "regex"},
                {"regex": "a", "bound_token_ids": [1]}):
        with pytest.raises(ValueError):
            StructuredOutputsParams.from_any(bad)
    for bad in ({"regex": "a", "bound_token_id": 3}, {"regex": "a", "trigger_token_ids": [-1]},
                {"regex": "a", "trigger_token_ids": [1], "bound_token_id": [2]}):
        with pytest.raises(ValueError):
            StructuredOutputsParams.from_any(bad).to_cpp()


def test_trigger_and_bound_generate():
    llm = LLM("builtin:toy")
    free = SamplingParams(temperature=0, max_tokens=16, logit_bias={tok("#"): 100.0},
                          so_args={"schema_type": "regex", "schema": "[0-9]{3}", "trigger_token_ids": [tok("#")]})
    bound = SamplingParams(temperature=0, max_tokens=16, logit_bias={tok("@"): 100.0},
                           so_args={"schema_type": "regex", "schema": "[0-9]{3}",
                                    "trigger_token_ids": [tok("#"), tok("!")], "bound_token_id": tok("@")})
    outs = llm.generate(["abc", "abc"], [free, bound], use_tqdm=False)
    if outs[0].error and "grammar module" in outs[0].error:
        pytest.skip(outs[0].error)
    assert re.fullmatch(r"#[0-9]{3}", outs[0].outputs[0].text), outs[0].outputs[0].text
    assert re.fullmatch(r"@#![0-9]{3}", outs[1].outputs[0].text), outs[1].outputs[0].text


def test_so_check_deep_so_args_is_an_error_not_a_crash(tmp_path):
    import json
    import subprocess

    from test_structured_regex import cli
    exe = cli()
    if not exe:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    deep = "[" * 100000 + "]" * 100000
    line = json.dumps({"input": "1", "so_args": {"json_schema": {"enum": [1]}, "x": None}}).replace("null", deep)
    p = tmp_path / "deep.jsonl"
    p.write_text(line + "\n" + json.dumps({"input": "1", "so_args": {"regex": "1"}}) + "\n")
    out = subprocess.run([exe, "so-check", "--tokenizer", "bytes", "--inputs", str(p)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    assert "nests deeper than 512 levels" in rows[0]["error"]
    assert rows[1]["accepted"] is True


def test_tool_calls_generate_on_default_model():
    """so_args.tool_calls through LLM.generate on the bundled model (its tokenizer has the DSML
    token): a named function in V4 tags, greedy, parameters an enum and a boolean (the tiny model
    was never trained on DSML: free-text values would run to max_tokens); then "auto" with the
    DSML token forced by logit_bias: the grammar writes the rest of the block."""
    import re as _re
    llm = LLM()
    dsml = llm.encode("｜DSML｜")[len(llm.encode("")):]  # encode may put BOS first
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "hourly": {"type": "boolean"}},
        "required": ["city", "hourly"]}}}]
    named = SamplingParams(temperature=0, max_tokens=600, skip_special_tokens=False,
                           so_args={"tool_calls": {"format": "v4", "tools": tools, "function": "get_weather"}})
    bad = SamplingParams(temperature=0, max_tokens=8, so_args={"tool_calls": {"format": "v9", "tools": tools}})
    prompt = "<｜User｜>Weather in Paris?<｜Assistant｜></think>"
    outs = llm.generate([prompt, prompt], [named, bad], use_tqdm=False)
    if outs[0].error and "grammar module" in outs[0].error:
        pytest.skip(outs[0].error)
    m = "｜DSML｜"
    text = outs[0].outputs[0].text
    want = (rf"\n{{0,2}}<{m}tool_calls>\n<{m}invoke name=\"get_weather\">\n<{m}parameter name=\"city\" string=\"true\">"
            rf"(Paris|Oslo)</{m}parameter>\n<{m}parameter name=\"hourly\" string=\"false\">\s*(true|false)\s*"
            rf"</{m}parameter>\n\n?</{m}invoke>\n</{m}tool_calls>(<｜end▁of▁sentence｜>)?")  # skip_special_tokens off
    assert _re.fullmatch(want, text), text
    assert "so_args.tool_calls.format" in outs[1].error
    assert len(dsml) == 1, dsml
    auto = SamplingParams(temperature=0, max_tokens=600, skip_special_tokens=False, logit_bias={dsml[0]: 100.0},
                          so_args={"tool_calls": {"format": "v4", "tools": tools, "mode": "auto", "parallel": False}})
    (o,) = llm.generate([prompt], auto, use_tqdm=False)
    assert _re.fullmatch(want.replace(rf"\n{{0,2}}<{m}tool_calls", f"{m}tool_calls"), o.outputs[0].text), o.outputs[0].text
