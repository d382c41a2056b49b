"""Differential fuzzer for the grammar engine (issue #19), through `deepinfer so-check` on a
one-byte vocabulary:

- JSON schemas x instances against python-jsonschema (validator_for: the draft the schema names),
  with large objects whose keys come in any order, zero-bounded numbers in every spelling, drafts;
- regexes against Python's `re.fullmatch`;
- EBNF grammars against the same expression as a regex (a direct reading of the grammar).

Every mismatch ever found is kept in tests/data/structured_fuzz_regressions.jsonl and re-checked.
The CI slice is bounded (DEEPINFER_FUZZ_CASES, default 3000 cases, ~35 s here); a long run:
  DEEPINFER_FUZZ_CASES=1000000 DEEPINFER_FUZZ_SEED=3 python3 -m pytest -q tests/python/test_structured_fuzz.py
and over a real vocabulary (multi-byte tokens; slower per case):
  DEEPINFER_FUZZ_TOKENIZER=../shared/data/tokenizers/deepseek-v3/tokenizer.json DEEPINFER_FUZZ_CASES=20000 ...
Compile errors are allowed (a schema deepinfer cannot compile exactly is an error, never a guess)
but counted; crashes (so-check failing) and hangs (timeouts) fail the test.
"""
import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest

from test_structured_regex import cli

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
REGRESSIONS = ROOT / "tests/data/structured_fuzz_regressions.jsonl"
CASES = int(os.environ.get("DEEPINFER_FUZZ_CASES", "3000"))
# A real tokenizer.json instead of the one-byte vocabulary: the inputs are then walked as that
# tokenizer's tokens, and so-check's mask_mismatch compares every multi-byte token's mask bit
# with accept_token (the mask walks' whole-subtree and text-run shortcuts only apply there).
TOKENIZER = os.environ.get("DEEPINFER_FUZZ_TOKENIZER", "bytes")
SEED = int(os.environ.get("DEEPINFER_FUZZ_SEED", "1"))
DRAFTS = [None, "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-06/schema#",
          "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2019-09/schema",
          "https://json-schema.org/draft/2020-12/schema"]


# ---- JSON schemas ----------------------------------------------------------------------------

def number_schema(rng):
    s = {"type": rng.choice(["number", "number", "integer"])}
    k = rng.randrange(6)
    if k == 0:
        s[rng.choice(["minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"])] = 0
    elif k == 1:
        s["minimum"], s["maximum"] = 0, 0
    elif k == 2:
        s["minimum"] = rng.choice([-3, 1, 2.5])
        s["maximum"] = rng.choice([10, 100, 1e18, 2 ** 53 - 1])
    elif k == 3:
        s["multipleOf"] = rng.choice([2, 0.5, 3])
    return s


def leaf(rng):
    return rng.choice([
        {"type": "string"}, {"type": "boolean"}, {"type": "null"}, {"type": "string", "maxLength": 2},
        {"enum": ["a", "b", 1]}, {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
        number_schema(rng), number_schema(rng), {}])


def object_schema(rng, depth=0):
    n = rng.choice([2, 5, 9, 10, 12, 14])
    names = rng.sample([f"k{i}" for i in range(20)] + ["name", "nickname", "nick", "a", "ab"], n)
    props = {k: (object_schema(rng, depth + 1) if depth < 1 and rng.random() < 0.15 else leaf(rng)) for k in names}
    s = {"type": "object", "properties": props}
    req = [k for k in names if rng.random() < 0.5]
    if req:
        s["required"] = req
    a = rng.randrange(3)
    if a == 0:
        s["additionalProperties"] = False
    elif a == 1:
        s["additionalProperties"] = {"type": "integer"}
    return s


def unique_schema(rng):
    items = rng.choice([{"enum": ["a", "ab", "b", True, None]}, {"type": "boolean"}, {"enum": ["x", "y"]}])
    s = {"type": "array", "uniqueItems": True, "items": items}
    if rng.random() < 0.3:
        s["minItems"] = 1
    return s


def draft_schema(rng):
    return rng.choice([
        {"definitions": {"a": {"type": "integer"}}, "$ref": "#/definitions/a", "minimum": 5},
        {"if": {"type": "integer"}, "then": {"minimum": 5}},
        {"dependencies": {"a": ["b"]}},
        {"type": "integer"}])


def schema_case(rng):
    k = rng.randrange(5)
    s = object_schema(rng) if k < 2 else number_schema(rng) if k == 2 else draft_schema(rng) if k == 3 \
        else unique_schema(rng)
    d = rng.choice(DRAFTS)
    if d and (k == 3 or rng.random() < 0.2):
        s = dict(s, **{"$schema": d})
    return s


NUMBERS = [0, -0.0, 0.0, 1, -1, 2, 12, 100, 101, -7, 0.5, 2.5, 1e18, 2 ** 53 - 1, 2 ** 53, 1e-07, 5e-06,
           -5e-06, 1e+16, 3.0, 1.5e-10]


def instance_for(rng, s, depth=0):
    """Mostly near-valid instances: built from the schema, then perturbed."""
    if rng.random() < 0.1:
        return rng.choice([None, True, "a", 3, [], {}])
    t = s.get("type") if isinstance(s, dict) else None
    if t == "object" and "properties" in s:
        keys = [k for k in s["properties"] if k in s.get("required", []) or rng.random() < 0.6]
        if rng.random() < 0.15 and keys:
            keys.remove(rng.choice(keys))  # maybe a required one
        if rng.random() < 0.15:
            keys.append(rng.choice(["zz", "k99", "nam"]))
        rng.shuffle(keys)
        return {k: instance_for(rng, s["properties"].get(k, {"type": "integer"}), depth + 1) for k in keys}
    if t in ("number", "integer"):
        return rng.choice(NUMBERS)
    if t == "string":
        return rng.choice(["", "a", "ab", "abc", "é"])
    if t == "array":
        pool = s.get("items", {}).get("enum") or [True, False, 1, 2, "x"]
        return [rng.choice(pool + ["q"]) for _ in range(rng.randint(0, 4))]
    if "enum" in s:
        return rng.choice(s["enum"] + ["c"])
    if t == "boolean":
        return rng.choice([True, False, 0])
    return rng.choice([None, 3, 7, "a", {"a": 1}, {"a": 1, "b": 2}, 2.5])


def number_text(x, rng):
    """A JSON spelling of x: Python's, or another exponent/zero spelling of the same value."""
    t = json.dumps(x)
    if isinstance(x, float) and x == 0 and rng.random() < 0.5:
        return rng.choice(["0", "-0", "0.0", "0e5", "-0.0E-3"])
    if isinstance(x, float) and "e" in t and rng.random() < 0.5:
        return t.upper().replace("E-0", "E-")
    return t


def dumps(x, rng):
    if isinstance(x, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dumps(v, rng) for k, v in x.items()) + "}"
    if isinstance(x, list):
        return "[" + ",".join(dumps(v, rng) for v in x) + "]"
    if isinstance(x, float):
        return number_text(x, rng)
    return json.dumps(x, ensure_ascii=False)


def nonzero_bounds(s):
    """Some (sub)schema has a non-zero numeric bound or a multipleOf."""
    if isinstance(s, dict):
        if "multipleOf" in s or any(s.get(k, 0) not in (0, True, False)
                                    for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
            return True
        return any(nonzero_bounds(v) for v in s.values())
    if isinstance(s, list):
        return any(nonzero_bounds(v) for v in s)
    return False


def exponent_under_nonzero_bound(s, text):
    """Known limit (json_schema_number.cpp): under non-zero bounds (and multipleOf) only plain
    decimal text; such spellings are not generated there."""
    return re.search(r"[0-9][eE]", text) is not None and nonzero_bounds(s)


# ---- regexes and EBNF ------------------------------------------------------------------------

def rand_expr(rng, depth=0):
    """(regex, ebnf) of one random expression over a, b, c."""
    r = rng.random() if depth < 4 else rng.random() * 0.4
    if r < 0.25:
        c = rng.choice("abc")
        return c, f'"{c}"'
    if r < 0.35:
        cls = rng.choice(["ab", "bc", "^a", "a-c"])
        return f"[{cls}]", f"[{cls}]"
    if r < 0.55:
        parts = [rand_expr(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return "".join(p[0] for p in parts), " ".join(p[1] for p in parts)
    if r < 0.75:
        parts = [rand_expr(rng, depth + 1) for _ in range(rng.randint(2, 3))]
        return "(" + "|".join(p[0] for p in parts) + ")", "(" + " | ".join(p[1] for p in parts) + ")"
    x, e = rand_expr(rng, depth + 1)
    q = rng.choice(["*", "+", "?", "{2}", "{1,3}", "{0,2}"])
    return f"({x}){q}", f"({e}){q}"


def rand_text(rng):
    return "".join(rng.choice("abcd") for _ in range(rng.randint(0, 7)))


# ---- running ---------------------------------------------------------------------------------

def run_so_check(exe, tmp_path, rows, timeout):
    path = tmp_path / "fuzz.jsonl"
    with open(path, "w") as f:
        for so_args, text in rows:
            f.write(json.dumps({"input": text, "so_args": so_args}, ensure_ascii=False) + "\n")
    p = subprocess.run([exe, "so-check", "--tokenizer", TOKENIZER, "--inputs", str(path)],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"so-check failed (rc {p.returncode}): {p.stderr[-2000:]}"
    out = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(out) == len(rows)
    return out


def expected(so_args, text):
    if "regex" in so_args:
        return re.fullmatch(so_args["regex"], text) is not None
    if "ebnf" in so_args:
        return re.fullmatch(so_args["x-regex"], text) is not None
    s = so_args["json_schema"]
    return jsonschema.validators.validator_for(s)(s).is_valid(json.loads(text))


def make_rows(rng, n):
    rows = []
    while len(rows) < n:
        k = rng.randrange(10)
        if k < 6:
            s = schema_case(rng)
            for _ in range(8):
                text = dumps(instance_for(rng, s), rng)
                if not exponent_under_nonzero_bound(s, text):
                    rows.append(({"json_schema": s}, text))
        elif k < 8:
            x, _ = rand_expr(rng)
            rows += [({"regex": x}, rand_text(rng)) for _ in range(8)]
        else:
            x, e = rand_expr(rng)
            rows += [({"ebnf": "root ::= " + e, "x-regex": x}, rand_text(rng)) for _ in range(8)]
    return rows[:n]


def check_rows(exe, tmp_path, rows):
    sent = [({k: v for k, v in a.items() if not k.startswith("x-")}, t) for a, t in rows]
    out = run_so_check(exe, tmp_path, sent, timeout=600)  # a hang fails the test
    wrong, compiled = [], 0
    for (a, text), r in zip(rows, out):
        if "error" in r and "compile_ms" not in r:
            continue
        compiled += 1
        check_rows.max_compile_ms = max(getattr(check_rows, "max_compile_ms", 0.0), r.get("compile_ms", 0.0))
        want = expected(a, text)
        if r["accepted"] != want:
            wrong.append({"so_args": a, "input": text, "valid": want})
        elif r.get("mask_mismatch"):  # so-check: some token's mask bit disagreed with accept_token
            wrong.append({"so_args": a, "input": text, "valid": want, "mask_mismatch": True})
    return wrong, compiled


def test_fuzz_regressions(tmp_path):
    exe = cli()
    if not exe:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    if not REGRESSIONS.exists():
        pytest.skip("no regression file")
    rows = []
    for line in REGRESSIONS.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            rows.append((d["so_args"], d["input"]))
    wrong, _ = check_rows(exe, tmp_path, rows)
    assert not wrong, json.dumps(wrong[:10], ensure_ascii=False)


def test_fuzz_differential(tmp_path):
    exe = cli()
    if not exe:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    rng = random.Random(SEED)
    total = wrong_all = compiled_all = 0
    wrong_kept = []
    while total < CASES:
        rows = make_rows(rng, min(2000, CASES - total))
        wrong, compiled = check_rows(exe, tmp_path, rows)
        total += len(rows)
        compiled_all += compiled
        wrong_all += len(wrong)
        wrong_kept += wrong[:20]
    print(f"[fuzz] seed {SEED} cases {total} decided {compiled_all} mismatches {wrong_all} "
          f"max compile ms {getattr(check_rows, 'max_compile_ms', 0):.1f}")
    assert compiled_all > total // 2
    assert not wrong_kept, "add these to tests/data/structured_fuzz_regressions.jsonl after fixing:\n" + \
        "\n".join(json.dumps(w, ensure_ascii=False) for w in wrong_kept)
