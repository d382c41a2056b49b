"""Issue #20: hostile checkpoint, config and tokenizer files through the Python API (and the
detokenize CLI). Each is a typed deepinfer error naming the file and field or tensor, within a
time budget, and the process carries on."""
import json
import os
import shutil
import struct
import subprocess
import time

import pytest

from deepinfer import LLM, SamplingParams, Tokenizer
from deepinfer import _C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT = os.path.join(ROOT, "models", "random")  # the random test model (build.sh)


def _need_default():
    if not os.path.exists(os.path.join(DEFAULT, "config.json")):
        pytest.skip("models/random absent (./build.sh or `deepinfer make-random-model`)")


def _copy_model(tmp_path, edit_config=None, copy_shards=False):
    """A folder with the default model's files (shards linked unless copied), config edited."""
    _need_default()
    d = tmp_path / "model"
    d.mkdir()
    for name in os.listdir(DEFAULT):
        src = os.path.join(DEFAULT, name)
        if name.endswith(".safetensors") and not copy_shards:
            os.symlink(src, d / name)
        else:
            shutil.copy(src, d / name)
    if edit_config:
        cfg = json.loads((d / "config.json").read_text())
        text = edit_config(cfg)
        (d / "config.json").write_text(text if isinstance(text, str) else json.dumps(cfg))
    return d


def _error(exc_type, fn, budget_s=30.0):
    t0 = time.time()
    with pytest.raises(exc_type) as e:
        fn()
    assert time.time() - t0 < budget_s
    return str(e.value)


@pytest.mark.parametrize("field,value,needle", [
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [0, 0]},
     "field 'quantization_config.weight_block_size': block edge must be in [1, 4096], got [0,0]"),
    ("hc_sinkhorn_iters", 1e12, "field 'hc_sinkhorn_iters': must be <= 10000"),
    ("rms_norm_eps", -1, "field 'rms_norm_eps': must be > 0"),
    ("rope_theta", 0, "field 'rope_theta': must be > 0"),
    ("eos_token_id", 2 ** 40, "field 'eos_token_id'"),
])
def test_bad_config_values(tmp_path, field, value, needle):
    def edit(cfg):
        cfg[field] = value
    d = _copy_model(tmp_path, edit)
    msg = _error(_C.ConfigError, lambda: LLM(str(d)))
    assert "config.json" in msg and needle in msg, msg


def test_deep_config_value(tmp_path):
    def edit(cfg):
        cfg["vocab_size"] = "@@"
        return json.dumps(cfg).replace('"@@"', "[" * 100000 + "]" * 100000)
    d = _copy_model(tmp_path, edit)
    msg = _error(_C.ConfigError, lambda: LLM(str(d)))
    assert "config.json: not valid JSON: nested deeper than 256 levels" in msg, msg


def _tensor_offsets(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return 8 + n, header


def test_nan_weight_names_the_tensor(tmp_path):
    d = _copy_model(tmp_path, copy_shards=True)
    shard = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))[0]
    start, header = _tensor_offsets(d / shard)
    name, info = next((k, v) for k, v in sorted(header.items())
                      if k != "__metadata__" and v["dtype"] in ("BF16", "F32") and v["data_offsets"][1] > 64)
    nan = b"\xc0\x7f" if info["dtype"] == "BF16" else b"\x00\x00\xc0\x7f"
    with open(d / shard, "r+b") as f:
        f.seek(start + info["data_offsets"][0] + 3 * len(nan))
        f.write(nan)
    msg = _error(_C.CheckpointError, lambda: LLM(str(d)))
    assert f"{shard}: tensor '{name}' holds NaN at element 3" in msg, msg


def test_corrupt_header_bytes_give_checkpoint_error(tmp_path):
    d = _copy_model(tmp_path)
    shard = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))[0]
    os.unlink(d / shard)
    header = b'{"w": \xff\xfe\x80 }'
    (d / shard).write_bytes(struct.pack("<Q", len(header)) + header)
    msg = _error(_C.CheckpointError, lambda: LLM(str(d)))  # not UnicodeDecodeError
    assert "corrupt header (not valid JSON)" in msg and "\\xff" in msg, msg


def test_named_pipe_shard_does_not_hang(tmp_path):
    d = _copy_model(tmp_path)
    shard = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))[0]
    os.unlink(d / shard)
    os.mkfifo(d / shard)
    msg = _error(_C.CheckpointError, lambda: LLM(str(d)), budget_s=10)
    assert "is a named pipe, not a regular file" in msg, msg
    # The process carries on: the real model still loads and runs.
    out = LLM(DEFAULT).generate(["Hi"], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.error is None and len(out.outputs[0].token_ids) == 2


def _tokenizer_dir(tmp_path, edit):
    _need_default()
    d = tmp_path / "tok"
    d.mkdir()
    tj = json.loads(open(os.path.join(DEFAULT, "tokenizer.json"), encoding="utf-8").read())
    text = edit(tj)
    (d / "tokenizer.json").write_text(text if isinstance(text, str) else json.dumps(tj), encoding="utf-8")
    return d


def test_tokenizer_negative_and_huge_ids(tmp_path):
    def neg(tj):
        tj["added_tokens"][0]["id"] = -5
    msg = _error(_C.TokenizerError, lambda: Tokenizer.from_file(str(_tokenizer_dir(tmp_path, neg))))
    assert "added_tokens[0].id: expected a token id in [0, 4194304), got -5" in msg, msg


def test_tokenizer_deep_sequence(tmp_path):
    def deep(tj):
        leaf = json.dumps(tj["pre_tokenizer"])
        tj["pre_tokenizer"] = "@@"
        seq = '{"type": "Sequence", "pretokenizers": ['
        return json.dumps(tj).replace('"@@"', seq * 100000 + leaf + "]}" * 100000)
    msg = _error(_C.TokenizerError, lambda: Tokenizer.from_file(str(_tokenizer_dir(tmp_path, deep))))
    assert "malformed JSON: nested deeper than 256 levels" in msg, msg


def test_python_decode_refuses_huge_and_float_ids():
    _need_default()
    tok = Tokenizer.from_file(os.path.join(DEFAULT, "tokenizer.json"))
    with pytest.raises(ValueError, match=r"ids\[1\]=1099511627776 is outside"):
        tok.decode([65, 2 ** 40])
    with pytest.raises(ValueError, match=r"ids\[0\] must be an integer, got float"):
        tok.decode([65.0])


def test_cli_detokenize_refuses_huge_ids(tmp_path):
    _need_default()
    exe = os.path.join(os.environ.get("DEEPINFER_BINARY_DIR", os.path.join(ROOT, "build")), "deepinfer")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} not built")
    r = subprocess.run([exe, "detokenize", "--tokenizer", os.path.join(DEFAULT, "tokenizer.json")],
                       input="[65, 1099511627776]\n", capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "id 1 is 1099511627776, not an integer token id" in r.stderr, r.stderr
