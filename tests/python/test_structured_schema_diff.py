"""JSON Schema keywords of issue #4 against python-jsonschema on random instances.

Each schema below is compiled by `deepinfer so-check` (one-byte vocabulary) and every random
instance, serialized compactly, must be accepted exactly when jsonschema says it is valid.
Schemas that deepinfer rejects at compile time are listed in EXPECTED_ERRORS (and must stay
errors: never a looser grammar).
"""
import json
import random
import subprocess

import pytest

from test_structured_regex import cli

jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = [
    {"type": "number", "minimum": -1.25, "exclusiveMaximum": 3.5},
    {"type": "number", "exclusiveMinimum": 0.1, "maximum": 100},
    {"type": "number", "multipleOf": 0.25, "minimum": -1, "maximum": 2},
    {"type": "integer", "multipleOf": 3, "exclusiveMinimum": -7.5},
    {"not": {"enum": [1, "a", None, True]}},
    {"not": {"type": "string", "maxLength": 1}},
    {"not": {"minimum": 2}},
    {"type": "object", "not": {"required": ["a"], "properties": {"a": {"type": "integer"}}}},
    {"oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]},
    {"oneOf": [{"required": ["a"]}, {"properties": {"a": {"type": "integer"}}}]},
    {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
    {"anyOf": [{"type": "integer"}, {"minimum": 2}], "oneOf": [{"type": "integer"}, {"type": "number", "maximum": 1}]},
    {"type": "object", "dependentRequired": {"a": ["b"], "c": ["a"]}},
    {"dependentSchemas": {"a": {"required": ["b"]}, "b": {"properties": {"a": {"type": "string"}}}}},
    {"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {"type": ["string", "array"]}},
    {"if": {"required": ["a"]}, "then": {"required": ["b"]}},
    {"type": "array", "contains": {"type": "integer", "minimum": 1}, "maxContains": 2},
    {"type": "array", "prefixItems": [{"type": "integer"}], "contains": {"type": "string"}, "minContains": 2},
    {"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
               {"properties": {"b": {"type": "string"}}}]},
    {"type": "string", "maxLength": 70},
    {"type": "array", "minItems": 130, "maxItems": 140, "items": {"type": "integer"}},
    {"oneOf": [{"not": {"type": "integer"}}, {"enum": [1, 2, "x"]}]},
    {"type": "object", "additionalProperties": {"type": "integer"},
     "not": {"required": ["b"], "properties": {"b": {"minimum": 2}}}},
    {"oneOf": [{"properties": {"a": {"type": "array"}}}, {"required": ["a", "b"]}, {"properties": {"c": False}}]},
    {"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "array", "maxItems": 1}]},
    {"if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["b"]},
     "else": {"not": {"required": ["c"]}}},
    {"type": "array", "items": {"type": ["integer", "string"]}, "contains": {"type": "string"}, "minContains": 2,
     "maxContains": 3, "maxItems": 4},
    {"not": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["a"]}]}},
    {"properties": {"a": {"type": "integer"}}, "allOf": [{"properties": {"b": {}}}],
     "unevaluatedProperties": {"type": "string"}},
    {"allOf": [{"properties": {"a": {}}, "unevaluatedProperties": False}], "properties": {"b": {}}},
    {"$defs": {"x": {"properties": {"c": {}}, "unevaluatedProperties": False}}, "$ref": "#/$defs/x",
     "properties": {"a": {}}},
    {"prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "string"}},
    {"properties": {"a": {}}, "oneOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]},
                                        {"properties": {"c": {}}}], "unevaluatedProperties": False},
    {"properties": {"a": {}}, "anyOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]},
                                        {"properties": {"c": {}}, "required": ["c"]}], "unevaluatedProperties": False},
    {"if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"properties": {"b": {}}},
     "else": {"properties": {"c": {}}}, "unevaluatedProperties": False},
    {"allOf": [{"if": {"type": "number"}, "then": {"minimum": 2}},
               {"if": {"type": "integer"}, "then": {"multipleOf": 2}, "else": {"type": "number"}}]},
]
EXPECTED_ERRORS = [
    {"contains": {"const": []}, "minContains": 0, "maxContains": 0},  # not of a finite set of arrays
    {"not": {"properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}},  # not of additional keys
]
KEYS = ["a", "b", "c"]


def rnd(rng, depth=0):
    r = rng.random() * (0.6 if depth > 2 else 1.0)
    if r < 0.12:
        return rng.choice([None, True, False])
    if r < 0.35:
        return rng.choice([0, 1, 2, 3, -1, -7, 12, 1.5, -1.25, 0.1, 0.25, 3.5, 3.49, 100, 100.5, 2.0, 0.75, -6, 9])
    if r < 0.55:
        return rng.choice(["", "a", "x", "ab", "Hello", "hello", "É", "Ab", "a" * 70, "a" * 71])
    if r < 0.8:
        n = rng.choice([0, 1, 2, 3, 4, 135, 130, 141]) if depth == 0 and rng.random() < 0.2 else rng.randint(0, 4)
        return [rnd(rng, depth + 1) for _ in range(n)]
    return {k: rnd(rng, depth + 1) for k in rng.sample(KEYS, rng.randint(0, 3))}


def so_check(exe, tmp_path, schema, instances):
    path = tmp_path / "inputs.jsonl"
    with open(path, "w") as f:
        for x in instances:
            text = json.dumps(x, separators=(",", ":"), ensure_ascii=False)
            f.write(json.dumps({"input": text, "so_args": {"json_schema": schema}}, ensure_ascii=False) + "\n")
    out = subprocess.run([exe, "so-check", "--tokenizer", "bytes", "--inputs", str(path)],
                         capture_output=True, text=True, timeout=300, check=True).stdout.splitlines()
    return [json.loads(line) for line in out]


def test_schema_keywords_match_jsonschema(tmp_path):
    exe = cli()
    if not exe:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    rng = random.Random(1)
    wrong = []
    for schema in SCHEMAS:
        validator = jsonschema.Draft202012Validator(schema)
        instances = [rnd(rng) for _ in range(200)]
        if "minItems" in schema:
            instances += [[1] * n for n in range(125, 145)]
        for x, r in zip(instances, so_check(exe, tmp_path, schema, instances)):
            assert "compile_ms" in r or "error" not in r, f"{json.dumps(schema)} does not compile: {r['error']}"
            if r["accepted"] != validator.is_valid(x):
                wrong.append(f"{json.dumps(schema)} on {json.dumps(x)[:80]}: accepted={r['accepted']}")
    assert not wrong, "\n".join(wrong[:30])
    for schema in EXPECTED_ERRORS:
        r = so_check(exe, tmp_path, schema, [None])[0]
        assert "error" in r and "compile_ms" not in r, f"{json.dumps(schema)} compiled"


def random_schema(rng, depth=0):
    """Nested applicators (not/anyOf/oneOf/allOf/if/contains/dependentSchemas/unevaluated*) over
    small leaf constraints."""
    def leaf():
        return rng.choice([
            {"type": rng.choice(["integer", "number", "string", "object", "array", "null", "boolean"])},
            {"enum": rng.sample([1, 2, "a", "b", None, True, [], {}], rng.randint(1, 3))},
            {"const": rng.choice([1, "a", None, 2.5])}, {"minimum": rng.choice([-1, 0, 1.5, 2])},
            {"maxLength": rng.choice([0, 1, 2])}, {"required": rng.sample(KEYS, rng.randint(1, 2))},
            {"minItems": rng.choice([1, 2])}, {"pattern": rng.choice(["^a", "b$", "x"])},
            {"multipleOf": rng.choice([2, 0.5])}, {"maxProperties": rng.choice([0, 1, 2])}, True, False, {},
            {"properties": {"a": {}}, "additionalProperties": False}, {"patternProperties": {"^a": {"type": "integer"}}},
            {"propertyNames": {"maxLength": 1}}, {"additionalProperties": {"type": "string"}}])
    if depth > 2 or rng.random() < 0.3:
        return leaf()
    sub = lambda: random_schema(rng, depth + 1)
    c = rng.randrange(10)
    if c == 0:
        return {"not": sub()}
    if c in (1, 2, 3):
        return {["anyOf", "oneOf", "allOf"][c - 1]: [sub() for _ in range(rng.randint(1, 3))]}
    if c == 4:
        s = {"properties": {k: sub() for k in rng.sample(KEYS, rng.randint(1, 2))}}
        if rng.random() < 0.4:
            s["additionalProperties"] = sub()
        return s
    if c == 5:
        return {"items": sub()}
    if c == 6:
        return {"contains": sub(), **({"maxContains": 1} if rng.random() < 0.5 else {})}
    if c == 7:
        return {"if": sub(), "then": sub(), **({"else": sub()} if rng.random() < 0.6 else {})}
    if c == 8:
        return {"dependentSchemas": {rng.choice(KEYS): sub()}}
    s = sub()
    s = dict(s) if isinstance(s, dict) else {}
    s["unevaluatedProperties"] = sub()
    return s


def small_instance(rng, depth=0):
    r = rng.random() * (0.6 if depth > 1 else 1.0)
    if r < 0.1:
        return rng.choice([None, True, False])
    if r < 0.3:
        return rng.choice([0, 1, 2, 3, -1, 1.5, 2.5, 0.5, 4])
    if r < 0.5:
        return rng.choice(["", "a", "b", "ab", "xb", "ax", "abc"])
    if r < 0.75:
        return [small_instance(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {k: small_instance(rng, depth + 1) for k in rng.sample(KEYS + ["ab", "xa"], rng.randint(0, 3))}


def test_random_schemas_match_jsonschema(tmp_path):
    """Schemas that compile must decide every instance as jsonschema does (no crash either)."""
    exe = cli()
    if not exe:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    rng = random.Random(7)
    schemas = [random_schema(rng) for _ in range(120)]
    rows = [(s, small_instance(rng)) for s in schemas for _ in range(30)]
    path = tmp_path / "inputs.jsonl"
    with open(path, "w") as f:
        for s, x in rows:
            f.write(json.dumps({"input": json.dumps(x, separators=(",", ":")), "so_args": {"json_schema": s}}) + "\n")
    out = subprocess.run([exe, "so-check", "--tokenizer", "bytes", "--inputs", str(path)],
                         capture_output=True, text=True, timeout=600, check=True).stdout.splitlines()
    assert len(out) == len(rows)
    wrong, compiled = [], 0
    for (s, x), line in zip(rows, out):
        r = json.loads(line)
        if "error" in r and "compile_ms" not in r:
            continue
        compiled += 1
        if r["accepted"] != jsonschema.Draft202012Validator(s).is_valid(x):
            wrong.append(f"{json.dumps(s)} on {json.dumps(x)}: accepted={r['accepted']}")
    print(f"[random-schemas] instances {len(rows)} decided {compiled} wrong {len(wrong)}")
    assert compiled > len(rows) // 2
    assert not wrong, "\n".join(wrong[:20])
