"""rust-lang/regex testdata through `deepinfer so-check` (one-byte vocabulary).

Full-match cases only: a case whose first expected match spans the whole haystack must be
accepted, a case with no match at all must be rejected, `compiles = false` must fail to
compile. Cases outside what a full-match constraint can decide (partial matches, regex sets,
byte-oriented `utf8 = false`, escaped haystacks, bounds) are skipped.
"""
import re
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from cli_path import find_cli

ROOT = Path(__file__).resolve().parents[2]


def shared_dir():
    return Path(os.environ.get("DEEPINFER_SHARED_DIR", ROOT.parent / "shared"))


def cli():
    return find_cli("so-check") or shutil.which("deepinfer")


def collect_cases():
    cases = []
    for f in sorted((shared_dir() / "data/structured/regex-testdata").glob("*.toml")):
        if f.stem == "regex-lite":  # a different crate with ASCII-only semantics
            continue
        for t in tomllib.loads(f.read_text()).get("test", []):
            if not isinstance(t.get("regex"), str) or t.get("utf8") is False or t.get("unescape") or "bounds" in t:
                continue
            if t.get("unicode") is False:
                continue
            regex = ("(?i)" if t.get("case-insensitive") else "") + t["regex"]
            hay = t["haystack"]
            # \d \w \s are ASCII here (ECMAScript, as JSON Schema patterns need); Rust's are
            # Unicode-aware, so they only agree on ASCII haystacks.
            if re.search(r"\\[dwsDWS]", regex) and not hay.isascii():
                continue
            if t.get("compiles") is False:
                cases.append((f"{f.stem}/{t['name']}", regex, hay, "error"))
                continue
            m = t.get("matches", [])
            first = (m[0].get("span", m[0].get("id")) if isinstance(m[0], dict) else m[0]) if m else None
            if isinstance(m[0] if m else None, dict) and "span" not in m[0]:
                continue
            if not m:
                cases.append((f"{f.stem}/{t['name']}", regex, hay, False))
            elif first == [0, len(hay.encode())]:
                cases.append((f"{f.stem}/{t['name']}", regex, hay, True))
    return cases


def test_regex_testdata_full_match(tmp_path):
    data = shared_dir() / "data/structured/regex-testdata"
    if not data.exists():
        pytest.skip(f"shared data not found at {data}")
    exe = cli()
    if not exe:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    cases = collect_cases()
    inputs = tmp_path / "inputs.jsonl"
    with open(inputs, "w") as f:
        for _, regex, hay, _ in cases:
            f.write(json.dumps({"input": hay, "so_args": {"regex": regex}}) + "\n")
    out = subprocess.run([exe, "so-check", "--tokenizer", "bytes", "--inputs", str(inputs)],
                         capture_output=True, text=True, timeout=600, check=True).stdout.splitlines()
    assert len(out) == len(cases)
    stats = {"cases": len(cases), "compiled": 0, "unsupported": 0, "wrong": 0, "errors_ok": 0, "errors_missed": 0}
    wrong = []
    for (name, regex, hay, want), line in zip(cases, out):
        r = json.loads(line)
        if want == "error":
            stats["errors_ok" if "error" in r else "errors_missed"] += 1
            continue
        if "error" in r:
            stats["unsupported"] += 1
            continue
        stats["compiled"] += 1
        if r["accepted"] != want or r.get("mask_mismatch"):
            stats["wrong"] += 1
            wrong.append(f"{name}: /{regex}/ on {hay!r} expected {want}")
    print("[regex-testdata]", json.dumps(stats))
    assert not wrong, "\n".join(wrong[:50])
    assert stats["errors_missed"] == 0
