#!/usr/bin/env python3
"""Train the default model's tokenizer and tokenize the corpus (issue #21).

    tools/corpus/train_tokenizer.py [--corpus .corpus] [--out .corpus/tokenizer] [--vocab 8192]

Byte-level BPE with HF `tokenizers`, using the STRUCTURE of DeepSeek's tokenizer.json: the same
pre-tokenizer chain (digit runs of 1-3 isolated, CJK runs isolated, DeepSeek's word/punctuation
split regex, then ByteLevel without its own regex), an empty normalizer Sequence, ByteLevel
decoder and post-processor, and DeepSeek's special tokens with DeepSeek's flags. The specials
take the first ids (bos 0, eos 1, as in the release config), the learned vocabulary the rest, so
the whole vocabulary is exactly --vocab ids.

Writes --out/tokenizer.json and tokenizer_config.json, and the corpus as token ids:
--corpus/train.u16 and heldout.u16 (uint16, each document as bos + ids + eos).
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

ROOT = Path(__file__).resolve().parents[2]
DS_TOKENIZER = ROOT / "assets/tokenizers/deepseek-v3"
BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# (content, special) in id order. DeepSeek marks bos/eos/pad special; the chat-role and tool markers are
# plain added tokens (special=False, normalized=True), which decode as text. ｜DSML｜ and <think> are the
# V4 chat format's markers (src/tokenizer/chat_dsv4.cpp); the tool-call tokens are the DeepSeek-V3 set.
SPECIALS = [(BOS, True), (EOS, True), (PAD, True), ("<｜User｜>", False), ("<｜Assistant｜>", False),
            ("<think>", False), ("</think>", False), ("｜DSML｜", False),
            ("<｜tool▁calls▁begin｜>", False), ("<｜tool▁calls▁end｜>", False), ("<｜tool▁call▁begin｜>", False),
            ("<｜tool▁call▁end｜>", False), ("<｜tool▁outputs▁begin｜>", False), ("<｜tool▁outputs▁end｜>", False),
            ("<｜tool▁output▁begin｜>", False), ("<｜tool▁output▁end｜>", False), ("<｜tool▁sep｜>", False)]


def deepseek_pretokenizer() -> pre_tokenizers.PreTokenizer:
    """DeepSeek's pre_tokenizer Sequence, read from its tokenizer.json so the regexes are exactly its."""
    ds = json.load(gzip.open(DS_TOKENIZER / "tokenizer.json.gz"))
    steps = []
    for p in ds["pre_tokenizer"]["pretokenizers"]:
        if p["type"] == "Split":
            steps.append(pre_tokenizers.Split(Regex(p["pattern"]["Regex"]), behavior=p["behavior"].lower(),
                                              invert=p["invert"]))
        elif p["type"] == "ByteLevel":
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=p["add_prefix_space"], use_regex=p["use_regex"],
                                                  trim_offsets=p["trim_offsets"]))
        else:
            raise ValueError(f"unexpected DeepSeek pre-tokenizer step {p['type']}")
    return pre_tokenizers.Sequence(steps)


def docs(path: Path):
    with open(path) as f:
        for line in f:
            yield json.loads(line)


def train(corpus: Path, vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = deepseek_pretokenizer()
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    specials = [AddedToken(c, special=s, normalized=not s, lstrip=False, rstrip=False, single_word=False)
                for c, s in SPECIALS]
    trainer = BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs(corpus / "train.jsonl"), trainer=trainer)
    if tok.get_vocab_size() != vocab:
        raise RuntimeError(f"trained vocabulary has {tok.get_vocab_size()} ids, wanted {vocab}")
    for i, (c, _) in enumerate(SPECIALS):
        if tok.token_to_id(c) != i:
            raise RuntimeError(f"special token {c} got id {tok.token_to_id(c)}, wanted {i}")
    return tok


def tokenizer_config() -> dict:
    """DeepSeek's tokenizer_config.json (bos/eos/pad, add_bos_token, chat template) with our length."""
    cfg = json.loads((DS_TOKENIZER / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 2048
    return cfg


def encode_corpus(tok: Tokenizer, src: Path, dst: Path) -> int:
    """bos + ids + eos per document -> uint16 file; returns the token count."""
    out, batch = [], []

    def flush():
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            out.append(np.array([0] + enc.ids + [1], dtype=np.uint16))
        batch.clear()

    for d in docs(src):
        batch.append(d)
        if len(batch) == 512:
            flush()
    flush()
    arr = np.concatenate(out)
    arr.tofile(dst)
    return len(arr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(ROOT / ".corpus"))
    ap.add_argument("--out", default=None, help="tokenizer folder (default CORPUS/tokenizer)")
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    corpus = Path(args.corpus)
    out = Path(args.out or corpus / "tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    tok = train(corpus, args.vocab)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n")
    n_train = encode_corpus(tok, corpus / "train.jsonl", corpus / "train.u16")
    n_held = encode_corpus(tok, corpus / "heldout.jsonl", corpus / "heldout.u16")
    nbytes = (corpus / "train.jsonl").stat().st_size
    print(f"tokenizer: {tok.get_vocab_size()} ids -> {out}")
    print(f"train {n_train} tokens ({nbytes / n_train:.2f} JSONL bytes/token), held-out {n_held} tokens")


if __name__ == "__main__":
    main()
