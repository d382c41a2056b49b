"""The bundled default model (assets/default-model, issue #21): a small trained DeepSeek-V4.

- deepinfer's CPU forward reproduces transformers' fp32 logits of the shipped checkpoint
  (tests/data/golden/default_model/reference.npz, made by tools/export_default_model.py) through
  the full, chunked and token-by-token paths of `deepinfer logits`;
- deepinfer's tokenizer gives exactly HF tokenizers' ids on held-out corpus text;
- LLM() and `deepinfer generate` with no model find it from any working directory, also with the
  binary copied elsewhere; greedy text is English words.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_path import find_cli

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "assets" / "default-model"
GOLDEN = ROOT / "tests" / "data" / "golden" / "default_model"
SAMPLE = ROOT / "tests" / "data" / "default_model" / "heldout_sample.jsonl"
# Measured at the commit that added this file: max |deepinfer - transformers| over the stored
# columns and logsumexp was 1.4e-5 (chunked), 8.6e-6 (full) with logits up to 18 in magnitude (fp32
# on both sides, different summation orders); argmax equal on every row. 1e-4 leaves room for other
# BLAS builds.
TOL = 1e-4


def cli():
    return find_cli("logits")


@pytest.fixture(scope="module")
def binary():
    b = cli()
    if b is None:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    return b


@pytest.fixture(scope="module")
def ref():
    return np.load(GOLDEN / "reference.npz")


def _logits(binary, ids, mode, tmp_path, chunk=37):
    out = tmp_path / f"{mode}.npy"
    r = subprocess.run([binary, "logits", "--model", str(MODEL), "--ids", ",".join(map(str, ids)), "--out", str(out),
                        "--mode", mode, "--chunk", str(chunk)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(out).astype(np.float64)


@pytest.mark.parametrize("seq,mode", [("long", "full"), ("long", "chunked"), ("short", "full"),
                                      ("short", "chunked"), ("short", "decode")])
def test_logits_match_transformers(binary, ref, seq, mode, tmp_path):
    ids = ref[f"{seq}_ids"].tolist()
    got = _logits(binary, ids, mode, tmp_path)
    assert got.shape == (len(ids), 8192)
    cols = ref["cols"]
    err = np.abs(got[:, cols] - ref[f"{seq}_logits"]).max()
    m = got.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(got - m).sum(-1))
    err_lse = np.abs(lse - ref[f"{seq}_lse"]).max()
    assert err < TOL and err_lse < TOL, (err, err_lse)
    top2 = np.sort(got, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3          # a near tie may resolve either way
    assert (got.argmax(-1) == ref[f"{seq}_argmax"])[clear].all()


def test_tokenizer_matches_hf_on_heldout_text():
    tokenizers = pytest.importorskip("tokenizers")
    try:
        from deepinfer import Tokenizer
    except Exception as e:  # the tokenizer module is not in this build
        pytest.skip(f"deepinfer tokenizer unavailable: {e}")
    hf = tokenizers.Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    ours = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    docs = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert sum(len(d) for d in docs) > 100_000
    for i, d in enumerate(docs):
        want = hf.encode(d, add_special_tokens=False).ids
        assert ours.encode(d) == want, f"document {i} differs"
        assert ours.decode(want) == d
    chat = "<｜User｜>hi<｜Assistant｜></think>ok｜DSML｜x<think>"
    assert ours.encode(chat) == hf.encode(chat, add_special_tokens=False).ids
    assert ours.bos_id == 0


def _english(text: str) -> bool:
    words = re.findall(r"[A-Za-z]+", text)
    return len(words) >= 5 and sum(len(w) for w in words) >= 0.6 * len(text.replace(" ", ""))


def test_llm_without_model_uses_it_from_any_folder(tmp_path):
    code = ("from deepinfer import LLM, SamplingParams; llm = LLM(); print(llm.model); "
            "o = llm.generate(['The Lord is my'], SamplingParams(temperature=0, max_tokens=24))[0]; "
            "print(o.error); print(o.outputs[0].text)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "DEEPINFER_HF_MODEL_DIR"})
    if r.returncode != 0 and "No module named 'deepinfer" in r.stderr:
        pytest.skip("deepinfer not importable from another folder (./build.sh installs the .pth)")
    assert r.returncode == 0, r.stderr
    path, err, text = r.stdout.split("\n", 2)
    assert Path(path).resolve() == MODEL.resolve()
    assert err == "None"
    assert _english(text), text


def test_moved_cli_finds_it(binary, tmp_path):
    moved = tmp_path / "bin" / "deepinfer"
    moved.parent.mkdir()
    shutil.copy(binary, moved)
    env = {k: v for k, v in os.environ.items() if k != "DEEPINFER_HF_MODEL_DIR"}
    r = subprocess.run([str(moved), "generate", "-p", "In the beginning", "--temperature", "0", "--max-tokens", "24"],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert _english(r.stdout), r.stdout
