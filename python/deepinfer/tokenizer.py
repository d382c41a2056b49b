"""deepinfer.Tokenizer: byte-level BPE identical to Hugging Face `tokenizers` (C++ core), streaming
detokenization, and chat templates: the DeepSeek-V4 format natively, or the Jinja `chat_template`
that a tokenizer_config.json ships (rendered with jinja2 the way transformers does).
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional, Sequence

from . import _C
from ._checks import as_int, as_token_ids

__all__ = ["Tokenizer", "DecodeStream"]

TokenizerError = _C.TokenizerError


class DecodeStream:
    """Feed ids one at a time; step() returns text once it is complete UTF-8 (maybe '').
    The concatenation of all step() results and finish() equals Tokenizer.decode(ids)."""

    def __init__(self, tokenizer: "Tokenizer", skip_special_tokens: bool = False):
        self._native = _C.DecodeStream(tokenizer._native, skip_special_tokens)

    def step(self, token_id: int) -> str:
        return self._native.step(as_int("token_id", token_id))

    def finish(self) -> str:
        return self._native.finish()

    def reset(self) -> None:
        self._native.reset()


def _to_native_message(i: int, m: dict) -> "_C.Message":
    if not isinstance(m, dict) or "role" not in m:
        raise ValueError(f"messages[{i}] must be a dict with a 'role'")
    out = _C.Message()
    out.role = m["role"]
    content = m.get("content")
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    out.content = content or ""
    if m.get("reasoning_content") is not None:
        out.reasoning_content = m["reasoning_content"]
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function", c)
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(_C.ToolCall(fn["name"], args, c.get("id", "") or ""))
    out.tool_calls = calls
    out.tool_call_id = m.get("tool_call_id", "") or ""
    if m.get("tools"):
        out.tools_json = json.dumps(m["tools"], ensure_ascii=False)
    if m.get("response_format"):
        out.response_format_json = json.dumps(m["response_format"], ensure_ascii=False)
    return out


class Tokenizer:
    """Load with Tokenizer.from_file(path): a tokenizer.json (tokenizer_config.json beside it is
    read for bos/eos, add_bos_token and chat_template), a folder, or GPT-2 encoder.json + vocab.bpe."""

    def __init__(self, native: "_C.Tokenizer", config: Optional[dict] = None):
        self._native = native
        self.config = config or {}
        self.chat_template: Optional[str] = self.config.get("chat_template") if isinstance(
            self.config.get("chat_template"), str) else None

    @classmethod
    def from_file(cls, path: str) -> "Tokenizer":
        native = _C.Tokenizer.from_file(str(path))
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        cfg_path = os.path.join(folder, "tokenizer_config.json")
        config = None
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                config = json.load(f)
        return cls(native, config)

    # ---- encode / decode ----
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._native.encode(text, add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False, num_threads: int = 0) -> list[list[int]]:
        return self._native.encode_batch(list(texts), add_special_tokens, num_threads)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._native.decode(as_token_ids("ids", ids), skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = False) -> DecodeStream:
        return DecodeStream(self, skip_special_tokens)

    # ---- vocabulary ----
    def token_to_id(self, token: str) -> Optional[int]:
        return self._native.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self._native.id_to_token(as_int("token_id", token_id))

    def token_bytes(self, token_id: int) -> bytes:
        return self._native.token_bytes(as_int("token_id", token_id))

    def is_special(self, token_id: int) -> bool:
        return self._native.is_special(as_int("token_id", token_id))

    @property
    def vocab_size(self) -> int:
        return self._native.vocab_size

    @property
    def special_ids(self) -> list[int]:
        return self._native.special_ids

    @property
    def bos_id(self) -> Optional[int]:
        return self._native.bos_id

    @property
    def eos_id(self) -> Optional[int]:
        return self._native.eos_id

    # ---- chat ----
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, thinking: bool = False,
                            reasoning_effort: Optional[str] = None, tools: Optional[list] = None,
                            tokenize: bool = False, chat_format: str = "dsv4", drop_thinking: bool = True,
                            **template_kwargs: Any):
        """Prompt text (or ids with tokenize=True) for `messages` (OpenAI-style dicts).

        chat_format: "dsv4" (default) is the DeepSeek-V4 encoder (§8.2): system / developer / user /
        assistant (reasoning_content, tool_calls in DSML) / tool turns, thinking or chat mode,
        reasoning_effort "high" | "max". "jinja" renders the tokenizer_config.json chat_template with
        jinja2; "auto" picks "jinja" when the config ships a template, else "dsv4".
        `tools` (OpenAI tool list) is attached to the first system message (one is added if needed).
        """
        if chat_format == "auto":
            chat_format = "jinja" if self.chat_template else "dsv4"
        if chat_format == "jinja":
            text = self._render_jinja(messages, add_generation_prompt, tools, thinking=thinking, **template_kwargs)
        elif chat_format == "dsv4":
            msgs = [dict(m) for m in messages]
            if tools:
                sys_idx = next((i for i, m in enumerate(msgs) if m.get("role") == "system"), None)
                if sys_idx is None:
                    msgs.insert(0, {"role": "system", "content": ""})
                    sys_idx = 0
                msgs[sys_idx]["tools"] = tools
            native = [_to_native_message(i, m) for i, m in enumerate(msgs)]
            text = self._native.apply_chat_template(native, add_generation_prompt, thinking, reasoning_effort or "",
                                                    drop_thinking, True)
        else:
            raise ValueError(f"chat_format must be 'dsv4', 'jinja' or 'auto', not {chat_format!r}")
        return self.encode(text) if tokenize else text

    def _render_jinja(self, messages, add_generation_prompt, tools, **kwargs) -> str:
        if not self.chat_template:
            raise ValueError("chat_format='jinja' but tokenizer_config.json has no chat_template")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
        env.globals["raise_exception"] = raise_exception

        def token_text(key):
            v = self.config.get(key)
            return v.get("content") if isinstance(v, dict) else v

        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
            bos_token=token_text("bos_token") or "", eos_token=token_text("eos_token") or "", **kwargs)
