"""The DeepSeek-V4.1 golden fixtures (tests/data/golden/v41_*) are complete and self-consistent.

Built by tools/make_golden_v41.py (tests/data/golden/README.md, "V4.1"). Pure numpy: decodes both
checkpoint layouts and checks they hold the same weights bit for bit, that logits, inputs and the
Engram class map fit the config, and that meta.json records passing self-consistency numbers.
When the git-ignored V4.1 reference is set up (.v41ref/site), the short sequences are re-run.
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
FIXTURES = ["v41_a", "v41_b"]
SEQS = {"t1": 1, "t9": 9, "t37": 37, "t161": 161}
ELEM = {"BF16": 2, "F32": 4, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
MAX_FIXTURE_BYTES = 2_000_000


def fixture(name: str) -> Path:
    d = GOLDEN / name
    if not (d / "config.json").is_file():
        pytest.skip(f"golden fixture {d} absent (run tools/make_golden_v41.py)")
    return d


def read_st(path: Path) -> dict:
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = np.frombuffer(blob, np.uint8, offset=8 + n)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        assert e - b == ELEM[info["dtype"]] * int(np.prod(info["shape"])), name
        out[name] = (info["dtype"], info["shape"], data[b:e])
    return out


def f32(dtype: str, shape, raw: np.ndarray) -> np.ndarray:
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
        assert not np.any((e == 15) & (m == 7)), "NaN code in an FP8 weight"
        return (s * v).astype(np.float32).reshape(shape)
    raise ValueError(dtype)


def decode_release(tensors: dict) -> dict:
    """Release tensors -> name -> f32 values (FP8 32x32 or 1x32 blocks, FP4 per 32 along K)."""
    out = {}
    for name, (dt, shape, raw) in tensors.items():
        if dt == "F8_E8M0":
            continue
        scale = tensors.get(name[: -len(".weight")] + ".scale")
        if dt == "F8_E4M3":
            bo = 1 if name.endswith("engram.embed.weight") else 32
            s = f32(*scale)
            assert s.shape == (-(-shape[0] // bo), -(-shape[1] // 32)), name
            s = np.repeat(np.repeat(s, bo, 0), 32, 1)[: shape[0], : shape[1]]
            out[name] = f32(dt, shape, raw) * s
        elif dt == "I8":
            b = raw.view(np.uint8).reshape(shape)
            codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(shape[0], -1)   # element 2k = low nibble
            s = f32(*scale)
            assert s.shape == (shape[0], shape[1] * 2 // 32), name
            out[name] = E2M1[codes] * np.repeat(s, 32, axis=1)
        else:
            out[name] = f32(dt, shape, raw)
    return out


def release_name(hf: str) -> str:
    return {"model.embed.weight": "embed.weight", "model.norm.weight": "norm.weight",
            "lm_head.weight": "head.weight"}.get(hf, hf[len("model."):])


@pytest.mark.parametrize("name", FIXTURES)
def test_sizes_and_files(name):
    for d in (fixture(name), fixture(name + "_release")):
        total = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
        assert total < MAX_FIXTURE_BYTES, (d.name, total)
        for f in ["config.json", "inputs.json", "meta.json", "engram_sidecar.json"] + [f"logits_{s}.npy" for s in SEQS]:
            assert (d / f).is_file(), (d.name, f)


@pytest.mark.parametrize("name", FIXTURES)
def test_both_layouts_hold_the_same_weights(name):
    hf = read_st(fixture(name) / "model.safetensors")
    d = fixture(name + "_release")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    rel = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = read_st(d / shard)
        assert all(index["weight_map"][n] == shard for n in part)
        rel.update(part)
    assert set(index["weight_map"]) == set(rel)
    dec = decode_release(rel)
    hf_names = {n for n in hf if not n.endswith("engram.embed.scale")}
    assert {release_name(n) for n in hf_names} == {n for n in dec if not n.startswith("mtp.")}
    for n in hf_names:
        want = f32(*hf[n])
        got = dec[release_name(n)]
        assert got.shape == want.shape and np.array_equal(got, want), n
        dt = rel[release_name(n)][0]
        if ".ffn.experts." in n:
            assert dt == "I8", n
        elif n.endswith(("attn.wq_a.weight", "attn.wq_b.weight", "attn.wo_a.weight", "attn.wo_b.weight",
                         "indexer.wq_b.weight", "shared_experts.w2.weight", "engram.wkv.weight", "engram.embed.weight")):
            assert dt == "F8_E4M3", n
    for n in hf:   # transformers ignores the scale of a float Engram table: ones
        if n.endswith("engram.embed.scale"):
            assert np.all(f32(*hf[n]) == 1.0)


@pytest.mark.parametrize("name", FIXTURES)
def test_configs(name):
    flat = json.loads((fixture(name) / "config.json").read_text())
    comp = json.loads((fixture(name + "_release") / "config.json").read_text())
    text = comp["text_config"]
    assert flat["model_type"] == "deepseek_v41_text" and comp["model_type"] == "deepseek_v41"
    assert "engram_pad_id" in flat and "engram_pad_token_id" in text and "engram_pad_id" not in text
    assert comp["quantization_config"]["weight_block_size"] == [32, 32]
    assert comp["quantization_config"]["expert_dtype"] == "fp4"
    for k in ("kv_source_layer_ids", "index_source_layer_ids", "candidate_source_layer_id",
              "engram_layer_ids", "engram_num_embeddings", "sliding_window", "swiglu_limit", "gate_temp"):
        assert flat[k] == text[k], k
    n = flat["num_hidden_layers"]
    assert flat["compress_ratios"] == text["compress_ratios"][:n]
    assert text["compress_ratios"][n:] == [0] * text["num_nextn_predict_layers"]  # DSpark stages: ratio 0
    kv = flat["kv_source_layer_ids"]
    assert flat["layer_types"] == ["shared_compressed_attention" if i in kv else "sliding_attention"
                                   for i in range(flat["num_hidden_layers"])]
    assert flat["index_n_heads"] >= 16  # fewer gives exact top-k ties on random weights


@pytest.mark.parametrize("name", FIXTURES)
def test_inputs_logits_classes(name):
    d = fixture(name)
    cfg = json.loads((d / "config.json").read_text())
    inputs = json.loads((d / "inputs.json").read_text())
    assert {k: len(v) for k, v in inputs.items()} == SEQS
    for seq, ids in inputs.items():
        assert all(0 <= i < cfg["vocab_size"] for i in ids)
        logits = np.load(d / f"logits_{seq}.npy")
        assert logits.dtype == np.float32 and logits.shape == (len(ids), cfg["vocab_size"])
        assert np.isfinite(logits).all() and logits.std() > 0.1
        assert np.array_equal(logits, np.load(fixture(name + "_release") / f"logits_{seq}.npy"))
    side = json.loads((d / "engram_sidecar.json").read_text())
    assert side["format"] == "deepinfer.engram_sidecar" and side["version"] == 1
    assert side["max_ngram_size"] == cfg["engram_max_ngram_size"]
    assert [m["layer"] for m in side["multipliers"]] == cfg["engram_layer_ids"]
    assert side["num_ids"] == cfg["vocab_size"] and side["num_classes"] == cfg["engram_compressed_vocab_size"]
    assert side["classes"] == [t % side["num_classes"] for t in range(cfg["vocab_size"])]


@pytest.mark.parametrize("name", FIXTURES)
def test_meta_self_consistency(name):
    meta = json.loads((fixture(name) / "meta.json").read_text())
    assert meta["reference"].startswith("huggingface/transformers@0a2080b43eb64e6d448186a4f3f0bc9c618f4797")
    for seq, t in SEQS.items():
        c = meta["checks"][seq]
        assert c["T"] == t
        assert all(v <= 1e-4 for v in c["paths_max_abs_diff"].values()), (seq, c["paths_max_abs_diff"])
        assert c["min_rel_gap_index"] >= 1e-5 and c["min_rel_gap_candidate"] >= 1e-5
        assert c["min_rel_gap_router"] >= 5e-6
    assert meta["checks"]["t161"]["candidate_filtered_queries"] > 0   # the candidate filter really removed blocks
    assert meta["no_cache_path_vs_cache_max_abs"] > 0.1                # the documented no-cache bug shows
    if name == "v41_b":
        assert meta["clamp"]["gate_clamped_share"] > 0.05 and meta["clamp"]["up_clamped_share"] > 0.05


def test_dspark_goldens():
    d = fixture("v41_a_release")
    meta = json.loads((d / "meta.json").read_text())["dspark"]
    text = json.loads((d / "config.json").read_text())["text_config"]
    S, B, V, D = meta["steps"], meta["block_size"], text["vocab_size"], text["hidden_size"]
    assert text["num_nextn_predict_layers"] == 3 and B == text["dspark_block_size"]
    taps = np.fromfile(d / "dspark_t37_taps.f32", "<f4").reshape(37, 3 * D)
    anchor = np.fromfile(d / "dspark_t37_anchor.i32", "<i4")
    drafts = np.fromfile(d / "dspark_t37_drafts.i32", "<i4").reshape(S, B)
    logits = np.fromfile(d / "dspark_t37_logits.f32", "<f4").reshape(S, B, V)
    conf = np.fromfile(d / "dspark_t37_confidence.f32", "<f4").reshape(S, B)
    assert S == 37 - meta["prefill"] and anchor.shape == (S,)
    assert np.isfinite(taps).all() and np.isfinite(logits).all() and np.isfinite(conf).all()
    # Greedy drafting: draft j+1 is the argmax of block position j's logits (Markov bias included).
    assert np.array_equal(drafts, logits.argmax(-1))
    # The anchor is the target's greedy token: the argmax of the golden logits row at that position.
    target = np.load(d / "logits_t37.npy")
    assert np.array_equal(anchor, target[meta["prefill"]:].argmax(-1))
    assert meta["min_top1_top2_gap"] >= 1e-3 and meta["prefill_vs_decode_ring_max_abs"] <= 1e-5
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    for s in range(3):
        assert f"mtp.{s}.attn.wq_a.weight" in index and f"mtp.{s}.ffn.experts.0.w1.scale" in index
    assert "mtp.0.main_proj.weight" in index and "mtp.2.markov_head.head.weight" in index
    assert "mtp.2.confidence_head.proj.weight" in index and "mtp.1.main_proj.weight" not in index


def _reference_available() -> bool:
    return (REPO / ".v41ref" / "site" / "transformers" / "models" / "deepseek_v41").is_dir()


@pytest.mark.skipif(not _reference_available(), reason="V4.1 reference (.v41ref/site) not set up")
@pytest.mark.parametrize("name", FIXTURES)
def test_reference_reproduces_short_logits(name):
    pytest.importorskip("torch", exc_type=ImportError)
    import subprocess
    code = (
        "import sys, json, numpy as np, torch; sys.path.insert(0, 'tools');"
        "from golden_lib import v41ref, v41weights, v41configs; v41ref.load(); torch.set_num_threads(1);"
        f"spec = {{'v41_a': v41configs.TINY_A, 'v41_b': v41configs.TINY_B}}['{name}'];"
        f"d = 'tests/data/golden/{name}'; m = v41weights.load_hf(d, spec);"
        "ids = json.load(open(d + '/inputs.json'))['t37'];"
        "out = v41ref.run_chunks(m, ids, [len(ids)]).numpy();"
        "print(float(np.abs(out - np.load(d + '/logits_t37.npy')).max()))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout.strip().splitlines()[-1]) == 0.0
