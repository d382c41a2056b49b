"""Python API over the engine, on the built-in toy model (deterministic, byte-level text)."""
import math

import numpy as np
import pytest

import deepinfer
from deepinfer import LLM, SamplingParams
from deepinfer._C import engine as E


@pytest.fixture(scope="module")
def llm():
    return LLM("builtin:toy", max_num_batched_tokens=64)


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


def test_greedy_matches_reference_argmax_chain(llm):
    prompt = [0, 40, 41, 42, 43, 44]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0]
    toks = list(prompt)
    for _ in range(64):
        toks.append(int(np.argmax(E.toy_reference_logits(toks)[-1])))
    assert out.outputs[0].token_ids == toks[len(prompt):]
    assert out.outputs[0].finish_reason == "length"


def test_text_and_token_prompts_and_batch_invariance(llm):
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True)
    prompts = ["Hello", {"prompt": "abc"}, {"prompt_token_ids": [0, 70, 71]}, [0, 80, 81, 82]]
    batched = llm.generate(prompts, sp)
    for p, b in zip(prompts, batched):
        alone = llm.generate([p], sp)[0]
        assert alone.outputs[0].token_ids == b.outputs[0].token_ids
    assert batched[0].prompt == "Hello"
    assert batched[0].prompt_token_ids == llm.encode("Hello")


def test_seeded_sampling_repeats_and_n_independent(llm):
    sp = SamplingParams(temperature=1.0, seed=5, max_tokens=16, n=3)
    a = llm.generate("xyz", sp)[0]
    b = llm.generate("xyz", sp)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    one = llm.generate("xyz", SamplingParams(temperature=1.0, seed=5, max_tokens=16))[0]
    assert one.outputs[0].token_ids == a.outputs[0].token_ids
    assert len({tuple(o.token_ids) for o in a.outputs}) == 3


def test_chi_square_over_many_seeded_draws(llm):
    prompt = [0, 50, 51]
    k, temp, draws = 6, 0.7, 3000
    logits = np.asarray(E.toy_reference_logits(prompt)[-1], dtype=np.float64) / temp
    top = np.argsort(-logits, kind="stable")[:k]
    p = np.exp(logits[top] - logits[top].max())
    p /= p.sum()
    params = [SamplingParams(temperature=temp, top_k=k, seed=1000 + i, max_tokens=1) for i in range(draws)]
    outs = llm.generate([{"prompt_token_ids": prompt}] * draws, params, use_tqdm=False)
    counts = {int(t): 0 for t in top}
    for o in outs:
        t = o.outputs[0].token_ids[0]
        assert t in counts, "a token outside the top-k was drawn"
        counts[t] += 1
    obs = np.array([counts[int(t)] for t in top], dtype=np.float64)
    chi2 = float(((obs - draws * p) ** 2 / (draws * p)).sum())
    assert chi2 < 20.5, (chi2, obs, draws * p)  # 5 dof, p = 0.001


def test_logprobs_and_prompt_logprobs_match_direct_computation(llm):
    prompt = [0, 60, 61, 62, 63, 64, 65]
    out = llm.generate({"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.5, seed=3, max_tokens=8, logprobs=2, prompt_logprobs=1,
                                      ignore_eos=True))[0]
    c = out.outputs[0]
    ref = E.toy_reference_logits(prompt + c.token_ids)
    assert out.prompt_logprobs[0] is None
    for i in range(1, len(prompt)):
        lp = _log_softmax(ref[i - 1])
        assert out.prompt_logprobs[i][prompt[i]].logprob == pytest.approx(lp[prompt[i]], abs=1e-5)
    total = 0.0
    for j, t in enumerate(c.token_ids):
        lp = _log_softmax(ref[len(prompt) - 1 + j])
        d = c.logprobs[j]
        assert list(d)[0] == t
        assert d[t].logprob == pytest.approx(lp[t], abs=1e-5)
        assert d[t].rank == 1 + int((lp > lp[t]).sum())
        best = int(np.argmax(lp))
        assert best in d and d[best].rank == 1
        total += lp[t]
    assert c.cumulative_logprob == pytest.approx(total, abs=1e-4)


def test_stop_strings_and_stop_token_ids(llm):
    base = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    stop = base.text[12:14]
    cut = base.text.find(stop)
    o = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert o.text == base.text[:cut] and o.finish_reason == "stop" and o.stop_reason == stop
    t = base.token_ids[5]
    first = base.token_ids.index(t)
    o = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[t]))[0].outputs[0]
    assert o.token_ids == base.token_ids[:first + 1] and o.stop_reason == t


def test_bad_requests_rejected_alone(llm):
    good = SamplingParams(temperature=0, max_tokens=4)
    prompts = ["ok", "", {"prompt_token_ids": [5] * 5000}, "ok2", "ok3", "ok4", {"bogus": 1}]
    params = [good, good, good, SamplingParams(temperature=-1.0), SamplingParams(so_args={"nonsense": "x"}),
              SamplingParams(top_p=0.0), good]
    outs = llm.generate(prompts, params)
    assert outs[0].error is None and len(outs[0].outputs[0].token_ids) == 4
    assert "empty" in outs[1].error
    assert "max_model_len" in outs[2].error
    assert "temperature" in outs[3].error
    assert "so_args" in outs[4].error and "nonsense" in outs[4].error
    assert "top_p" in outs[5].error
    assert "bogus" in outs[6].error


def test_skip_tokenizer_init_serves_token_ids():
    llm = LLM("builtin:toy", skip_tokenizer_init=True)
    o = llm.generate({"prompt_token_ids": [0, 9, 10]}, SamplingParams(temperature=0, max_tokens=5, detokenize=False))[0]
    assert len(o.outputs[0].token_ids) == 5 and o.outputs[0].text == ""
    assert "tokenizer" in llm.generate("text", SamplingParams())[0].error


def test_chat_uses_v4_format(llm):
    prompt = llm.get_chat_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}])
    assert prompt == "S<｜User｜>hi<｜Assistant｜></think>"
    outs = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=3))
    assert len(outs[0].outputs[0].token_ids) == 3


def test_summary_and_exports(llm):
    llm.generate(["a", "b"], SamplingParams(max_tokens=4, seed=1))
    s = llm.last_summary()
    assert s.num_requests == 2 and s.num_output_tokens > 0 and s.output_tokens_per_s > 0
    for name in ("LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "StructuredOutputsParams"):
        assert hasattr(deepinfer, name)


def test_op_profiling_changes_nothing_and_reports_a_list(llm):
    # The toy/CPU backends time no ops (the CUDA backend does: GpuEngine.OpProfiling* in the C++
    # suite); turning profiling on must leave the outputs as they were and take_op_profile() must
    # return a (here empty) list of {"op", "calls", "ms"} records, largest first.
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    before = llm.generate([[0, 50, 51]], sp)[0].outputs[0].token_ids
    llm.set_op_profiling(True)
    try:
        during = llm.generate([[0, 50, 51]], sp)[0].outputs[0].token_ids
        prof = llm.take_op_profile()
    finally:
        llm.set_op_profiling(False)
    assert during == before
    assert isinstance(prof, list)
    assert all(set(p) == {"op", "calls", "ms"} for p in prof)
    assert [p["ms"] for p in prof] == sorted((p["ms"] for p in prof), reverse=True)
    with pytest.raises(ValueError, match="on must be a bool"):
        llm.set_op_profiling("yes")
