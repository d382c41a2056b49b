"""`deepinfer make-flash-stack --family v41` and bench-flash on it (CPU, small widths): the V4.1
stack's floors follow its roles, the engine runs it end to end, and bad layer samples are refused
naming the missing source."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("DEEPINFER_BINARY_DIR", ROOT / "build")) / "deepinfer"


@pytest.fixture(scope="module")
def v41_stack(tmp_path_factory):
    if not EXE.exists():
        pytest.skip(f"{EXE} not built")
    out = tmp_path_factory.mktemp("v41") / "s"
    r = subprocess.run([str(EXE), "make-flash-stack", "--family", "v41", "--out", str(out), "--release-layers",
                        "0,1,2,20,24", "--small", "--engram-rows", "4000", "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "S S F F* Xc" in r.stdout, r.stdout
    assert "verified" in r.stdout
    return out


def test_floors_count_each_role(v41_stack):
    r = subprocess.run([str(EXE), "bench-flash", "-m", str(v41_stack), "--floors-only", "--prompt-len", "1000",
                        "--batches", "1,64", "--decode-steps", "2", "--warmup-steps", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("V4.1: 5 layers [S S F F* Xc]"), r.stdout
    dec = re.findall(r"decode B=(\d+) ctx \S+: ([\d.]+) GB -> [\d.]+ ms \(release precision ([\d.]+) GB", r.stdout)
    assert [d[0] for d in dec] == ["1", "64"]
    b1, b64 = float(dec[0][1]), float(dec[1][1])
    assert b64 > b1  # more experts touched and 64 caches
    # the release cache formats (FP8 window, FP4 entries and keys) are smaller than bf16 rows
    assert float(dec[1][2]) < b64


def test_engine_runs_the_stack_on_cpu(v41_stack):
    r = subprocess.run([str(EXE), "bench-flash", "-m", str(v41_stack), "--accelerator", "cpu", "--prompt-len", "200",
                        "--batches", "1,2", "--decode-steps", "2", "--warmup-steps", "1", "--prefill-reps", "1",
                        "--kv-cache-gib", "0.25"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"^prefill\s+1\s+200\s+[\d.]+", r.stdout, re.M), r.stdout
    assert re.search(r"^decode B=2 ctx \S+: \d+ tokens/s", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("layers,msg", [
    ("0,3", "release layer 3 reads the compressed KV of layer 2"),
    ("2,2", "strictly ascending"),
    ("0,41", "outside [0, 40)"),
])
def test_bad_layer_sample_is_refused(tmp_path, layers, msg):
    if not EXE.exists():
        pytest.skip(f"{EXE} not built")
    r = subprocess.run([str(EXE), "make-flash-stack", "--family", "v41", "--out", str(tmp_path / "x"),
                        "--release-layers", layers, "--small", "-q"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert msg in r.stderr + r.stdout


@pytest.mark.parametrize("args,msg", [
    (["--release-layers", "0,1"], "--release-layers is for --family v41"),
    (["--engram-rows", "5000"], "--engram-rows is for --family v41"),
    (["--family", "v41", "--layers", "41"], "--layers 41: V4.1-Flash has 40 layers"),
    (["--family", "v41", "--layers", "3", "--release-layers", "0,1"], "give --layers or --release-layers, not both"),
])
def test_options_that_would_be_ignored_are_refused(tmp_path, args, msg):
    if not EXE.exists():
        pytest.skip(f"{EXE} not built")
    r = subprocess.run([str(EXE), "make-flash-stack", "--out", str(tmp_path / "x"), *args, "--small", "-q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert msg in r.stderr
    assert not (tmp_path / "x").exists()  # nothing written
