#!/usr/bin/env python3
"""Encode throughput (MB/s of UTF-8 input) of deepinfer.Tokenizer vs HF tokenizers on the
deterministic parity corpus (tools/make_tokenizer_corpus.py), single-threaded and batched.
Verifies ids match in the same run. Not a test.

  python3 bench/tokenizer_bench.py [--tokenizer PATH] [--mb 1.2] [--repeat 5] [--threads N]
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.environ.get("DEEPINFER_PYTHON_DIR", os.path.join(ROOT, "python")))
sys.path.insert(0, os.path.join(ROOT, "tools"))


def best_of(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    shared = os.environ.get("DEEPINFER_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=os.path.join(shared, "data", "tokenizers", "deepseek-v3", "tokenizer.json"))
    ap.add_argument("--mb", type=float, default=1.2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()

    import tokenizers
    from make_tokenizer_corpus import load_jsonl, make

    from deepinfer import _C

    out = tempfile.mkdtemp(prefix="tokbench")
    corpus, _ = make(out, a.mb, 0)
    docs = load_jsonl(corpus)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    ours = _C.Tokenizer.from_file(a.tokenizer)
    if a.tokenizer.endswith("encoder.json"):  # GPT-2 pair: build the same tokenizer in HF
        from tokenizers import decoders, models, pre_tokenizers
        hf = tokenizers.Tokenizer(models.BPE.from_file(a.tokenizer, os.path.join(os.path.dirname(a.tokenizer), "vocab.bpe")))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens(["<|endoftext|>"])
    else:
        hf = tokenizers.Tokenizer.from_file(a.tokenizer)
    os.environ.setdefault("RAYON_NUM_THREADS", str(a.threads))

    ref = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    assert [ours.encode(d) for d in docs] == ref, "ids differ from HF"
    assert ours.encode_batch(docs, num_threads=a.threads) == ref, "batched ids differ from HF"

    rows = [
        ("deepinfer single-thread", best_of(lambda: [ours.encode(d) for d in docs], a.repeat)),
        ("HF tokenizers single-thread", best_of(lambda: [hf.encode(d, add_special_tokens=False) for d in docs], a.repeat)),
        (f"deepinfer encode_batch ({a.threads} threads)",
         best_of(lambda: ours.encode_batch(docs, num_threads=a.threads), a.repeat)),
        ("HF tokenizers encode_batch (rayon)", best_of(lambda: hf.encode_batch(docs, add_special_tokens=False), a.repeat)),
    ]
    print(f"corpus: {len(docs)} documents, {mb:.2f} MB, tokenizer {a.tokenizer}, ids verified identical")
    print(f"| {'mode':40s} | {'seconds':>8s} | {'MB/s':>8s} |")
    print(f"|{'-' * 42}|{'-' * 10}|{'-' * 10}|")
    for name, t in rows:
        print(f"| {name:40s} | {t:8.3f} | {mb / t:8.2f} |")


if __name__ == "__main__":
    main()
