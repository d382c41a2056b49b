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
from ._checks import UINT64, as_bool, as_float, as_int, as_opt_int, as_str, as_token_ids, check_json_depth

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
    bound_token_id (needs trigger_token_ids): once generated, the rest of the trigger is forced.
    tool_calls: a DSML tool-call block, {"format": "v4" | "v41", "tools": [...], "mode":
    "required" | "auto", "parallel": bool, "function": name} (dict or JSON text)."""
    json: Optional[Union[str, Dict[str, Any]]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    tool_calls: Optional[Union[str, Dict[str, Any]]] = None
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
        """The C++ StructuredOutputsParams; raises ValueError naming the field for a value of the
        wrong type, text that is not valid Unicode, or a schema nested past the JSON depth limit."""
        import json as _json
        s = _E.StructuredOutputsParams()
        if self.json is not None:
            if isinstance(self.json, str):
                s.json = as_str("so_args.json", self.json)
            elif isinstance(self.json, (dict, list, bool)):
                check_json_depth("so_args.json", self.json)
                try:
                    s.json = _json.dumps(self.json)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"so_args.json is not JSON-serialisable: {e}") from None
            else:
                raise ValueError(f"so_args.json must be a schema dict or JSON text, got {type(self.json).__name__}")
        if self.regex is not None:
            s.regex = as_str("so_args.regex", self.regex)
        if self.choice is not None:
            if isinstance(self.choice, (str, bytes)) or not hasattr(self.choice, "__iter__"):
                raise ValueError(f"so_args.choice must be a list of str, got {type(self.choice).__name__}")
            s.choice = [as_str(f"so_args.choice[{i}]", c) for i, c in enumerate(self.choice)]
        if self.grammar is not None:
            s.grammar = as_str("so_args.grammar", self.grammar)
        if self.tool_calls is not None:
            if isinstance(self.tool_calls, str):
                s.tool_calls = as_str("so_args.tool_calls", self.tool_calls)
            elif isinstance(self.tool_calls, dict):
                check_json_depth("so_args.tool_calls", self.tool_calls)
                try:
                    s.tool_calls = _json.dumps(self.tool_calls)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"so_args.tool_calls is not JSON-serialisable: {e}") from None
            else:
                raise ValueError(f"so_args.tool_calls must be a dict or JSON text, got {type(self.tool_calls).__name__}")
        s.json_object = False if self.json_object is None else as_bool("so_args.json_object", self.json_object)
        trig = self.trigger_token_ids or []
        if not isinstance(trig, (list, tuple)) or any(type(t) is not int or t < 0 for t in trig):
            raise ValueError("so_args: trigger_token_ids must be a list of non-negative integers")
        s.trigger_token_ids = as_token_ids("so_args.trigger_token_ids", trig)  # int32 range, named position
        if self.bound_token_id is not None:
            if type(self.bound_token_id) is not int or self.bound_token_id < 0:
                raise ValueError("so_args: bound_token_id must be a non-negative integer")
            as_int("so_args.bound_token_id", self.bound_token_id)
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
        """The C++ SamplingParams. Types and C++ ranges are checked here, with no coercion (a
        float id or max_tokens, a seed past 64 bits, an int past int32: ValueError naming the
        field); value ranges that depend on the model (ids < vocab, min_tokens within the room
        left, n / logprobs maxima) are checked when the request is admitted."""
        f = "SamplingParams."
        p = _E.SamplingParams()
        p.n = as_int(f + "n", self.n)
        p.temperature = as_float(f + "temperature", self.temperature)
        p.top_p = as_float(f + "top_p", self.top_p)
        p.top_k = 0 if self.top_k is None else as_int(f + "top_k", self.top_k)
        p.min_p = as_float(f + "min_p", self.min_p)
        p.presence_penalty = as_float(f + "presence_penalty", self.presence_penalty)
        p.frequency_penalty = as_float(f + "frequency_penalty", self.frequency_penalty)
        p.repetition_penalty = as_float(f + "repetition_penalty", self.repetition_penalty)
        if self.seed is not None and self.seq_seed is not None and self.seed != self.seq_seed:
            raise ValueError(f"{f}seed={self.seed} and its alias seq_seed={self.seq_seed} disagree")
        seed = self.seed if self.seed is not None else self.seq_seed
        if seed is not None:
            p.seed = as_int(f + "seed", seed, *UINT64)
        if isinstance(self.stop, str):
            p.stop = [as_str(f + "stop", self.stop)]
        elif self.stop is None:
            p.stop = []
        elif isinstance(self.stop, (list, tuple)):
            p.stop = [as_str(f"{f}stop[{i}]", s) for i, s in enumerate(self.stop)]
        else:
            raise ValueError(f"{f}stop must be a str or a list of str, got {type(self.stop).__name__}")
        p.stop_token_ids = as_token_ids(f + "stop_token_ids", self.stop_token_ids or [])
        p.ignore_eos = as_bool(f + "ignore_eos", self.ignore_eos)
        p.max_tokens = as_opt_int(f + "max_tokens", self.max_tokens)
        p.min_tokens = as_int(f + "min_tokens", self.min_tokens)
        p.logprobs = as_opt_int(f + "logprobs", self.logprobs)
        p.prompt_logprobs = as_opt_int(f + "prompt_logprobs", self.prompt_logprobs)
        p.include_stop_str_in_output = as_bool(f + "include_stop_str_in_output", self.include_stop_str_in_output)
        p.skip_special_tokens = as_bool(f + "skip_special_tokens", self.skip_special_tokens)
        p.detokenize = as_bool(f + "detokenize", self.detokenize)
        bias = self.logit_bias or {}
        if not isinstance(bias, dict):
            raise ValueError(f"{f}logit_bias must be a dict token id -> bias, got {type(bias).__name__}")
        p.logit_bias = [(as_int(f"{f}logit_bias key", k), as_float(f"{f}logit_bias[{k!r}]", v)) for k, v in bias.items()]
        kind = self.output_kind
        if isinstance(kind, RequestOutputKind):
            p.output_kind = _E.OutputKind(kind.value)
        else:
            p.output_kind = _E.OutputKind(as_int(f + "output_kind", kind, 0, 2))
        if self.so_args is not None:
            p.structured_outputs = StructuredOutputsParams.from_any(self.so_args).to_cpp()
        return p
