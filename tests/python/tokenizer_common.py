"""Shared fixtures for the tokenizer tests: data locations and the generated corpus."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.append(os.path.join(ROOT, "python"))  # when build.sh's .pth is not installed
SHARED = os.environ.get("DEEPINFER_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
TOK_DIR = os.path.join(SHARED, "data", "tokenizers")
DS_JSON = os.path.join(TOK_DIR, "deepseek-v3", "tokenizer.json")
GPT2_ENC = os.path.join(TOK_DIR, "gpt2", "encoder.json")
GPT2_BPE = os.path.join(TOK_DIR, "gpt2", "vocab.bpe")


def need_shared():
    if not os.path.exists(DS_JSON) or not os.path.exists(GPT2_ENC):
        pytest.skip(f"shared tokenizer data not found under {TOK_DIR} (set DEEPINFER_SHARED_DIR)")


def corpus_dir():
    base = os.environ.get("DEEPINFER_BINARY_DIR", os.path.join(ROOT, "build"))
    return os.path.join(base, "tmp", "tokenizer_corpus")


def load_corpus():
    """(documents >= 1 MB, 10,000 random Unicode strings), generated deterministically once."""
    from make_tokenizer_corpus import load_jsonl, make
    d = corpus_dir()
    c, r = os.path.join(d, "corpus.jsonl"), os.path.join(d, "random.jsonl")
    if not (os.path.exists(c) and os.path.exists(r)):
        make(d, 1.2, 10000, 0)
    return load_jsonl(c), load_jsonl(r)
