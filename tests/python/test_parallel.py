"""The data-parallel LLM from Python (docs/PARALLEL.md): rank 0 is this process, the workers run
`python -m deepinfer._rank_worker`-style with this interpreter; the experts are sharded across the
ranks. Greedy and seeded outputs equal the one-rank LLM's; a bad layout is a ValueError naming the
field; the CLI's --data-parallel-size gives the same text."""
import glob
import json
import os
import subprocess
from pathlib import Path

import pytest

from cli_path import find_cli

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
    return find_cli()


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


def _safetensors_sizes(folder):
    import struct
    sizes = {}
    for f in glob.glob(os.path.join(folder, "*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                sizes[name] = t["data_offsets"][1] - t["data_offsets"][0]
    return sizes


@pytest.mark.parametrize("layout", ["official", "hf"])
def test_info_memory_per_rank(layout):
    """`deepinfer info --data-parallel-size`: every weight but the main layers' routed experts on every
    rank, plus ceil((E + redundant) / ep) experts per layer; a bad layout is named."""
    import re
    cli = _cli()
    if not cli:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    model = ROOT / "tests" / "data" / "golden" / ("tiny_official" if layout == "official" else "tiny")
    sizes = _safetensors_sizes(model)
    routed = sum(v for k, v in sizes.items() if re.match(r"^(model\.)?layers\.\d+\.(ffn|mlp)\.experts\.", k))
    assert 0 < routed < sum(sizes.values())
    experts = json.loads((model / "config.json").read_text())["n_routed_experts"]
    out = subprocess.run([cli, "info", "--model", str(model), "--data-parallel-size", "4", "--num-redundant-experts", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    m = re.search(r"per rank ([\d.]+) (KiB|MiB) = replicated ([\d.]+) (KiB|MiB) \+ routed experts ([\d.]+) (KiB|MiB) "
                  r"\((\d+) of (\d+) per layer", out.stdout)
    assert m, out.stdout
    unit = {"KiB": 1024, "MiB": 1024 ** 2}
    slots = -(-(experts + 2) // 4)
    assert (int(m.group(7)), int(m.group(8))) == (slots, experts)
    expect = {"total": sum(sizes.values()) - routed + routed * slots / experts, "replicated": sum(sizes.values()) - routed,
              "routed": routed * slots / experts}
    for key, value, u in [("total", m.group(1), m.group(2)), ("replicated", m.group(3), m.group(4)),
                          ("routed", m.group(5), m.group(6))]:
        assert abs(float(value) * unit[u] - expect[key]) <= 0.01 * unit[u], (key, out.stdout)
    bad = subprocess.run([cli, "info", "--model", str(model), "--data-parallel-size", "3", "--expert-parallel-size", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "expert_parallel_size=2 must divide" in bad.stderr, bad.stderr


def test_info_context_parallel_with_experts():
    """`deepinfer info --context-parallel-size N --expert-parallel-size N`: every weight but the main
    routed experts on every CP rank plus ceil((E + redundant) / N) experts per layer, and the expert
    outputs a rank receives per layer ((N-1)/N of T*K rows of D f32); another ep is named."""
    import re
    cli = _cli()
    if not cli:
        pytest.skip("deepinfer CLI not built (set DEEPINFER_CLI)")
    model = ROOT / "tests" / "data" / "golden" / "tiny"
    sizes = _safetensors_sizes(model)
    routed = sum(v for k, v in sizes.items() if re.match(r"^(model\.)?layers\.\d+\.(ffn|mlp)\.experts\.", k))
    cfg = json.loads((model / "config.json").read_text())
    experts, k, d = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"]
    out = subprocess.run([cli, "info", "--model", str(model), "--context-parallel-size", "4", "--expert-parallel-size",
                          "4", "--num-redundant-experts", "4", "--context", "4096"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    unit = {"KiB": 1024, "MiB": 1024 ** 2}
    m = re.search(r"layout cp 4 = ep: per rank ([\d.]+) (KiB|MiB) of weights \(routed experts (\d+) of (\d+) per layer",
                  out.stdout)
    assert m, out.stdout
    slots = -(-(experts + 4) // 4)
    assert (int(m.group(3)), int(m.group(4))) == (slots, experts)
    expect = sum(sizes.values()) - routed + routed * slots / experts
    assert abs(float(m.group(1)) * unit[m.group(2)] - expect) <= 0.01 * unit[m.group(2)], out.stdout
    m = re.search(r"receives about ([\d.]+) (KiB|MiB) of expert outputs per layer \((\d+) rows of (\d+)", out.stdout)
    assert m, out.stdout
    assert (int(m.group(3)), int(m.group(4))) == (4096 * k, d)
    assert abs(float(m.group(1)) * unit[m.group(2)] - 4096 * k * d * 4 * 3 / 4) <= 0.01 * unit[m.group(2)], out.stdout
    bad = subprocess.run([cli, "info", "--model", str(model), "--context-parallel-size", "3", "--expert-parallel-size",
                          "2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--expert-parallel-size=2 with --context-parallel-size=3" in bad.stderr, bad.stderr


def test_context_parallel_matches_one_rank():
    # Context parallelism (docs/PARALLEL.md): steps of >= 16 tokens split across 2 ranks; the tiny
    # model's token prompts, chunked prefill of 48-token steps.
    tiny = str(ROOT / "tests" / "data" / "golden" / "tiny")
    prompts = [{"prompt_token_ids": [(i * 37 + n) % 100 for i in range(n)]} for n in (40, 130, 7)]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)

    def run(**kw):
        llm = LLM(tiny, accelerator="cpu", skip_tokenizer_init=True, max_num_batched_tokens=48, max_model_len=256, **kw)
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]

    assert run() == run(context_parallel_size=2, context_parallel_min_tokens=16)
    # The experts sharded over the same ranks: split steps run each rank's experts on every token.
    assert run() == run(context_parallel_size=2, expert_parallel_size=2, context_parallel_min_tokens=16)
    with pytest.raises(ValueError, match="expert_parallel_size=3"):
        LLM(tiny, accelerator="cpu", skip_tokenizer_init=True, context_parallel_size=2, expert_parallel_size=3)
    with pytest.raises(ValueError, match="expert_parallel_size=4"):  # experts across the CP groups
        LLM(tiny, accelerator="cpu", skip_tokenizer_init=True, context_parallel_size=2, data_parallel_size=2,
            expert_parallel_size=4)
    with pytest.raises(ValueError, match="context_parallel_min_tokens"):
        LLM(tiny, accelerator="cpu", skip_tokenizer_init=True, context_parallel_size=2, context_parallel_min_tokens=1)
