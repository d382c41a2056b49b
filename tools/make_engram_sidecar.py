#!/usr/bin/env python3
"""Write the Engram sidecar (class map + frozen multipliers) next to a DeepSeek-V4.1 checkpoint.

    python3 tools/make_engram_sidecar.py <model_dir> [--tokenizer <tokenizer.json>] [--synthetic C]

Needs `tokenizers` and numpy. The engine refuses a V4.1 checkpoint with Engram layers whose folder
has no engram_sidecar.json (or one that disagrees with config.json): run this once per checkpoint.
The class map follows the reference (transformers' deepseek_v41 build_compressed_token_map) exactly;
its size must equal engram_compressed_vocab_size (99,092 for the release), else the tables would be
addressed with the wrong hash and this tool stops. --synthetic C writes §9's test map t mod C instead.
See docs/MODEL-V41.md, "Engram".
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from golden_lib import v41engram  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: <model_dir>/tokenizer.json)")
    ap.add_argument("--synthetic", type=int, metavar="C", help="write the synthetic map class(t) = t mod C")
    ap.add_argument("--out", type=Path, help=f"output (default: <model_dir>/{v41engram.FILE_NAME})")
    args = ap.parse_args()
    text = v41engram.text_config(args.model_dir / "config.json")
    layers = text.get("engram_layer_ids") or []
    n = int(text.get("engram_max_ngram_size", 4))
    want = int(text.get("engram_compressed_vocab_size", 99092))
    if args.synthetic:
        classes = v41engram.synthetic(int(text["vocab_size"]), args.synthetic)
        source, sha = f"synthetic: class(t) = t mod {args.synthetic}", None
    else:
        tj = args.tokenizer or args.model_dir / "tokenizer.json"
        classes = v41engram.class_map(tj)
        source, sha = f"tokenizer {tj.name}: reference build_compressed_token_map", v41engram.sha256(tj)
    got = max(classes) + 1
    if got != want:
        print(f"error: the tokenizer gives {got} classes but config.json says engram_compressed_vocab_size = {want}: "
              "wrong tokenizer for this checkpoint", file=sys.stderr)
        return 1
    out = args.out or args.model_dir / v41engram.FILE_NAME
    v41engram.write(out, classes, source, sha, layers, n)
    print(f"wrote {out}: {len(classes)} ids, {got} classes, multipliers for layers {layers}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
