"""The golden fixtures under tests/data/golden are present, self-consistent and loadable with numpy.

Built by tools/make_golden.py (see tests/data/golden/README.md). Each fixture is skipped when its
folder is absent. The optional re-run against transformers is skipped without torch/transformers.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden"
sys.path.insert(0, str(REPO / "tools"))
from golden_lib import names  # noqa: E402  (pure Python name maps)
HF_FIXTURES = ["tiny", "tiny_clamp", "tiny_prod"]
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


def fp4_decode(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """I8 [out, in/2] (element 2k low nibble, 2k+1 high) + E8M0 [out, in/32] -> f32 [out, in]."""
    b = packed.view(np.uint8)
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)
    return E2M1[codes] * np.repeat(to_f32("F8_E8M0", scales.shape, scales), 32, axis=1)


def fp8_decode(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """F8_E4M3 [out, in] + E8M0 [ceil(out/128), ceil(in/128)] -> f32 [out, in]."""
    s = to_f32("F8_E8M0", scales.shape, scales)
    s = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[: codes.shape[0], : codes.shape[1]]
    return to_f32("F8_E4M3", codes.shape, codes) * s


def to_f32(dtype: str, shape, raw: np.ndarray) -> np.ndarray:
    raw = raw.view(np.uint8)
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
    torch = pytest.importorskip("torch", exc_type=ImportError)
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        pytest.skip("transformers without DeepseekV4")
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                                attn_implementation="eager").eval()
    ids = load_inputs(d)["short"]
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    np.testing.assert_allclose(got, np.load(d / "logits_short.npy"), atol=1e-4, rtol=0)


def test_prod_rerun_matches_logits_and_chain():
    """tiny_prod re-run under golden_lib/production.py: the stored logits (row-wise, the rounding is
    discontinuous: see tests/data/golden/tiny_prod/README.md) and the stored greedy chain's first steps."""
    d = fixture_dir("tiny_prod")
    torch = pytest.importorskip("torch", exc_type=ImportError)
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        pytest.skip("transformers without DeepseekV4")
    from golden_lib import production
    torch.set_num_threads(1)  # the fixture was made with one thread
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                                attn_implementation="eager").eval()
    inputs = load_inputs(d)
    meta = json.loads((d / "meta.json").read_text())
    with production.production_rounding(model) as hits, torch.no_grad():
        got = model(input_ids=torch.tensor([inputs["short"]]), use_cache=False).logits[0].numpy()
        chain, _ = production.greedy_chain(model, inputs["short"], 8)
    assert sum(hits.values()) > 0, "production rounding never applied"
    ref = np.load(d / "logits_short.npy")
    rows_close = np.mean(np.abs(got - ref).max(axis=1) <= 1e-3)
    assert rows_close >= 0.95, f"only {rows_close:.1%} of rows within 1e-3"
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.95
    assert meta["greedy_chain"]["prompt"] == "short"
    assert chain == meta["greedy_chain"]["generated_ids"][:8]


FP8_LEAVES = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
              "attn.indexer.wq_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight",
              "shared_experts.w3.weight", "e_proj.weight", "h_proj.weight")
F32_LEAVES = ("hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
              "hc_head_fn", "hc_head_base", "hc_head_scale", "attn_sink", "ape", "gate.bias")


def official_tensors(d: Path) -> dict:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = read_safetensors(d / shard)
        assert all(index["weight_map"][n] == shard for n in part), shard
        tensors.update(part)
    assert tensors.keys() == index["weight_map"].keys()
    return tensors


def decode_official(tensors: dict) -> dict[str, np.ndarray]:
    """Every non-scale release tensor decoded to f32 (I64 kept as int64)."""
    out = {}
    for name, (dt, shape, raw) in tensors.items():
        if dt == "F8_E8M0":
            continue
        if dt == "F8_E4M3":
            out[name] = fp8_decode(raw.reshape(shape), tensors[name[:-7] + ".scale"][2].reshape(
                tensors[name[:-7] + ".scale"][1]))
        elif dt == "I8":
            sc = tensors[name[:-7] + ".scale"]
            out[name] = fp4_decode(raw.view(np.int8).reshape(shape), sc[2].reshape(sc[1]))
        elif dt == "I64":
            out[name] = raw.view(np.int64).reshape(shape)
        else:
            out[name] = to_f32(dt, shape, raw)
    return out


def test_official_layout_and_dtypes():
    d = fixture_dir("tiny_official")
    cfg = json.loads((d / "config.json").read_text())
    n_layers, n_mtp = cfg["num_hidden_layers"], cfg["num_nextn_predict_layers"]
    assert n_mtp == 1 and len(cfg["compress_ratios"]) == n_layers + n_mtp and cfg["compress_ratios"][-1] == 0
    assert cfg["quantization_config"]["fmt"] == "e4m3" and cfg["quantization_config"]["scale_fmt"] == "ue8m0"
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128] and cfg["expert_dtype"] == "fp4"
    tensors = official_tensors(d)
    for name, (dt, shape, _) in tensors.items():
        if name.endswith(".scale"):
            w_dt, w_shape, _ = tensors[name[:-6] + ".weight"]
            assert dt == "F8_E8M0", name
            if w_dt == "F8_E4M3":
                assert shape == [-(-w_shape[0] // 128), -(-w_shape[1] // 128)], name
            else:
                assert w_dt == "I8" and shape == [w_shape[0], w_shape[1] * 2 // 32], name
        elif ".ffn.experts." in name:
            assert dt == "I8", name
        elif name.endswith(FP8_LEAVES):
            assert dt == "F8_E4M3", name
        elif name.endswith(F32_LEAVES):
            assert dt == "F32", name
        elif name.endswith("tid2eid"):
            assert dt == "I64", name
        else:
            assert dt == "BF16", name
    assert sum(n.startswith("mtp.0.") for n in tensors) > 0
    assert not any(n.startswith("mtp.0.attn.compressor") for n in tensors), "MTP block is sliding-only"


def test_official_decodes_to_model_a():
    """Decoded release weights = model A's (exact for BF16/F32/I64, within the format's rounding
    for FP8/FP4)."""
    d_off, d_a = fixture_dir("tiny_official"), fixture_dir("tiny")
    dec = decode_official(official_tensors(d_off))
    hf = {n: to_f32(dt, shape, raw) if dt != "I64" else raw.view(np.int64).reshape(shape)
          for n, (dt, shape, raw) in read_safetensors(d_a / "model.safetensors").items()}
    cfg = json.loads((d_a / "config.json").read_text())
    inter = cfg["moe_intermediate_size"]
    pairs = [(rel, hf_name) for hf_name, (rel, _) in names.GLOBAL_MAP.items()]
    for L in range(cfg["num_hidden_layers"]):
        for rel, (off, _) in names.LAYER_MAP.items():
            if f"model.layers.{L}.{rel}" in hf:
                pairs.append((f"layers.{L}.{off}", f"model.layers.{L}.{rel}"))
    for off, hf_name in pairs:
        got, want = dec[off], hf[hf_name]
        if off.endswith(FP8_LEAVES):   # e4m3: 3 mantissa bits -> relative error <= 2^-4 (+ subnormals)
            assert np.all(np.abs(got - want) <= np.abs(want) / 16 + 1e-6), off
        else:
            np.testing.assert_array_equal(got, want, err_msg=off)
    for L in range(cfg["num_hidden_layers"]):
        gate_up = hf[f"model.layers.{L}.mlp.experts.gate_up_proj"]
        for e in range(cfg["n_routed_experts"]):
            for w, want in (("w1", gate_up[e, :inter]), ("w3", gate_up[e, inter:]),
                            ("w2", hf[f"model.layers.{L}.mlp.experts.down_proj"][e])):
                got = dec[f"layers.{L}.ffn.experts.{e}.{w}.weight"]
                amax = np.abs(want).reshape(want.shape[0], -1, 32).max(-1, keepdims=True)
                # scale s < amax/3 (smallest power of two with amax <= 6s); e2m1 gaps <= 2 -> |err| <= s
                bound = np.repeat(amax / 3, 32, axis=-1).reshape(want.shape)
                assert np.all(np.abs(got - want) <= bound), (L, e, w)


def test_official_rerun_matches_short_logits():
    """transformers on the numpy-decoded release weights reproduces tiny_official/logits_short."""
    d_off, d_a = fixture_dir("tiny_official"), fixture_dir("tiny")
    torch = pytest.importorskip("torch", exc_type=ImportError)
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    if not hasattr(transformers, "DeepseekV4ForCausalLM"):
        pytest.skip("transformers without DeepseekV4")
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(d_a, dtype=torch.float32,
                                                                attn_implementation="eager").eval()
    dec = decode_official(official_tensors(d_off))
    sd = model.state_dict()
    inter = model.config.moe_intermediate_size
    new = {hf_name: dec[rel] for hf_name, (rel, _) in names.GLOBAL_MAP.items()}
    for L in range(model.config.num_hidden_layers):
        for rel, (off, _) in names.LAYER_MAP.items():
            if f"model.layers.{L}.{rel}" in sd:
                new[f"model.layers.{L}.{rel}"] = dec[f"layers.{L}.{off}"]
        E = model.config.n_routed_experts
        new[f"model.layers.{L}.mlp.experts.gate_up_proj"] = np.stack([np.concatenate(
            [dec[f"layers.{L}.ffn.experts.{e}.w1.weight"], dec[f"layers.{L}.ffn.experts.{e}.w3.weight"]])
            for e in range(E)])
        new[f"model.layers.{L}.mlp.experts.down_proj"] = np.stack(
            [dec[f"layers.{L}.ffn.experts.{e}.w2.weight"] for e in range(E)])
    assert new.keys() == sd.keys() and 2 * inter == new["model.layers.0.mlp.experts.gate_up_proj"].shape[1]
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in new.items()})
    ids = load_inputs(d_off)["short"]
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    np.testing.assert_allclose(got, np.load(d_off / "logits_short.npy"), atol=1e-4, rtol=0)
