#!/usr/bin/env python3
"""Build the DeepSeek-V4.1 golden fixtures (tests/data/golden/README.md, "V4.1").

    python3 tools/make_golden_v41.py --out tests/data/golden [--only a,b]

Runs the V4.1 reference (transformers' deepseek_v41 at 0a2080b, set up as docs/MODEL-V41.md says)
on CPU, fp32, eager attention, one thread, with fixed seeds. Per tiny config (golden_lib/v41configs):
  v41_<x>/          transformers layout as save_pretrained writes it (flat deepseek_v41_text
                    config.json, model.safetensors), engram_sidecar.json, inputs.json,
                    logits_<seq>.npy, meta.json
  v41_<x>_release/  the same weights in the release layout (composite config.json, FP8 32x32 /
                    FP4 shards + index), the same inputs, logits and sidecar, meta.json
  v41_qat/          the reference's QAT round trips on edge-case and random rows (golden_lib/v41qat.py)
  v41_engram/       the reference's Engram row ids on random token streams (golden_lib/v41hash.py)
Logits are ONE cache-path call per sequence. Each sequence is drawn, then redrawn until the
reference's chunked / prefill+decode / token-by-token paths agree with it to 1e-4 and no top-k
boundary is near a tie (golden_lib/v41checks.py); meta.json records every rejected draw.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_lib import v41checks, v41configs, v41dspark, v41engram, v41hash, v41qat, v41ref, v41release, v41weights  # noqa: E402

REF_COMMIT = "0a2080b43eb64e6d448186a4f3f0bc9c618f4797"
FIXTURES = {"a": ("v41_a", v41configs.TINY_A, 11), "b": ("v41_b", v41configs.TINY_B, 23)}
SEQ_LENS = {"t1": 1, "t9": 9, "t37": 37, "t161": 161}


def write_sidecar(d: Path, spec: dict) -> None:
    c = spec["engram_compressed_vocab_size"]
    v41engram.write(d / v41engram.FILE_NAME, v41engram.synthetic(spec["vocab_size"], c),
                    f"synthetic: class(t) = t mod {c}", None, spec["engram_layer_ids"], spec["engram_max_ngram_size"])


def pick_sequence(model, spec: dict, seed: int, t: int, max_attempts: int) -> tuple[list[int], torch.Tensor, dict]:
    rejected = []
    for attempt in range(max_attempts):
        rng = np.random.default_rng([seed, t, attempt])
        ids = rng.integers(0, spec["vocab_size"], size=t).tolist()
        full, gaps, diffs = v41checks.full_and_paths(model, ids)
        worst = max(diffs.values(), default=0.0)
        if worst <= v41checks.TOL_PATHS and v41checks.margins_ok(gaps):
            return ids, full, {"attempt": attempt, "paths_max_abs_diff": diffs, **gaps, "rejected": rejected}
        rejected.append({"attempt": attempt, "worst_path_diff": worst,
                         **{k: v for k, v in gaps.items() if k.startswith("min_")}})
        print(f"    t={t} attempt {attempt} rejected: paths {worst:.2e}, "
              f"gaps index {gaps['min_rel_gap_index']:.1e} cand {gaps['min_rel_gap_candidate']:.1e} "
              f"router {gaps['min_rel_gap_router']:.1e}")
    raise RuntimeError(f"no sequence of length {t} passed in {max_attempts} attempts")


def build_fixture(out: Path, key: str, max_attempts: int) -> None:
    name, spec, seed = FIXTURES[key]
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    model = v41weights.build_model(spec, seed)
    v41weights.save_hf(model, d)
    loaded = v41weights.load_hf(d, spec)
    v41weights.assert_same_weights(model, loaded, name)
    cfg = loaded.config
    print(f"[{name}] seed={seed} roles: {v41configs.roles(spec)} "
          f"params={sum(p.numel() for p in loaded.parameters())} engram rows {cfg.engram_num_embeddings}")
    write_sidecar(d, spec)
    inputs, checks = {}, {}
    clamp = v41checks.ClampMonitor(loaded)
    for label, t in SEQ_LENS.items():
        t0 = time.time()
        ids, full, rep = pick_sequence(loaded, spec, seed, t, max_attempts)
        np.save(d / f"logits_{label}.npy", full.numpy().astype(np.float32))
        inputs[label] = ids
        checks[label] = {"T": t, "logit_std": float(full.std()), **rep}
        print(f"  {label:5s} T={t:3d} attempt {rep['attempt']} paths "
              + " ".join(f"{k}={v:.1e}" for k, v in rep["paths_max_abs_diff"].items())
              + f" | gaps index {rep['min_rel_gap_index']:.1e} ({rep['n_index_selections']}) cand "
              f"{rep['min_rel_gap_candidate']:.1e} router {rep['min_rel_gap_router']:.1e}, "
              f"filtered queries {rep['candidate_filtered_queries']} ({time.time() - t0:.0f} s)")
    clamp_stats = clamp.close()
    longest = max(SEQ_LENS, key=SEQ_LENS.get)
    no_cache = v41checks.no_cache_diff(loaded, inputs[longest], torch.from_numpy(np.load(d / f"logits_{longest}.npy")))
    print(f"  clamp {clamp_stats}; no-cache forward vs cache path ({longest}): {no_cache:.3f}")
    (d / "inputs.json").write_text(json.dumps(inputs) + "\n")
    meta = {"reference": f"huggingface/transformers@{REF_COMMIT} deepseek_v41 on transformers 5.23.0",
            "torch": torch.__version__, "threads": torch.get_num_threads(), "seed": seed,
            "roles": v41configs.roles(spec), "spec": spec, "engram_num_embeddings": list(cfg.engram_num_embeddings),
            "clamp": clamp_stats, "no_cache_path_vs_cache_max_abs": no_cache, "checks": checks}
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    build_release(out, key, loaded, inputs, longest)


def rebuild_release(out: Path, key: str) -> None:
    """The release fixture again from an existing transformers fixture (no sequence search)."""
    name, spec, _ = FIXTURES[key]
    loaded = v41weights.load_hf(out / name, spec)
    inputs = json.loads((out / name / "inputs.json").read_text())
    build_release(out, key, loaded, inputs, max(SEQ_LENS, key=SEQ_LENS.get))


def build_release(out: Path, key: str, loaded, inputs: dict, longest: str) -> None:
    """Same weights, release layout (v41_a: plus DSpark stages and their goldens); proves the decoded
    shards reproduce the logits exactly."""
    name, spec, _ = FIXTURES[key]
    d, src = out / f"{name}_release", out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tensors = v41release.encode(loaded.state_dict())
    dspark_meta = None
    if key == "a":
        mtp, dspark_meta = v41dspark.build(d, loaded, spec, inputs[v41dspark.SEQ])
        tensors.update(v41dspark.as_release(mtp))
    v41release.write(d, tensors, v41release.release_config(loaded.config, spec, 3 if dspark_meta else 0),
                     loaded.config.num_hidden_layers)
    decoded = v41release.decode(v41release.read(d))
    ref_sd = loaded.state_dict()
    assert decoded.keys() == ref_sd.keys(), sorted(set(decoded) ^ set(ref_sd))
    for k, v in decoded.items():
        assert torch.equal(v.float(), ref_sd[k].float()), k
    m, _ = v41ref.load()
    again = m.DeepseekV41ForCausalLM(loaded.config).eval()
    again.load_state_dict(decoded, strict=True)
    v41weights.bind(again, spec)
    diff = float((v41ref.run_chunks(again, inputs[longest], [len(inputs[longest])])
                  - torch.from_numpy(np.load(src / f"logits_{longest}.npy"))).abs().max())
    assert diff == 0.0, diff
    for f in ["inputs.json", v41engram.FILE_NAME] + [f"logits_{k}.npy" for k in inputs]:
        shutil.copy(src / f, d / f)
    meta = {"weights_of": name, "release_decode_equals_transformers_weights": True,
            f"logits_{longest}_rerun_from_release_max_abs": diff,
            "tensors": len(tensors), "dtypes": sorted({v[0] for v in tensors.values()})}
    if dspark_meta:
        meta["dspark"] = dspark_meta
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"  [{name}_release] {len(tensors)} tensors; decoded == transformers weights; rerun diff {diff}")


def summary(out: Path) -> None:
    for d in sorted(out.glob("v41_*")):
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        print(f"  {size:>10,d}  {d.name}/")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("tests/data/golden"))
    ap.add_argument("--only", default="a,b,qat,engram", help="comma list of fixtures (a, b, qat, engram, sidecars)")
    ap.add_argument("--max-attempts", type=int, default=40)
    args = ap.parse_args()
    v41ref.load()
    torch.set_num_threads(1)   # also makes every path's summation order reproducible run to run
    t0 = time.time()
    for key in args.only.split(","):
        if key == "qat":
            v41qat.build(args.out)
        elif key == "engram":
            v41hash.build(args.out)
        elif key.startswith("release_"):   # release_a / release_b: rebuild from the transformers fixture
            rebuild_release(args.out, key[len("release_"):])
        elif key == "sidecars":   # rewrite only the sidecars of existing fixtures
            for name, spec, _ in FIXTURES.values():
                for d in (args.out / name, args.out / f"{name}_release"):
                    write_sidecar(d, spec)
        else:
            build_fixture(args.out, key, args.max_attempts)
    summary(args.out)
    print(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
