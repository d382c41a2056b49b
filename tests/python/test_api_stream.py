"""Streaming (LLM.generate(..., stream=True) / LLM.stream) on the built-in toy model."""
from collections import defaultdict

import pytest

from deepinfer import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM("builtin:toy", max_num_batched_tokens=64)


def _collect(stream):
    """request prompt -> (streamed text pieces, token pieces, outputs in order)."""
    got = defaultdict(lambda: ([], [], []))
    for o in stream:
        texts, toks, outs = got[o.prompt]
        assert not (outs and outs[-1].finished), "output after the final one"
        if o.outputs:
            texts.append(o.outputs[0].text)
            toks.append(list(o.outputs[0].token_ids))
        outs.append(o)
    return got


def test_stream_pieces_concatenate_to_final(llm):
    prompts = ["Hello", "abc", "a longer prompt"]
    sp = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
    final = {o.prompt: o for o in llm.generate(prompts, sp, use_tqdm=False)}
    got = _collect(llm.generate(prompts, sp, stream=True))
    assert set(got) == set(prompts)
    for p in prompts:
        texts, toks, outs = got[p]
        assert len(outs) > 5, "expected many pieces, one per step"
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
        assert "".join(texts) == final[p].outputs[0].text
        assert sum(toks, []) == final[p].outputs[0].token_ids
    assert not llm._llm.has_unfinished()


def test_stream_holds_back_partial_stop_strings(llm):
    base = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)[0]
    text = base.outputs[0].text
    stop = text[20:24]  # completes somewhere after its first character appeared
    cut = text.find(stop)
    # A stop whose first three characters occur (then fail): that text must be held back while
    # undecided, and released afterwards.
    decoy = text[4:7] + "\x7f"
    assert decoy not in text
    sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop=[decoy, stop])
    want = llm.generate("Hi", sp, use_tqdm=False)[0].outputs[0]
    assert want.text == text[:cut] and want.stop_reason == stop
    streamed = ""
    for o in llm.stream("Hi", sp):
        c = o.outputs[0]
        streamed += c.text
        assert want.text.startswith(streamed), "streamed text that the final output does not contain"
    assert streamed == want.text
    assert c.finish_reason == "stop" and c.stop_reason == stop


def test_stream_hold_back_is_visible_step_by_step(llm):
    base = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)[0]
    text, ids = base.outputs[0].text, base.outputs[0].token_ids
    decoy = text[4:7] + "\x7f"
    sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop=[decoy])
    streamed, ntok, lag = "", 0, []
    for o in llm.stream("Hi", sp):
        c = o.outputs[0]
        streamed += c.text
        ntok += len(c.token_ids)
        lag.append(len(llm.decode(ids[:ntok])) - len(streamed))  # decoded but not yet sent
    assert streamed == text
    assert max(lag) >= 1 and lag[-1] == 0, lag


def test_stream_rejects_bad_request_alone_and_early_close_aborts(llm):
    sp = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    it = llm.generate(["ok", ""], [sp, sp], stream=True)
    first = next(it)
    assert first.error is not None and "empty" in first.error
    nxt = next(it)
    assert nxt.prompt == "ok" and not nxt.finished
    it.close()  # consumer stops early: the running request is aborted
    assert not llm._llm.has_unfinished()
    again = llm.generate("ok", sp, use_tqdm=False)[0]
    assert len(again.outputs[0].token_ids) == 30


def test_stream_chat(llm):
    sp = SamplingParams(temperature=0, max_tokens=12)
    conv = [{"role": "user", "content": "hi"}]
    whole = llm.chat(conv, sp, use_tqdm=False)[0].outputs[0].text
    assert "".join(o.outputs[0].text for o in llm.chat(conv, sp, stream=True)) == whole


class _RacedEngine:
    """Stands in for the bound engine at the moment the race left it in: another thread's
    generate() ran the engine to its end between a stream's step() and has_unfinished(), so the
    stream's final output already waits in its inbox and the engine has nothing unfinished."""

    def __init__(self, pending):
        self.pending = list(pending)
        self.steps = 0

    def step(self):
        self.steps += 1
        if self.steps == 1:
            return []  # our step came just before the other caller routed the output
        out, self.pending = self.pending, []
        return out

    def has_unfinished(self):
        return False


class _Out:
    def __init__(self, rid, finished):
        self.request_id, self.finished = rid, finished


def _pump_with(engine, queues):
    import threading
    llm = object.__new__(LLM)  # only the attributes _pump reads
    llm._llm, llm._stream_lock, llm._stream_queues = engine, threading.RLock(), queues
    llm._pump()


def test_pump_takes_outputs_another_callers_step_routed_after_its_own():
    from collections import deque
    q = deque()
    _pump_with(_RacedEngine([_Out("7", True)]), {"7": q})
    assert [o.request_id for o in q] == ["7"] and q[0].finished


def test_pump_still_names_a_request_that_really_left_without_output():
    from collections import deque
    with pytest.raises(RuntimeError, match=r"\['7'\] left the engine without a final output"):
        _pump_with(_RacedEngine([]), {"7": deque()})
