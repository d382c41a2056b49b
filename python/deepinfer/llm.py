"""deepinfer.LLM: offline inference with a vLLM-shaped API over the C++ engine.

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="/path/to/DeepSeek-V4-Flash")       # or DEEPINFER_HF_MODEL_DIR, or models/default
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _C
from .outputs import RequestOutput, from_cpp
from .sampling_params import SamplingParams

_E = _C.engine

PromptType = Union[str, List[int], Dict[str, Any]]
_DEFAULT_MODEL = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "models", "default"))


def _default_model() -> str:
    env = os.environ.get("DEEPINFER_HF_MODEL_DIR")
    if env:
        return env
    return _DEFAULT_MODEL


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
                 use_tqdm: bool = True) -> List[RequestOutput]:
        """Runs every prompt to completion; outputs are in prompt order. A rejected request
        has ``error`` set and no outputs; the others are unaffected."""
        if _is_single_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
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

    def chat(self, messages: Union[List[Dict[str, str]], List[List[Dict[str, str]]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, thinking: bool = False,
             chat_template_kwargs: Optional[Dict[str, Any]] = None) -> List[RequestOutput]:
        """Formats each conversation with the DeepSeek-V4 chat format and generates."""
        if chat_template_kwargs:
            thinking = bool(chat_template_kwargs.get("thinking", thinking))
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.get_chat_prompt(c, add_generation_prompt, thinking) for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm)

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
