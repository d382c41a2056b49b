"""Issue #20, threads through the Python bindings: several Python threads drive one LLM at once
(the bindings release the GIL, so the C++ engine really runs them concurrently) mixing
generate(), stream() closed early, abort_request() and the tokenizer calls; Ctrl-C in the main
thread while other threads generate. Every output must equal the request run alone.

tools/sanitizers.sh tsan-py runs this file (and the thread tests of test_hardening_api.py)
against a TSan build of the extension."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from deepinfer import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, seed=11, max_tokens=10, ignore_eos=True)
REGEX = SamplingParams(temperature=0, max_tokens=10, so_args={"regex": "[a-f]{3,8}"})
# Greedy, seeded and grammar-constrained requests on the toy model (prompt, params).
SPECS = [(f"thread prompt {i}", (GREEDY, SEEDED, REGEX)[i % 3]) for i in range(9)]


@pytest.fixture(scope="module")
def llm():
    return LLM("builtin:toy", max_num_batched_tokens=64)


def _alone(llm):
    return {p: llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids for p, sp in SPECS}


def test_generate_stream_abort_and_tokenizer_from_threads(llm):
    want = _alone(llm)
    got, streamed, errors = {}, [], []
    long = SamplingParams(temperature=0, max_tokens=llm.max_model_len - 8, ignore_eos=True)

    def guard(fn):
        def run():
            try:
                fn()
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(repr(e))
        return run

    def generator(k):
        for _ in range(3):
            mine = SPECS[k::2]
            outs = llm.generate([p for p, _ in mine], [sp for _, sp in mine], use_tqdm=False)
            for o in outs:
                assert o.error is None, o.error
                got.setdefault(o.prompt, []).append(o.outputs[0].token_ids)

    def streamer():
        # Closed after a few outputs: the rest of its requests are aborted from this thread.
        for _ in range(3):
            it = llm.stream(["stream a", "stream b"], long)
            for i, o in enumerate(it):
                streamed.append(o.request_id)
                if i == 4:
                    break
            it.close()

    def aborter():
        # A streamed request aborted from this thread while another thread iterates its stream:
        # the stream ends with a finished output whose reason is "abort".
        for _ in range(3):
            seen, reasons = threading.Event(), []
            box = {}

            def consume():
                for o in llm.stream(["abort me"], long):
                    box["id"] = o.request_id
                    seen.set()
                    if o.finished:
                        reasons.append(o.outputs[0].finish_reason)
            t = threading.Thread(target=guard(consume))
            t.start()
            assert seen.wait(120)
            llm._llm.abort_request(box["id"])
            t.join(120)
            assert not t.is_alive() and reasons == ["abort"], reasons

    def tokenizer():
        for i in range(200):
            ids = llm.encode(f"text {i} for the codec")
            assert llm.decode(ids) == f"text {i} for the codec"

    threads = [threading.Thread(target=guard(f)) for f in
               (lambda: generator(0), lambda: generator(1), streamer, aborter, tokenizer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    for p, _ in SPECS:
        assert got[p] == [want[p]] * 3, p
    assert streamed
    _engine_empty(llm)


def _engine_empty(llm):
    """Nothing left but, at most, the step that async scheduling launched before the last
    request's stop (a grammar end here) was seen: one more step collects it and reports nothing."""
    if llm._llm.has_unfinished():
        assert llm._llm.step() == []
    assert not llm._llm.has_unfinished()


def test_ctrl_c_in_the_main_thread_while_other_threads_generate():
    script = textwrap.dedent("""
        import os, signal, threading, time
        # A process started in the background of a non-interactive shell (nohup ./.ci/run &) inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler: install it, as a terminal would have.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from deepinfer import LLM, SamplingParams
        llm = LLM("builtin:toy", max_num_batched_tokens=64)
        sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        want = llm.generate(["side"], sp, use_tqdm=False)[0].outputs[0].token_ids
        bad = []
        stop = False
        def side():  # keeps generating until the main thread was interrupted: the engine lock is contended
            while not stop:
                o = llm.generate(["side"] * 4, sp, use_tqdm=False)
                bad.extend(x for x in o if x.outputs[0].token_ids != want)
        workers = [threading.Thread(target=side) for _ in range(2)]
        for w in workers:
            w.start()
        # SIGINT aimed at the main thread (the one in generate()): under TSan (tools/sanitizers.sh tsan-py) a
        # process-wide kill() can be queued on the timer thread, which exits first (both interrupt tests once
        # ran to the end uninterrupted there, under load)
        # The delay is measured from the moment the signal is sent, and the main thread keeps generating
        # until it comes: on an idle machine the toy model can finish a batch before a 1 s timer fires
        # (CI once printed NOT INTERRUPTED and took the KeyboardInterrupt at interpreter shutdown).
        main = threading.main_thread().ident
        sent = []
        def fire():
            sent.append(time.time())
            signal.pthread_kill(main, signal.SIGINT)
        threading.Timer(1.0, fire).start()
        long = SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True)
        t0 = time.time()
        try:
            while time.time() - t0 < 120:
                llm.generate(["Hello"] * 256, long, use_tqdm=False)
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("INTERRUPTED after %.2f s" % (time.time() - sent[0]))
        stop = True
        for w in workers:
            w.join(300)
        print("SIDE", len(bad), "alive" if any(w.is_alive() for w in workers) else "joined")
        print("LEFT", llm._llm.has_unfinished())
    """)
    # A sanitizer run (tools/sanitizers.sh tsan-py) is several times slower: its limit is wider.
    limit = float(os.environ.get("DEEPINFER_INTERRUPT_LIMIT_S", "1.0"))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "INTERRUPTED after" in r.stdout, r.stdout + r.stderr
    took = float(r.stdout.split("INTERRUPTED after ")[1].split()[0])
    # from the signal. The engine lock is first come, first served (core/fair_mutex.h), so with two
    # other threads generating the main thread waits at most one step of each: <= 0.01 s in 14 runs
    # (session 16, 2 cores); with std::mutex a thread that unlocked and relocked at once kept winning
    # and the delay reached 1.4-2.45 s.
    assert took < limit, r.stdout
    assert "SIDE 0 joined" in r.stdout, r.stdout  # the other threads' requests were not touched
    assert "LEFT False" in r.stdout, r.stdout
