"""Strict conversion of user values before they cross into C++.

Nothing is coerced silently: a float where an int is expected, an int past its C++ type, a
seed past 64 bits, a bool passed as a number or a number as a bool is a ValueError naming the
field. (nanobind would otherwise truncate nothing but raise a TypeError that names no field,
and Python's int()/float()/bool() would truncate 2.7 to 2, accept "1.5", or make "no" True.)
"""
from __future__ import annotations

import numbers
import operator
from typing import Any, List, Optional

INT32 = (-(2 ** 31), 2 ** 31 - 1)
UINT64 = (0, 2 ** 64 - 1)
INT64 = (-(2 ** 63), 2 ** 63 - 1)
# Same limit as the C++ JSON reader (src/core/json.h kMaxJsonDepth).
MAX_JSON_DEPTH = 256


def _describe(v: Any) -> str:
    r = repr(v)
    return f"{type(v).__name__} {r if len(r) <= 40 else r[:37] + '...'}"


def as_int(field: str, v: Any, lo: int = INT32[0], hi: int = INT32[1]) -> int:
    """An integer (Python or numpy) in [lo, hi]; bools and floats are refused."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        raise ValueError(f"{field} must be an integer, got {_describe(v)}")
    try:
        i = operator.index(v)
    except TypeError:
        raise ValueError(f"{field} must be an integer, got {_describe(v)}") from None
    if i < lo or i > hi:
        raise ValueError(f"{field}={i} is outside [{lo}, {hi}]")
    return i


def as_opt_int(field: str, v: Any, lo: int = INT32[0], hi: int = INT32[1]) -> Optional[int]:
    return None if v is None else as_int(field, v, lo, hi)


def as_float(field: str, v: Any) -> float:
    """A real number (int, float, numpy scalar); strings and bools are refused."""
    if isinstance(v, bool) or type(v).__name__ == "bool_" or not isinstance(v, numbers.Real):
        raise ValueError(f"{field} must be a number, got {_describe(v)}")
    return float(v)


def as_bool(field: str, v: Any) -> bool:
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return bool(v)
    raise ValueError(f"{field} must be a bool, got {_describe(v)}")


def as_str(field: str, v: Any) -> str:
    """A str that encodes to UTF-8 (no lone surrogates), as C++ receives it."""
    if not isinstance(v, str):
        raise ValueError(f"{field} must be a str, got {_describe(v)}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{field} is not valid text: {e}") from None
    return v


def as_token_ids(field: str, ids: Any) -> List[int]:
    """A sequence of token ids (int32); names the first bad position."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"{field} must be a list of token ids, got {_describe(ids)}")
    return [as_int(f"{field}[{i}]", t) for i, t in enumerate(ids)]


def check_json_depth(field: str, value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Raises ValueError when dicts/lists nest deeper than `limit` (iteratively: json.dumps
    would raise RecursionError, which is no ValueError, on a 100,000-deep value)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if d > limit:
            raise ValueError(f"{field}: JSON nested deeper than {limit} levels")
        stack.extend((c, d + 1) for c in children)
