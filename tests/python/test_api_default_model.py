"""The random test model (models/random, `deepinfer make-random-model`) end to end: its embedding
has more rows (129,280) than the tokenizer has tokens (128,815), as real DeepSeek checkpoints do."""
import os

import pytest

from deepinfer import LLM, SamplingParams

DEFAULT = os.path.join(os.path.dirname(__file__), "..", "..", "models", "random")


@pytest.fixture(scope="module")
def llm():
    if not os.path.exists(os.path.join(DEFAULT, "config.json")):
        pytest.skip("models/random absent (./build.sh or `deepinfer make-random-model`)")
    return LLM(DEFAULT)


def test_padding_ids_decode_to_nothing_and_do_not_fail(llm):
    pad_id = 129000  # past the tokenizer, inside the model's vocabulary
    forced = SamplingParams(temperature=0, max_tokens=4, logit_bias={pad_id: 100.0})
    plain = SamplingParams(temperature=0, max_tokens=4)
    outs = llm.generate(["Hello", "Hello"], [forced, plain])
    assert outs[0].error is None, outs[0].error
    assert outs[0].outputs[0].token_ids == [pad_id] * 4
    assert outs[0].outputs[0].text == ""
    assert outs[1].error is None and len(outs[1].outputs[0].token_ids) == 4
