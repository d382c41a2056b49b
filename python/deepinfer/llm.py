"""deepinfer.LLM: offline inference with a vLLM-shaped API over the C++ engine.

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="/path/to/DeepSeek-V4-Flash")       # or DEEPINFER_HF_MODEL_DIR, or the bundled default
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""
from __future__ import annotations

import collections
import numbers
import os
import sys
import threading
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Union

from . import _C
from ._checks import INT64, UINT64, as_bool, as_int, as_str, as_token_ids
from .outputs import RequestOutput, from_cpp
from .sampling_params import SamplingParams

_E = _C.engine

PromptType = Union[str, List[int], Dict[str, Any]]
_HERE = os.path.dirname(os.path.abspath(__file__))
# The bundled default model (a small trained DeepSeek-V4, assets/default-model): inside the package
# when it is installed with the model, else in the source tree the package is imported from.
_DEFAULT_MODEL_CANDIDATES = [os.path.join(_HERE, "default-model"),
                             os.path.normpath(os.path.join(_HERE, "..", "..", "assets", "default-model"))]


def _default_model() -> str:
    env = os.environ.get("DEEPINFER_HF_MODEL_DIR")
    if env:
        return env
    for c in _DEFAULT_MODEL_CANDIDATES:
        if os.path.exists(os.path.join(c, "config.json")):
            return c
    return _DEFAULT_MODEL_CANDIDATES[-1]  # the engine's error then names this folder


def _to_prompt(p: PromptType):
    """str | {"prompt": str} | {"prompt_token_ids": [...]} | list[int] -> _C PromptInput.
    Token ids must be ints (a float id is an error naming its position, not truncated)."""
    if isinstance(p, str):
        return _E.PromptInput.from_text(as_str("prompt", p))
    if isinstance(p, dict):
        unknown = set(p) - {"prompt", "prompt_token_ids", "multi_modal_data"}
        if unknown:
            raise ValueError(f"prompt dict has unknown key(s) {sorted(unknown)}")
        if "prompt_token_ids" in p:
            return _E.PromptInput.from_token_ids(as_token_ids("prompt_token_ids", p["prompt_token_ids"]))
        if "prompt" in p:
            return _E.PromptInput.from_text(as_str("prompt", p["prompt"]))
        raise ValueError("prompt dict needs 'prompt' or 'prompt_token_ids'")
    if _is_id_list(p):
        return _E.PromptInput.from_token_ids(as_token_ids("prompt_token_ids", p))
    raise ValueError(f"unsupported prompt type {type(p).__name__}")


def _is_id_list(p) -> bool:
    # Numbers of any kind: a float among them is then reported as a bad id, not as a prompt.
    return isinstance(p, (list, tuple)) and len(p) > 0 and all(
        isinstance(t, numbers.Number) and not isinstance(t, bool) for t in p)


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, (str, dict)) or _is_id_list(prompts)


class LLM:
    """An engine over one checkpoint. Keyword names follow vLLM's LLM where they exist.

    Thread-safe: generate(), chat(), stream() and the helpers may be called from several
    threads at once. The calls run concurrently and share the engine: its steps are serialised
    by one lock, and each step batches the requests of every caller. Ctrl-C during generate()
    aborts that call's requests before the next engine step and raises KeyboardInterrupt.
    Request ids never repeat within an LLM."""

    def __init__(self, model: Optional[str] = None, *, tokenizer: Optional[str] = None,
                 skip_tokenizer_init: bool = False, max_model_len: Optional[int] = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, enable_chunked_prefill: bool = True,
                 kv_cache_memory_bytes: Optional[int] = None, seed: int = 0, accelerator: Optional[str] = None,
                 max_n: int = 1024, max_logprobs: int = 20, enable_prefix_caching: bool = True,
                 prefix_checkpoint_blocks: int = -1, prefix_host_cache_bytes: int = 0, data_parallel_size: int = 1,
                 expert_parallel_size: int = 0, enable_eplb: bool = False, num_redundant_experts: int = 0,
                 eplb_window_size: int = 1000, eplb_step_interval: int = 3000,
                 context_parallel_size: int = 1, context_parallel_min_tokens: int = 512, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"LLM: unsupported argument(s) {sorted(kwargs)}")
        c = _E.LLMConfig()
        c.model = as_str("LLM.model", model or _default_model())
        c.tokenizer = as_str("LLM.tokenizer", tokenizer or "")
        c.skip_tokenizer_init = as_bool("LLM.skip_tokenizer_init", skip_tokenizer_init)
        c.max_model_len = 0 if max_model_len is None else as_int("LLM.max_model_len", max_model_len, *INT64)
        c.max_num_seqs = as_int("LLM.max_num_seqs", max_num_seqs, *INT64)
        c.max_num_batched_tokens = as_int("LLM.max_num_batched_tokens", max_num_batched_tokens, *INT64)
        c.enable_chunked_prefill = as_bool("LLM.enable_chunked_prefill", enable_chunked_prefill)
        c.kv_cache_memory_bytes = 0 if kv_cache_memory_bytes is None else as_int(
            "LLM.kv_cache_memory_bytes", kv_cache_memory_bytes, *UINT64)
        c.seed = as_int("LLM.seed", seed, *UINT64)
        c.max_n = as_int("LLM.max_n", max_n, 1)
        c.max_logprobs = as_int("LLM.max_logprobs", max_logprobs, 0)
        c.accelerator = as_str("LLM.accelerator", accelerator or "")
        c.enable_prefix_caching = as_bool("LLM.enable_prefix_caching", enable_prefix_caching)
        c.prefix_checkpoint_blocks = as_int("LLM.prefix_checkpoint_blocks", prefix_checkpoint_blocks, -1)
        c.prefix_host_cache_bytes = as_int("LLM.prefix_host_cache_bytes", prefix_host_cache_bytes, *UINT64)
        # Parallel ranks (docs/PARALLEL.md): this process is rank 0; the workers run this
        # package's _rank_worker module with the same interpreter and import path.
        c.data_parallel_size = as_int("LLM.data_parallel_size", data_parallel_size, 1, 1 << 20)
        c.expert_parallel_size = as_int("LLM.expert_parallel_size", expert_parallel_size, 0, 1 << 20)
        c.enable_eplb = as_bool("LLM.enable_eplb", enable_eplb)
        c.num_redundant_experts = as_int("LLM.num_redundant_experts", num_redundant_experts, 0)
        c.eplb_window_size = as_int("LLM.eplb_window_size", eplb_window_size, 1)
        c.eplb_step_interval = as_int("LLM.eplb_step_interval", eplb_step_interval, 1)
        c.context_parallel_size = as_int("LLM.context_parallel_size", context_parallel_size, 1, 1 << 20)
        c.context_parallel_min_tokens = as_int("LLM.context_parallel_min_tokens", context_parallel_min_tokens, 2, *INT64[1:])
        if (c.data_parallel_size > 1 or c.context_parallel_size > 1) and not os.environ.get("DEEPINFER_WORKER_COMMAND"):
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            c.worker_command = [sys.executable, "-c",
                                f"import sys; sys.path.insert(0, {root!r}); "
                                "from deepinfer._rank_worker import main; sys.exit(main())"]
        self.model = c.model
        self._llm = _E.LLM(c)
        # Streams share the engine's add_request/step queue: outputs are dealt out to the stream
        # that owns each request (several streams may run at once, nested or in threads).
        self._stream_lock = threading.Lock()
        self._stream_queues: Dict[str, Deque] = {}

    # ---- generation ----
    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True, stream: bool = False):
        """Runs every prompt to completion; outputs are in prompt order. A rejected request
        has ``error`` set and no outputs; the others are unaffected.

        With ``stream=True`` returns an iterator instead (see ``stream``): outputs arrive as
        the engine produces them, each carrying only its new text and tokens."""
        if _is_single_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        if stream:
            return self._stream(prompts, params)
        results: List[Optional[RequestOutput]] = [None] * len(prompts)
        ok_idx, ok_prompts, ok_params = [], [], []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                cp = _to_prompt(p)
                cparams = _params_to_cpp(sp)
            except (ValueError, TypeError) as e:
                results[i] = self._rejected(p, e)
                continue
            ok_prompts.append(cp)
            ok_params.append(cparams)
            ok_idx.append(i)
        if ok_prompts:
            outs = self._llm.generate(ok_prompts, ok_params, bool(use_tqdm))
            for i, o in zip(ok_idx, outs):
                results[i] = from_cpp(o, params[i].stop_token_ids or ())
        return results  # type: ignore[return-value]

    def stream(self, prompts: Union[PromptType, Sequence[PromptType]],
               sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None
               ) -> Iterator[RequestOutput]:
        """Same as ``generate(prompts, sampling_params, stream=True)``."""
        return self.generate(prompts, sampling_params, stream=True)

    def _rejected(self, p, e: Exception) -> RequestOutput:
        """The output of a request refused before it reached the engine (fresh, unique id)."""
        return RequestOutput(self._llm.reserve_request_id(), p if isinstance(p, str) else None, [], None, [], True,
                             None, f"{type(e).__name__}: {e}")

    def _stream(self, prompts: list, params: list) -> Iterator[RequestOutput]:
        """Yields delta RequestOutputs as each engine step produces them (requests interleave).

        Every output carries only what is new since the request's previous output: joining
        a request's ``outputs[i].text`` pieces gives exactly the text that ``generate`` returns,
        because text that could still turn into a stop string is held back until decided.
        The last output of a request has ``finished`` set. A rejected request yields one
        output with ``error`` set first. Closing the iterator early (or Ctrl-C) aborts what is
        left. Several streams, and generate() calls, may run at the same time."""
        live: Dict[str, SamplingParams] = {}
        queue: Deque = collections.deque()
        rejected: List[RequestOutput] = []
        try:
            for p, sp in zip(prompts, params):
                try:
                    cp = _params_to_cpp(sp)
                    if cp.output_kind != _E.OutputKind.FINAL_ONLY:
                        cp.output_kind = _E.OutputKind.DELTA
                    prompt = _to_prompt(p)
                    with self._stream_lock:
                        rid = self._llm.add_request(prompt, cp)
                        self._stream_queues[rid] = queue
                    live[rid] = sp
                except (ValueError, TypeError, _C.Error) as e:
                    rejected.append(self._rejected(p, e))
            yield from rejected
            while live:
                while not queue:  # a step may serve only other callers (or FINAL_ONLY requests)
                    self._pump()
                o = queue.popleft()
                sp = live[o.request_id]
                if o.finished:
                    del live[o.request_id]
                yield from_cpp(o, sp.stop_token_ids or ())
        finally:
            with self._stream_lock:
                for rid in live:  # early close (or an error): leave nothing behind in the engine
                    self._stream_queues.pop(rid, None)
                    self._llm.abort_request(rid)

    def _pump(self) -> None:
        """One engine step for the streams: each output goes to the queue of its stream."""
        with self._stream_lock:
            outs = self._llm.step()
            if not outs and self._stream_queues and not self._llm.has_unfinished():
                # A generate() call on another thread may have run the engine to its end between
                # our step() and has_unfinished() (two separate engine locks): the last outputs it
                # routed to the streams are waiting, and this step hands them over. No stream
                # request can be added meanwhile (we hold the stream lock), so after this one an
                # empty answer means a request really was lost.
                outs = self._llm.step()
            for o in outs:
                q = self._stream_queues.get(o.request_id)
                if q is None:
                    continue  # an aborted stream's last output
                if o.finished:
                    del self._stream_queues[o.request_id]
                q.append(o)
            if not outs and self._stream_queues and not self._llm.has_unfinished():
                lost = sorted(self._stream_queues)
                self._stream_queues.clear()
                raise RuntimeError(f"LLM.stream: request(s) {lost} left the engine without a final output")

    def chat(self, messages: Union[List[Dict[str, str]], List[List[Dict[str, str]]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, thinking: bool = False,
             chat_template_kwargs: Optional[Dict[str, Any]] = None, stream: bool = False):
        """Formats each conversation with the DeepSeek-V4 chat format and generates (or, with
        ``stream=True``, returns an iterator of delta outputs like ``generate``)."""
        if chat_template_kwargs:
            thinking = bool(chat_template_kwargs.get("thinking", thinking))
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.get_chat_prompt(c, add_generation_prompt, thinking) for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm, stream=stream)

    def get_chat_prompt(self, conversation: List[Dict[str, str]], add_generation_prompt: bool = True,
                        thinking: bool = False) -> str:
        conv = [_E.ChatMessage(str(m["role"]), str(m.get("content", ""))) for m in conversation]
        return self._llm.chat_prompt(conv, add_generation_prompt, thinking)

    # ---- helpers ----
    def encode(self, text: str) -> List[int]:
        return list(self._llm.encode(as_str("text", text)))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._llm.decode(as_token_ids("ids", ids), as_bool("skip_special_tokens", skip_special_tokens))

    @property
    def vocab_size(self) -> int:
        return self._llm.vocab_size()

    @property
    def max_model_len(self) -> int:
        return self._llm.max_model_len()

    def describe(self) -> str:
        return self._llm.describe()

    def last_summary(self):
        """Totals of the last generate()/chat() call (requests, tokens, TTFT, TPOT, tokens/s)."""
        return self._llm.last_summary()

    # ---- per-op device time (what `deepinfer bench-flash --breakdown` prints) ----
    def set_op_profiling(self, on: bool) -> None:
        """While on, every step runs eagerly (no CUDA graph replay) and each model op is timed on
        the device; outputs are unchanged. The CPU backend records nothing."""
        self._llm.set_op_profiling(as_bool("on", on))

    def take_op_profile(self) -> List[dict]:
        """Per-op sums since profiling was turned on or last taken, largest first:
        [{"op": name, "calls": n, "ms": device ms}]."""
        return [{"op": o.op, "calls": o.calls, "ms": o.ms} for o in self._llm.take_op_profile()]


def _params_to_cpp(sp):
    if not isinstance(sp, SamplingParams):
        raise TypeError(f"sampling_params entries must be SamplingParams, got {type(sp).__name__}")
    return sp.to_cpp()
