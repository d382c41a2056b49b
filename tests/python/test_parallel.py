"""The data-parallel LLM from Python (docs/PARALLEL.md): rank 0 is this process, the workers run
`python -m deepinfer._rank_worker`-style with this interpreter; the experts are sharded across the
ranks. Greedy and seeded outputs equal the one-rank LLM's; a bad layout is a ValueError naming the
field; the CLI's --data-parallel-size gives the same text."""
import glob
import os
import subprocess
from pathlib import Path

import pytest

import deepinfer
from deepinfer import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "assets" / "default-model")
PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "1, 2, 3,", "Water is"]


def _params():
    return [SamplingParams(temperature=0, max_tokens=10),
            SamplingParams(temperature=0.8, seed=11, max_tokens=10)]


def _texts(llm, params):
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outs]


@pytest.fixture(scope="module")
def reference():
    one = LLM(MODEL, accelerator="cpu", max_num_seqs=8)
    return {i: _texts(one, p) for i, p in enumerate(_params())}


@pytest.mark.parametrize("dp,ep", [(2, 0), (3, 1)])
def test_matches_one_rank(reference, dp, ep):
    par = LLM(MODEL, accelerator="cpu", max_num_seqs=8, data_parallel_size=dp, expert_parallel_size=ep)
    for i, p in enumerate(_params()):
        assert _texts(par, p) == reference[i], f"params {i}"


def test_bad_layout_named():
    with pytest.raises(ValueError, match="expert_parallel_size"):
        LLM(MODEL, accelerator="cpu", data_parallel_size=2, expert_parallel_size=3)
    with pytest.raises(ValueError, match="data_parallel_size"):
        LLM(MODEL, accelerator="cpu", data_parallel_size=0)


def _cli():
    for c in [os.environ.get("DEEPINFER_CLI")] + sorted(glob.glob(str(ROOT / "build*/deepinfer"))):
        if c and os.path.exists(c):
            return c
    return None


def test_cli_data_parallel(reference):
    cli = _cli()
    if not cli:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    args = [cli, "generate", "--model", MODEL, "--accelerator", "cpu", "--temperature", "0", "--max-tokens", "10",
            "--prompt", PROMPTS[0]]
    one = subprocess.run(args, capture_output=True, text=True, timeout=300)
    par = subprocess.run(args + ["--data-parallel-size", "2"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    assert par.returncode == 0, par.stderr
    assert reference[0][0][0] in one.stdout
    assert reference[0][0][0] in par.stdout
