"""The Engram sidecar: frozen multipliers against numpy, the class map from a real tokenizer, and
tools/make_engram_sidecar.py (docs/MODEL-V41.md, "Engram").

The multipliers are checked here ONCE against numpy's default_rng(10007 * layer): the engine only
reads them (from the sidecar, and the release's compiled into src/model/deepseek_v41/engram.h).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden"
V3_TOKENIZER = REPO.parent / "shared" / "data" / "tokenizers" / "deepseek-v3" / "tokenizer.json"
sys.path.insert(0, str(REPO / "tools"))
from golden_lib import v41engram  # noqa: E402


def numpy_multipliers(layer: int, n: int, classes: int) -> list[int]:
    bound = max(1, (np.iinfo(np.int64).max // classes) // 2)
    return (np.random.default_rng(10007 * layer).integers(0, bound, size=(n,), dtype=np.int64) * 2 + 1).tolist()


def test_release_multipliers_compiled_into_the_engine():
    src = (REPO / "src" / "model" / "deepseek_v41" / "engram.h").read_text()
    block = re.search(r"kReleaseMultipliers\[2\]\[4\] = \{(.*?)\};", src, re.S).group(1)
    rows = [[int(x) for x in re.findall(r"\d+", r)] for r in re.findall(r"\{([^{}]*)\}", block)]
    layers = [int(x) for x in re.search(r"kReleaseEngramLayers\[2\] = \{([^}]*)\}", src).group(1).split(",")]
    classes = int(re.search(r"kReleaseEngramClasses = (\d+)", src).group(1))
    assert layers == [1, 14] and classes == 99092
    assert rows == [numpy_multipliers(l, 4, classes) for l in layers]
    # MODEL-DEEPSEEK-V41.md §5 prints the same values (numpy 1.24.2 there).
    assert rows[0] == [76632096046245, 4839876093313, 35959672319349, 73987337458391]


@pytest.mark.parametrize("name", ["v41_a", "v41_a_release", "v41_b", "v41_b_release"])
def test_golden_sidecars(name):
    d = GOLDEN / name
    if not (d / "engram_sidecar.json").is_file():
        pytest.skip(f"{d} absent")
    s = json.loads((d / "engram_sidecar.json").read_text())
    text = v41engram.text_config(d / "config.json")
    assert s["num_classes"] == text["engram_compressed_vocab_size"]
    assert s["max_ngram_size"] == text["engram_max_ngram_size"]
    for m in s["multipliers"]:
        assert m["values"] == numpy_multipliers(m["layer"], s["max_ngram_size"], s["num_classes"])
    assert [m["layer"] for m in s["multipliers"]] == text["engram_layer_ids"]
    # §9's multipliers for layers 1 and 4 with 300 classes (v41_a uses that map).
    if name.startswith("v41_a"):
        assert s["multipliers"][0]["values"] == [25312092204715445, 1598643339462077, 11877719498229879]


def test_tool_reproduces_a_golden_sidecar(tmp_path):
    src = GOLDEN / "v41_a"
    if not (src / "config.json").is_file():
        pytest.skip("v41_a absent")
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    run = [sys.executable, str(REPO / "tools" / "make_engram_sidecar.py"), str(tmp_path)]
    res = subprocess.run(run + ["--synthetic", "300"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "engram_sidecar.json").read_text()) == json.loads((src / "engram_sidecar.json").read_text())
    res = subprocess.run(run + ["--synthetic", "299"], capture_output=True, text=True)
    assert res.returncode == 1 and "engram_compressed_vocab_size = 300" in res.stderr


def test_class_map_of_a_real_tokenizer():
    pytest.importorskip("tokenizers")
    if not V3_TOKENIZER.is_file():
        pytest.skip(f"{V3_TOKENIZER} absent")
    from tokenizers import Tokenizer
    classes = v41engram.class_map(V3_TOKENIZER)
    assert len(classes) == 128815
    # 98,627, not the release's 99,092: this is the DeepSeek-V3 tokenizer, not V4.1's (it lacks
    # V4.1's ｜DSML｜ at 128825 and <|deepseek_image|> at 129264), so 99,092 cannot be checked here.
    assert max(classes) + 1 == 98627
    tok = Tokenizer.from_file(str(V3_TOKENIZER))
    assert tok.id_to_token(128825) is None and tok.id_to_token(129264) is None
    # The rules the count rests on (V41-REFERENCE-NOTES.md §5): case and accents fold, every run of
    # space / tab / CR / LF (and a lone one) is one class with " ", byte tokens that decode to
    # U+FFFD keep their raw string, so different partial-UTF-8 bytes stay apart.
    ids = {t: tok.token_to_id(t) for t in ("The", "the", "Ġthe", "ĠThe", "Ġ", "Ċ", "ĊĊ", "ĉ", "Ã", "Â")}
    assert classes[ids["The"]] == classes[ids["the"]] == classes[ids["Ġthe"]] == classes[ids["ĠThe"]]  # stripped
    assert classes[ids["Ġ"]] == classes[ids["Ċ"]] == classes[ids["ĊĊ"]] == classes[ids["ĉ"]]
    assert classes[ids["Ã"]] != classes[ids["Â"]]
    stored = GOLDEN / "v41_engram" / "v3_engram_sidecar.json"
    if stored.is_file():
        s = json.loads(stored.read_text())
        assert s["classes"] == classes and s["tokenizer_sha256"] == v41engram.sha256(V3_TOKENIZER)
