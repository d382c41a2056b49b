"""deepinfer.LLM: offline inference with a vLLM-shaped API over the C++ engine.

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="/path/to/DeepSeek-V4-Flash")       # or DEEPINFER_HF_MODEL_DIR, or the bundled default
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _C
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
    """str | {"prompt": str} | {"prompt_token_ids": [...]} | list[int] -> _C PromptInput."""
    if isinstance(p, str):
        return _E.PromptInput.from_text(p)
    if isinstance(p, dict):
        unknown = set(p) - {"prompt", "prompt_token_ids", "multi_modal_data"}
        if unknown:
            raise ValueError(f"prompt dict has unknown key(s) {sorted(unknown)}")
        if "prompt_token_ids" in p:
            return _E.PromptInput.from_token_ids([int(t) for t in p["prompt_token_ids"]])
        if "prompt" in p:
            return _E.PromptInput.from_text(str(p["prompt"]))
        raise ValueError("prompt dict needs 'prompt' or 'prompt_token_ids'")
    if isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
        return _E.PromptInput.from_token_ids([int(t) for t in p])
    raise ValueError(f"unsupported prompt type {type(p).__name__}")


def _is_single_prompt(prompts) -> bool:
    return isinstance(prompts, (str, dict)) or (
        isinstance(prompts, (list, tuple)) and len(prompts) > 0 and all(isinstance(t, int) for t in prompts))


class LLM:
    """An engine over one checkpoint. Keyword names follow vLLM's LLM where they exist."""

    def __init__(self, model: Optional[str] = None, *, tokenizer: Optional[str] = None,
                 skip_tokenizer_init: bool = False, max_model_len: Optional[int] = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, enable_chunked_prefill: bool = True,
                 kv_cache_memory_bytes: Optional[int] = None, seed: int = 0, accelerator: Optional[str] = None,
                 **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"LLM: unsupported argument(s) {sorted(kwargs)}")
        c = _E.LLMConfig()
        c.model = model or _default_model()
        c.tokenizer = tokenizer or ""
        c.skip_tokenizer_init = skip_tokenizer_init
        c.max_model_len = int(max_model_len or 0)
        c.max_num_seqs = int(max_num_seqs)
        c.max_num_batched_tokens = int(max_num_batched_tokens)
        c.enable_chunked_prefill = bool(enable_chunked_prefill)
        c.kv_cache_memory_bytes = int(kv_cache_memory_bytes or 0)
        c.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        c.accelerator = accelerator or ""
        self.model = c.model
        self._llm = _E.LLM(c)

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
                ok_prompts.append(_to_prompt(p))
                ok_params.append(sp.to_cpp())
                ok_idx.append(i)
            except (ValueError, TypeError) as e:
                if len(ok_prompts) > len(ok_params):
                    ok_prompts.pop()
                results[i] = RequestOutput(f"rejected-{i}", p if isinstance(p, str) else None, [], None, [], True,
                                           None, f"{type(e).__name__}: {e}")
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

    def _stream(self, prompts: list, params: list) -> Iterator[RequestOutput]:
        """Yields delta RequestOutputs as each engine step produces them (requests interleave).

        Every output carries only what is new since the request's previous output: joining
        a request's ``outputs[i].text`` pieces gives exactly the text that ``generate`` returns,
        because text that could still turn into a stop string is held back until decided.
        The last output of a request has ``finished`` set. A rejected request yields one
        output with ``error`` set first. Closing the iterator early aborts what is left."""
        if self._llm.has_unfinished():
            raise RuntimeError("LLM.stream: another stream on this LLM is still running")
        live: Dict[str, SamplingParams] = {}
        rejected: List[RequestOutput] = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params)):
                try:
                    cp = sp.to_cpp()
                    if cp.output_kind != _E.OutputKind.FINAL_ONLY:
                        cp.output_kind = _E.OutputKind.DELTA
                    live[self._llm.add_request(_to_prompt(p), cp)] = sp
                except (ValueError, TypeError, _C.Error) as e:
                    name = type(e).__name__
                    rejected.append(RequestOutput(f"rejected-{i}", p if isinstance(p, str) else None, [], None, [],
                                                  True, None, f"{name}: {e}"))
            yield from rejected
            while self._llm.has_unfinished():
                for o in self._llm.step():
                    sp = live.get(o.request_id)
                    if sp is None:
                        continue
                    if o.finished:
                        del live[o.request_id]
                    yield from_cpp(o, sp.stop_token_ids or ())
        finally:
            for rid in live:  # early close (or an error): leave nothing behind in the engine
                self._llm.abort_request(rid)

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
        return list(self._llm.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._llm.decode([int(t) for t in ids], skip_special_tokens)

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
