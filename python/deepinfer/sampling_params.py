"""SamplingParams and StructuredOutputsParams, shaped like vLLM's.

Values are checked when a request is submitted (not here), so that one bad request in a
``generate`` call is rejected alone with a clear error while the others complete.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from . import _C

_E = _C.engine


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


_SO_ALIASES = {"json_schema": "json", "ebnf": "grammar"}


_SCHEMA_TYPES = {"json": "json", "regex": "regex", "ebnf": "grammar"}


@dataclass
class StructuredOutputsParams:
    """Exactly one of json (schema: dict or JSON text), regex, choice, grammar, json_object.

    DeepInfer's own so_args forms are accepted too: {"schema_type": "json" | "regex" | "ebnf",
    "schema": ...}, and the names json_schema (= json) and ebnf (= grammar). trigger_token_ids:
    tokens are free until this sequence has appeared, then the constraint applies;
    bound_token_id (needs trigger_token_ids): once generated, the rest of the trigger is forced."""
    json: Optional[Union[str, Dict[str, Any]]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    trigger_token_ids: Optional[List[int]] = None
    bound_token_id: Optional[int] = None

    @classmethod
    def from_any(cls, value: Any) -> "StructuredOutputsParams":
        if isinstance(value, StructuredOutputsParams):
            return value
        if isinstance(value, dict):
            value = dict(value)
            if "bound_token_ids" in value:
                raise ValueError("so_args: bound_token_ids is not supported; use bound_token_id (one integer)")
            if "schema_type" in value or "schema" in value:
                st = value.pop("schema_type", None)
                if st not in _SCHEMA_TYPES:
                    raise ValueError(f"so_args: schema_type must be one of {sorted(_SCHEMA_TYPES)}, got {st!r}")
                if "schema" not in value:
                    raise ValueError("so_args: schema_type needs schema")
                value[_SCHEMA_TYPES[st]] = value.pop("schema")
            value = {_SO_ALIASES.get(k, k): v for k, v in value.items()}
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ValueError(f"so_args: unknown key(s) {unknown}; expected one of "
                                 f"{sorted(names | set(_SO_ALIASES))}")
            return cls(**value)
        raise ValueError(f"so_args must be a dict or StructuredOutputsParams, got {type(value).__name__}")

    def to_cpp(self):
        import json as _json
        s = _E.StructuredOutputsParams()
        if self.json is not None:
            s.json = self.json if isinstance(self.json, str) else _json.dumps(self.json)
        if self.regex is not None:
            s.regex = self.regex
        if self.choice is not None:
            s.choice = [str(c) for c in self.choice]
        if self.grammar is not None:
            s.grammar = self.grammar
        s.json_object = bool(self.json_object)
        trig = self.trigger_token_ids or []
        if not isinstance(trig, (list, tuple)) or any(type(t) is not int or t < 0 for t in trig):
            raise ValueError("so_args: trigger_token_ids must be a list of non-negative integers")
        s.trigger_token_ids = [int(t) for t in trig]
        if self.bound_token_id is not None:
            if type(self.bound_token_id) is not int or self.bound_token_id < 0:
                raise ValueError("so_args: bound_token_id must be a non-negative integer")
            if not trig:
                raise ValueError("so_args: bound_token_id requires non-empty trigger_token_ids")
            s.bound_token_id = int(self.bound_token_id)
        return s


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True
    logit_bias: Optional[Dict[int, float]] = None
    so_args: Optional[Union[Dict[str, Any], StructuredOutputsParams]] = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    seq_seed: Optional[int] = None  # alias of seed

    # vLLM spells it structured_outputs; accept both.
    @property
    def structured_outputs(self):
        return self.so_args

    def to_cpp(self):
        """The C++ SamplingParams; raises ValueError for values of the wrong type or shape."""
        p = _E.SamplingParams()
        try:
            p.n = int(self.n)
            p.temperature = float(self.temperature)
            p.top_p = float(self.top_p)
            p.top_k = int(self.top_k) if self.top_k is not None else 0
            p.min_p = float(self.min_p)
            p.presence_penalty = float(self.presence_penalty)
            p.frequency_penalty = float(self.frequency_penalty)
            p.repetition_penalty = float(self.repetition_penalty)
            seed = self.seed if self.seed is not None else self.seq_seed
            if seed is not None:
                if int(seed) < 0:
                    raise ValueError(f"SamplingParams.seed must be >= 0, got {seed}")
                p.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
            p.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
            p.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
            p.ignore_eos = bool(self.ignore_eos)
            p.max_tokens = None if self.max_tokens is None else int(self.max_tokens)
            p.min_tokens = int(self.min_tokens)
            p.logprobs = None if self.logprobs is None else int(self.logprobs)
            p.prompt_logprobs = None if self.prompt_logprobs is None else int(self.prompt_logprobs)
            p.include_stop_str_in_output = bool(self.include_stop_str_in_output)
            p.skip_special_tokens = bool(self.skip_special_tokens)
            p.detokenize = bool(self.detokenize)
            p.logit_bias = [(int(k), float(v)) for k, v in (self.logit_bias or {}).items()]
            p.output_kind = _E.OutputKind(self.output_kind.value) if isinstance(self.output_kind, RequestOutputKind) \
                else _E.OutputKind(int(self.output_kind))
        except (TypeError, OverflowError) as e:
            raise ValueError(f"SamplingParams: {e}") from e
        if self.so_args is not None:
            p.structured_outputs = StructuredOutputsParams.from_any(self.so_args).to_cpp()
        return p
