"""The golden fixtures under tests/data/golden are present, self-consistent and loadable with numpy.

Built by tools/make_golden.py (see tests/data/golden/README.md). Each fixture is skipped when its
folder is absent. The optional re-run against transformers is skipped without torch/transformers.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
HF_FIXTURES = ["tiny", "tiny_clamp"]
ALL_FIXTURES = HF_FIXTURES + ["tiny_official"]
ELEM = {"BF16": 2, "F32": 4, "I64": 8, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def fixture_dir(name: str) -> Path:
    d = GOLDEN / name
    if not (d / "config.json").is_file():
        pytest.skip(f"golden fixture {d} absent (run tools/make_golden.py)")
    return d


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], np.ndarray]]:
    """name -> (dtype string, shape, raw bytes as uint8). Checks offsets tile the data area."""
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = np.frombuffer(blob, np.uint8, offset=8 + n)
    out, spans = {}, []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert info["dtype"] in ELEM, f"{path.name}:{name}: unexpected dtype {info['dtype']}"
        assert end - begin == ELEM[info["dtype"]] * int(np.prod(info["shape"])), f"{path.name}:{name}: size"
        spans.append((begin, end))
        out[name] = (info["dtype"], info["shape"], data[begin:end])
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == data.size, f"{path.name}: data area not covered"
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), f"{path.name}: gaps/overlaps"
    return out


def to_f32(dtype: str, shape, raw: np.ndarray) -> np.ndarray:
    if dtype == "F32":
        return raw.view(np.float32).reshape(shape)
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F8_E8M0":
        return np.ldexp(np.float32(1), raw.astype(np.int32) - 127).astype(np.float32).reshape(shape)
    if dtype == "F8_E4M3":
        s = np.where(raw & 0x80, -1.0, 1.0)
        e = (raw >> 3) & 0xF
        m = (raw & 7).astype(np.float64)
        v = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * np.exp2(e.astype(np.float64) - 7))
        v = np.where((e == 15) & (m == 7), np.nan, v)
        return (s * v).astype(np.float32).reshape(shape)
    raise ValueError(dtype)


def load_inputs(d: Path) -> dict[str, list[int]]:
    inputs = json.loads((d / "inputs.json").read_text())
    assert set(inputs) == {"long", "medium", "short"}
    return inputs


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_logits_match_inputs(name):
    d = fixture_dir(name)
    cfg = json.loads((d / "config.json").read_text())
    vocab = cfg["vocab_size"]
    for seq, ids in load_inputs(d).items():
        assert all(isinstance(i, int) and 0 <= i < vocab for i in ids)
        logits = np.load(d / f"logits_{seq}.npy")
        assert logits.dtype == np.float32 and logits.shape == (len(ids), vocab), (seq, logits.shape)
        assert np.isfinite(logits).all() and logits.std() > 0.1
        if name == "tiny_official":
            mtp = np.load(d / f"mtp_logits_{seq}.npy")
            assert mtp.dtype == np.float32 and mtp.shape == (len(ids) - 1, vocab)
            assert np.isfinite(mtp).all() and mtp.std() > 0.1


@pytest.mark.parametrize("name", HF_FIXTURES)
def test_hf_checkpoint_layout(name):
    d = fixture_dir(name)
    cfg = json.loads((d / "config.json").read_text())
    tensors = read_safetensors(d / "model.safetensors")
    n_layers = cfg["num_hidden_layers"]
    assert len(cfg["layer_types"]) == n_layers == len(cfg["mlp_layer_types"])
    for kind in ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"):
        assert kind in cfg["layer_types"]
    assert {"hash_moe", "moe"} <= set(cfg["mlp_layer_types"])
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    for L, mlp in enumerate(cfg["mlp_layer_types"]):
        p = f"model.layers.{L}.mlp."
        assert tensors[p + "experts.gate_up_proj"][1] == [E, 2 * cfg["moe_intermediate_size"], cfg["hidden_size"]]
        if mlp == "hash_moe":
            dt, shape, raw = tensors[p + "gate.tid2eid"]
            ids = raw.view(np.int64).reshape(shape)
            assert dt == "I64" and shape == [cfg["vocab_size"], k]
            assert ids.min() >= 0 and ids.max() < E
            assert all(len(set(r)) == k for r in ids.tolist()), "tid2eid rows must be distinct experts"
        else:
            bias = to_f32(*tensors[p + "gate.e_score_correction_bias"])
            assert np.abs(bias).max() > 0
    # Parameters that transformers initialises to 0/1 must have been randomised.
    for key in ("self_attn.sinks", "attn_hc.base", "attn_hc.scale", "ffn_hc.base"):
        v = to_f32(*tensors[f"model.layers.0.{key}"])
        assert not np.all(v == 0) and not np.all(v == 1), key
    assert sum(f"model.layers.{L}.self_attn.compressor.position_bias" in tensors for L in range(n_layers)) >= 2


def test_debug_dump():
    d = fixture_dir("tiny")
    path = d / "debug_short.npz"
    if not path.is_file():
        pytest.skip("debug_short.npz absent")
    cfg = json.loads((d / "config.json").read_text())
    T, D, n = len(load_inputs(d)["short"]), cfg["hidden_size"], cfg["hc_mult"]
    dbg = np.load(path)
    assert dbg["embed"].shape == (T, D)
    for L in range(cfg["num_hidden_layers"]):
        assert dbg[f"streams_{L}"].shape == (T, n, D)
        assert dbg[f"attn_out_{L}"].shape == (T, D) and dbg[f"moe_out_{L}"].shape == (T, D)
    assert dbg["final_hidden"].shape == (T, D)
    # final_hidden -> lm_head reproduces the stored logits.
    head = to_f32(*read_safetensors(d / "model.safetensors")["lm_head.weight"])
    logits = np.load(d / "logits_short.npy")
    np.testing.assert_allclose(dbg["final_hidden"] @ head.T, logits, atol=2e-4, rtol=1e-4)


def test_hf_rerun_matches_short_logits():
    d = fixture_dir("tiny")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        pytest.skip("transformers without DeepseekV4")
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                                attn_implementation="eager").eval()
    ids = load_inputs(d)["short"]
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    np.testing.assert_allclose(got, np.load(d / "logits_short.npy"), atol=1e-4, rtol=0)
