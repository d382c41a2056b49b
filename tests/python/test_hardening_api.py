"""Issue #20 through the Python API: every bad request named and refused alone (the others in
the batch finish normally), no silent coercion, valid UTF-8 errors, thread safety, Ctrl-C,
aborts, unique request ids. Inputs that could crash the process run in a subprocess."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from deepinfer import LLM, SamplingParams
from deepinfer import _C

GOOD = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("builtin:toy", max_num_batched_tokens=64)


def _reference(llm, prompt="Hello"):
    return llm.generate([prompt], GOOD, use_tqdm=False)[0].outputs[0].token_ids


def _batch_with(llm, bad_params, prompt="Hello"):
    """[good, bad, good]: returns the bad output after checking the good ones are unaffected."""
    ref = _reference(llm, prompt)
    outs = llm.generate([prompt, prompt, prompt], [GOOD, bad_params, GOOD], use_tqdm=False)
    for i in (0, 2):
        assert outs[i].error is None, outs[i].error
        assert outs[i].finished and outs[i].outputs[0].token_ids == ref
    return outs[1]


# ---- no silent coercion -------------------------------------------------------------------

@pytest.mark.parametrize("field,value,needle", [
    ("max_tokens", 8.0, "SamplingParams.max_tokens must be an integer, got float 8.0"),
    ("max_tokens", 2 ** 40, "SamplingParams.max_tokens=1099511627776 is outside"),
    ("seed", 2 ** 64, "SamplingParams.seed=18446744073709551616 is outside [0, 18446744073709551615]"),
    ("seed", -1, "SamplingParams.seed=-1 is outside"),
    ("seed", 1.5, "SamplingParams.seed must be an integer"),
    ("n", True, "SamplingParams.n must be an integer, got bool"),
    ("stop_token_ids", [3, 4.0], "SamplingParams.stop_token_ids[1] must be an integer, got float"),
    ("stop_token_ids", [2 ** 40], "SamplingParams.stop_token_ids[0]=1099511627776 is outside"),
    ("logit_bias", {2.5: 1.0}, "SamplingParams.logit_bias key must be an integer"),
    ("logit_bias", {3: "big"}, "SamplingParams.logit_bias[3] must be a number, got str"),
    ("temperature", "0.5", "SamplingParams.temperature must be a number, got str"),
    ("ignore_eos", "no", "SamplingParams.ignore_eos must be a bool, got str"),
    ("stop", ["ok", 5], "SamplingParams.stop[1] must be a str, got int"),
])
def test_wrong_types_are_named_errors_and_fail_alone(llm, field, value, needle):
    kw = dict(temperature=0, max_tokens=8)
    kw[field] = value
    bad = _batch_with(llm, SamplingParams(**kw))
    assert bad.error and needle in bad.error, bad.error
    assert bad.finished and bad.outputs == []


def test_float_and_huge_prompt_ids(llm):
    outs = llm.generate([{"prompt_token_ids": [0, 40, 41.9]}, [0, 40, 2 ** 40], "Hello"], GOOD, use_tqdm=False)
    assert "prompt_token_ids[2] must be an integer, got float 41.9" in outs[0].error
    assert "prompt_token_ids[2]=1099511627776 is outside" in outs[1].error
    assert outs[2].error is None and outs[2].outputs[0].token_ids == _reference(llm)
    with pytest.raises(ValueError, match=r"ids\[0\]=1099511627776 is outside"):
        llm.decode([2 ** 40])
    with pytest.raises(ValueError, match=r"ids\[1\] must be an integer, got float"):
        llm.decode([65, 66.0])


def test_llm_config_values_are_not_coerced():
    with pytest.raises(ValueError, match=r"LLM.seed=18446744073709551616 is outside"):
        LLM("builtin:toy", seed=2 ** 64)
    with pytest.raises(ValueError, match=r"LLM.max_num_seqs must be an integer, got float"):
        LLM("builtin:toy", max_num_seqs=4.5)


# ---- requests that cannot be satisfied ----------------------------------------------------

def test_min_tokens_above_the_room_left(llm):
    t0 = time.time()
    bad = _batch_with(llm, SamplingParams(min_tokens=10 ** 9, max_tokens=None))
    assert "SamplingParams.min_tokens=1000000000 is more than the room left for output" in bad.error, bad.error
    assert time.time() - t0 < 30


def test_n_and_logprobs_past_configured_maxima():
    llm = LLM("builtin:toy", max_n=2, max_logprobs=3)
    assert "SamplingParams.n: 3 is above this LLM's max_n=2" in _batch_with(llm, SamplingParams(n=3)).error
    assert "SamplingParams.logprobs: 4 is above this LLM's max_logprobs=3" in _batch_with(
        llm, SamplingParams(logprobs=4)).error
    assert "prompt_logprobs: 5 is above" in _batch_with(llm, SamplingParams(prompt_logprobs=5)).error
    ok = llm.generate(["Hello"], SamplingParams(n=2, logprobs=3, max_tokens=2), use_tqdm=False)[0]
    assert ok.error is None and len(ok.outputs) == 2


def test_so_args_nested_too_deep_is_refused_in_python(llm):
    deep = {}
    for _ in range(100000):
        deep = {"properties": {"a": deep}, "type": "object"}
    bad = _batch_with(llm, SamplingParams(max_tokens=4, so_args={"json": deep}))
    assert "so_args.json: JSON nested deeper than 256 levels" in bad.error, bad.error
    enum = [0]
    for _ in range(100000):
        enum = [enum]
    bad = _batch_with(llm, SamplingParams(max_tokens=4, so_args={"json": {"enum": enum}}))
    assert "nested deeper than 256 levels" in bad.error, bad.error
    bad = _batch_with(llm, SamplingParams(max_tokens=4, so_args={"choice": ["a", 1]}))
    assert "so_args.choice[1] must be a str, got int" in bad.error
    bad = _batch_with(llm, SamplingParams(max_tokens=4, so_args={"regex": "a\ud800"}))
    assert "so_args.regex is not valid text" in bad.error
    # fuzz_so_args: a number overflow used to escape the compiler untyped and fail the whole call.
    bad = _batch_with(llm, SamplingParams(max_tokens=4, so_args={"json": "1e999"}))
    assert bad.error


# ---- error messages are valid UTF-8 -------------------------------------------------------

def test_grammar_errors_with_non_ascii_keep_the_batch(llm):
    for so in ({"ebnf": "root ::= é"}, {"regex": "(?é)a"}):
        bad = _batch_with(llm, SamplingParams(max_tokens=4, so_args=so))
        assert bad.error, so
        bad.error.encode("utf-8")  # a str at all means the conversion did not fail


# ---- request ids, aborts, nesting -----------------------------------------------------------

def test_request_ids_never_repeat(llm):
    ids = []
    for _ in range(3):
        outs = llm.generate(["Hello", {"bad": 1}, [0, 1.5]], GOOD, use_tqdm=False)
        ids += [o.request_id for o in outs]
    ids += sorted({o.request_id for o in llm.stream(["x", {"bad": 1}], GOOD)})  # deltas repeat their id
    assert len(ids) == len(set(ids)) == 11, ids


def test_abort_from_another_thread_finishes_the_request(llm):
    long = SamplingParams(temperature=0, max_tokens=llm.max_model_len - 8, ignore_eos=True)
    result = {}
    base = int(llm._llm.reserve_request_id())  # ids are sequential: run()'s first request is base + 1
    # 64 long requests keep the toy model busy for about a second; the first is aborted early.
    prompts, params = ["Hello"] + ["abc"] + ["filler"] * 62, [long, GOOD] + [long] * 62
    t = threading.Thread(target=lambda: result.setdefault("outs", llm.generate(prompts, params, use_tqdm=False)))
    t.start()
    time.sleep(0.2)
    llm._llm.abort_request(str(base + 1))
    t.join(120)
    assert not t.is_alive()
    first, second = result["outs"][:2]
    assert first.request_id == str(base + 1)
    assert first.finished, "an aborted request must come back finished"
    assert first.outputs[0].finish_reason == "abort", first.outputs[0].finish_reason
    assert 0 < len(first.outputs[0].token_ids) < long.max_tokens
    assert second.error is None and second.outputs[0].token_ids == _reference(llm, "abc")
    assert not llm._llm.has_unfinished()


def test_generate_inside_a_stream_loop(llm):
    ref = _reference(llm, "nested")
    seen = 0
    for o in llm.stream(["outer one", "outer two"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)):
        seen += 1
        if seen in (2, 5):
            inner = llm.generate(["nested"], GOOD, use_tqdm=False)[0]
            assert inner.error is None and inner.outputs[0].token_ids == ref
    assert seen > 4
    assert not llm._llm.has_unfinished()


def test_two_streams_interleaved(llm):
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    a, b = llm.stream(["aaa"], sp), llm.stream(["bbb"], sp)
    got = {"aaa": [], "bbb": []}
    for x, y in zip(a, b):
        got[x.prompt] += x.outputs[0].token_ids
        got[y.prompt] += y.outputs[0].token_ids
    for rest in (a, b):
        for o in rest:
            got[o.prompt] += o.outputs[0].token_ids
    for p in got:
        assert got[p] == llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids


# ---- threads ------------------------------------------------------------------------------

def test_concurrent_generate_from_threads_matches_sequential(llm):
    prompts = [f"prompt {i}" for i in range(6)]
    sp = SamplingParams(temperature=0.8, seed=7, max_tokens=24, ignore_eos=True)
    want = {p: llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids for p in prompts}
    got, errors = {}, []

    def worker(ps):
        try:
            for _ in range(3):
                for o in llm.generate(ps, sp, use_tqdm=False):
                    got.setdefault(o.prompt, []).append(o.outputs[0].token_ids)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(prompts[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for p in prompts:
        assert got[p] == [want[p]] * 3, p


# ---- Ctrl-C -------------------------------------------------------------------------------

def test_keyboard_interrupt_cancels_generate_promptly():
    script = textwrap.dedent("""
        import os, signal, threading, time, sys
        # A process started in the background of a non-interactive shell (nohup ./.ci/run &) inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler: install it, as a terminal would have.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from deepinfer import LLM, SamplingParams
        llm = LLM("builtin:toy", max_num_batched_tokens=64)
        sp = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
        # SIGINT aimed at the main thread (the one in generate()): under TSan (tools/sanitizers.sh tsan-py) a
        # process-wide kill() can be queued on the timer thread, which exits first (both interrupt tests once
        # ran to the end uninterrupted there, under load)
        # The delay is measured from the moment the signal is sent, and generation goes on until it comes
        # (a late timer thread, or a fast machine, must not let the batch finish first).
        main = threading.main_thread().ident
        sent = []
        def fire():
            sent.append(time.time())
            signal.pthread_kill(main, signal.SIGINT)
        threading.Timer(1.0, fire).start()
        t0 = time.time()
        try:
            while time.time() - t0 < 120:
                llm.generate(["Hello"] * 1024, sp, use_tqdm=False)  # about 20 s of work on the toy model
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("INTERRUPTED after %.2f s" % (time.time() - sent[0]))
        assert not llm._llm.has_unfinished(), "requests left behind"
        out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
        print("AFTER", out.error, len(out.outputs[0].token_ids))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "INTERRUPTED after" in r.stdout, r.stdout + r.stderr
    took = float(r.stdout.split("INTERRUPTED after ")[1].split()[0])
    # from the signal: at most one engine step; the limit includes the 1 s timer (a sanitizer run,
    # tools/sanitizers.sh tsan-py, is slower)
    assert took < float(os.environ.get("DEEPINFER_INTERRUPT_LIMIT_S", "3.0")) - 1.0, r.stdout
    assert "AFTER None 4" in r.stdout


# ---- inputs that may crash a process: run in a subprocess ---------------------------------

CRASH_PROBE = textwrap.dedent("""
    import json, sys
    from deepinfer import LLM, SamplingParams
    llm = LLM("builtin:toy", max_num_batched_tokens=64)
    good = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    so = json.loads(sys.argv[1])
    kind, n = so["kind"], so["n"]
    if kind == "regex_groups":
        spec = {"regex": "(" * n + "a" + ")" * n}
    elif kind == "json_text_enum":
        spec = {"json": '{"enum": [' + "[" * n + "0" + "]" * n + ']}'}
    elif kind == "json_text_objects":
        s = '{"type": "string"}'
        for _ in range(n):
            s = '{"type": "object", "properties": {"a": ' + s + '}, "required": ["a"]}'
        spec = {"json": s}
    elif kind == "ebnf_chain":
        rules = ["root ::= r0"] + ["r%d ::= r%d" % (i, i + 1) for i in range(n)] + ['r%d ::= "a"' % n]
        spec = {"ebnf": "\\n".join(rules)}
    outs = llm.generate(["Hello", "Hello", "Hello"],
                        [good, SamplingParams(temperature=0, max_tokens=6, so_args=spec), good], use_tqdm=False)
    ok = outs[0].error is None and outs[2].error is None and outs[0].outputs[0].token_ids == outs[2].outputs[0].token_ids
    print(json.dumps({"ok": ok, "error": outs[1].error, "text": outs[1].outputs[0].text if outs[1].outputs else None}))
""")


# Still crashing or hanging in src/structured (the structured-outputs helper's part of issue #20,
# in progress): skipped unless DEEPINFER_STRUCTURED_PROBES=1. Remove an entry once it is fixed.
KNOWN_STRUCTURED_FAILURES: dict = {}
# Legal but deep (compile time used to double per level): accepted within the budget now.
LEGAL_DEEP = {("json_text_objects", 30), ("json_text_objects", 100)}


@pytest.mark.parametrize("kind,n", [("regex_groups", 100000), ("json_text_enum", 100000),
                                    ("json_text_objects", 10000), ("json_text_objects", 30),
                                    ("json_text_objects", 100),
                                    ("ebnf_chain", 100000)])
def test_structured_inputs_that_used_to_crash_or_hang(kind, n):
    """These exercise src/structured (another helper's code): a named error within the budget,
    the process alive and the other requests of the batch unaffected."""
    known = KNOWN_STRUCTURED_FAILURES.get((kind, n))
    if known and not os.environ.get("DEEPINFER_STRUCTURED_PROBES"):
        pytest.skip(f"known failure in src/structured ({known}); DEEPINFER_STRUCTURED_PROBES=1 runs it")
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, "-c", CRASH_PROBE, json.dumps({"kind": kind, "n": n})],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind} n={n}: still running after 60 s")
    assert r.returncode == 0, f"{kind} n={n}: process died (rc {r.returncode}): {r.stderr[-2000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ok"], res
    if (kind, n) in LEGAL_DEEP:
        assert res["error"] is None and res["text"].startswith("{"), res
        assert time.time() - t0 < 30, f"{kind} n={n}: {time.time() - t0:.1f} s"
    else:
        assert res["error"], f"{kind} n={n}: accepted without an error ({time.time() - t0:.1f} s)"
