"""The GPU sweep's pieces that run anywhere: bench-flash's --grid parsing and refusals (through
--floors-only, no engine), the transformers peer's grid parser, and bench/sweep_report.py's CSV,
markdown (engine / transformers ratio at the same point, errors listed) and plots."""
import csv
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("DEEPINFER_BINARY_DIR", ROOT / "build")) / "deepinfer"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _load("sweep_report", ROOT / "bench" / "sweep_report.py")
peer = _load("hf_flash_peer", ROOT / "bench" / "hf_flash_peer.py")


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory):
    if not EXE.exists():
        pytest.skip(f"{EXE} not built")
    out = tmp_path_factory.mktemp("stack") / "s"
    subprocess.run([str(EXE), "make-flash-stack", "--out", str(out), "--layers", "2", "--small", "-q",
                    "--no-verify"], check=True, capture_output=True, timeout=300)
    return out


def test_floors_follow_the_grid(small_stack):
    r = subprocess.run([str(EXE), "bench-flash", "-m", str(small_stack), "--grid", "300:1,3;900:2",
                        "--floors-only", "--decode-steps", "4", "--warmup-steps", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines if ln.startswith("prefill")] == ["prefill 300 tokens",
                                                                              "prefill 900 tokens"]
    # each context decodes at its own batches; ctx = prompt + warm-up + B/2 + steps/2
    assert [ln.split(":")[0] for ln in lines if ln.startswith("decode")] == [
        "decode B=1 ctx 302", "decode B=3 ctx 304", "decode B=2 ctx 903"]


@pytest.mark.parametrize("args,msg", [
    (["--grid", "300:0"], "a decode batch must be >= 1"),
    (["--grid", "x:1"], "--grid context: 'x' is not a whole number"),
    (["--grid", "300,400:1"], "must be CONTEXT:B,B"),
    (["--grid", ";;"], "no context to run"),
    (["--contexts", "1"], "--contexts entry 1 is outside"),
    (["--shared-context-above", "-5"], "--shared-context-above must be >= 0"),
    (["--grid", "300:1", "--batches", "4"], "--grid replaces --contexts and --batches"),
    (["--max-batched-tokens", "-1"], "--max-batched-tokens must be >= 0"),
])
def test_bad_grid_is_refused_with_its_name(small_stack, args, msg):
    r = subprocess.run([str(EXE), "bench-flash", "-m", str(small_stack), "--floors-only", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert msg in r.stderr + r.stdout


@pytest.mark.parametrize("args,msg", [
    (["--grid", "x:1"], "expected \"CTX:B,B;CTX:B\""),
    (["--grid", "4096:0"], "must be >= 1"),
    (["--steps", "0"], "--steps must be >= 1"),
])
def test_peer_refuses_bad_arguments_before_importing_torch(args, msg):
    r = subprocess.run(["python3", str(ROOT / "bench" / "hf_flash_peer.py"), "--model", "/nonexistent", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert msg in r.stderr


def test_peer_grid_parser():
    assert peer.parse_grid("4096:1,8; 1024:32;") == [(4096, [1, 8]), (1024, [32])]
    assert peer.parse_grid("512") == [(512, [])]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_report_csv_markdown_and_ratio(tmp_path):
    eng = _write(tmp_path / "e.jsonl", [
        {"what": "prefill", "batch": 1, "ctx": 4096, "prompt_len": 4096, "ms": 100.0, "floor_ms": 25.0},
        {"what": "decode", "batch": 8, "ctx": 4107, "prompt_len": 4096, "ms": 3.0, "floor_ms": 1.5},
        {"what": "decode", "batch": 256, "ctx": 4233, "prompt_len": 4096, "ms": 20.0, "floor_ms": 10.0,
         "shared_context": True},
        {"what": "op", "phase": "decode B=8", "op": "moe", "ms_per_step": 1.0},  # breakdown lines are skipped
    ])
    hf = _write(tmp_path / "p.jsonl", [
        {"what": "prefill", "batch": 1, "ctx": 4096, "prompt_len": 4096, "ms": 880.0, "engine": "transformers"},
        {"what": "decode", "batch": 8, "ctx": 4102, "prompt_len": 4096, "ms": 30.0, "engine": "transformers"},
        {"what": "decode", "batch": 32, "ctx": 4096, "prompt_len": 4096, "error": "out of memory",
         "engine": "transformers"},
    ])
    out = tmp_path / "out"
    r = subprocess.run(["python3", str(ROOT / "bench" / "sweep_report.py"), "--out", str(out), eng, hf],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert len(rows) == 6
    dec8 = [x for x in rows if x["engine"] == "deepinfer" and x["batch"] == "8"][0]
    assert float(dec8["tokens_per_s"]) == pytest.approx(8 / 3.0 * 1e3)
    assert float(dec8["share_of_floor"]) == pytest.approx(0.5)
    md = r.stdout
    assert "| prefill | 4096 | 1 | 100.00 | 40960 | 25.000 | 25% | 880.0 | 8.8x |" in md
    assert "| decode | 4096 | 8 | 3.00 | 2667 | 1.500 | 50% | 30.0 | 10.0x |" in md
    assert "decode (shared ctx) | 4096 | 256" in md
    assert "out of memory" in md
    if importlib.util.find_spec("matplotlib"):
        assert (out / "decode_tps.png").stat().st_size > 1000
        assert (out / "prefill_ttft.png").exists()
    else:
        assert "no plots" in md


def test_report_refuses_a_broken_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"what": "decode", "batch": 1, "ctx": 10, "ms": 1.0}\n{not json\n')
    r = subprocess.run(["python3", str(ROOT / "bench" / "sweep_report.py"), "--out", str(tmp_path / "o"), str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "bad.jsonl:2: not JSON" in r.stderr
