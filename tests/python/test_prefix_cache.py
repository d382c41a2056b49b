"""Prefix caching through the Python API (issue #16), on the built-in toy model (16-token blocks)."""
import pytest

from deepinfer import LLM, SamplingParams


def _run(enable, prompts, **kw):
    llm = LLM("builtin:toy", enable_prefix_caching=enable, **kw)
    sp = SamplingParams(temperature=0.7, top_k=20, seed=3, max_tokens=12, ignore_eos=True, logprobs=1)
    outs = [llm.generate({"prompt_token_ids": p}, sp, use_tqdm=False)[0] for p in prompts]  # one at a time
    return outs, llm.last_summary()


def test_hits_are_reported_and_exact():
    shared = [0] + [2 + (7 * i) % 250 for i in range(1, 40)]
    prompts = [shared + [60, 61, 62], shared + [70, 71], shared]
    off, _ = _run(False, prompts)
    on, summary = _run(True, prompts)
    for a, b in zip(off, on):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].cumulative_logprob == b.outputs[0].cumulative_logprob
    assert [o.num_cached_tokens for o in off] == [0, 0, 0]
    assert [o.num_cached_tokens for o in on] == [0, 32, 32]  # the last full block before the last token
    assert summary.num_cached_tokens == 32 and summary.prefix_hit_rate == pytest.approx(32 / 40)
    assert summary.num_checkpoints > 0 and summary.checkpoint_bytes > 0
    assert "hit rate" in str(summary)


def test_host_tier_and_knobs():
    llm = LLM("builtin:toy", prefix_checkpoint_blocks=0, prefix_host_cache_bytes=1 << 16)
    out = llm.generate([{"prompt_token_ids": list(range(2, 40))}] * 2, SamplingParams(max_tokens=2), use_tqdm=False)
    assert out[0].num_cached_tokens == 0
    with pytest.raises(Exception, match="prefix_checkpoint_blocks"):
        LLM("builtin:toy", prefix_checkpoint_blocks=-2)
