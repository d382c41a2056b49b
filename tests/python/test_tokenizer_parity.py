"""Parity with Hugging Face `tokenizers` on a >= 1 MB varied corpus and 10,000 random Unicode
strings (DeepSeek-V3 tokenizer.json and GPT-2 encoder.json + vocab.bpe); round trips; streaming."""
import random

import pytest

from tokenizer_common import DS_JSON, GPT2_BPE, GPT2_ENC, load_corpus, need_shared

hf_tokenizers = pytest.importorskip("tokenizers", reason="HF tokenizers (pip install tokenizers) is the reference")
from deepinfer.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def data():
    need_shared()
    return load_corpus()


def hf_gpt2():
    from tokenizers import decoders, models, pre_tokenizers
    t = hf_tokenizers.Tokenizer(models.BPE.from_file(GPT2_ENC, GPT2_BPE))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens(["<|endoftext|>"])  # as GPT2TokenizerFast registers it
    return t


@pytest.fixture(scope="module", params=["deepseek-v3", "gpt2"])
def pair(request, data):
    if request.param == "deepseek-v3":
        return Tokenizer.from_file(DS_JSON), hf_tokenizers.Tokenizer.from_file(DS_JSON)
    return Tokenizer.from_file(GPT2_ENC), hf_gpt2()


def mismatches(ours, hf, texts):
    ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    got = [ours.encode(t) for t in texts]
    bad = [i for i in range(len(texts)) if got[i] != ref[i]]
    return bad, ref


def test_corpus_is_big_and_varied(data):
    docs, rnd = data
    assert sum(len(d.encode()) for d in docs) >= 1_000_000
    assert len(rnd) == 10000
    joined = "".join(docs)
    for needle in ["<｜User｜>", "👨‍👩‍👧‍👦", "中", "П", "م", "\u0301", "\r\n", "   ", "0123", "def "]:
        assert needle in joined


def test_corpus_ids_identical(pair, data):
    ours, hf = pair
    docs, _ = data
    bad, ref = mismatches(ours, hf, docs)
    assert not bad, f"{len(bad)} of {len(docs)} documents differ, first: {docs[bad[0]][:200]!r}"
    assert ours.encode_batch(docs, num_threads=2) == ref


def test_random_unicode_ids_identical(pair, data):
    ours, hf = pair
    _, rnd = data
    bad, _ = mismatches(ours, hf, rnd)
    assert not bad, f"{len(bad)} of {len(rnd)} strings differ, first: {rnd[bad[0]]!r}"


def test_roundtrip(pair, data):
    ours, _ = pair
    docs, rnd = data
    for s in docs + rnd:
        assert ours.decode(ours.encode(s)) == s


def test_decode_matches_hf_on_random_ids(pair):
    ours, hf = pair
    r = random.Random(3)
    n = ours.vocab_size
    specials = ours.special_ids
    for _ in range(2000):
        ids = [r.randrange(n) for _ in range(r.randint(0, 12))]
        if specials and r.random() < 0.3:
            ids.insert(r.randint(0, len(ids)), r.choice(specials))
        ids = [i for i in ids if hf.id_to_token(i) is not None]
        for skip in (False, True):
            assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), ids


def test_streaming_concatenates_to_decode(pair, data):
    ours, _ = pair
    docs, rnd = data
    r = random.Random(5)
    seqs = [ours.encode(s) for s in docs[:400] + rnd[:2000]]
    seqs += [[r.randrange(ours.vocab_size) for _ in range(r.randint(1, 30))] for _ in range(2000)]  # broken UTF-8 too
    for ids in seqs:
        ids = [i for i in ids if ours.id_to_token(i) != ""]
        for skip in (False, True):
            st = ours.decode_stream(skip)
            pieces = [st.step(i) for i in ids] + [st.finish()]
            assert "".join(pieces) == ours.decode(ids, skip)
            assert all("\ufffd" not in p or "\ufffd" in ours.decode(ids, skip) for p in pieces)


def test_streaming_never_splits_a_character():
    need_shared()
    t = Tokenizer.from_file(DS_JSON)
    text = "👨‍👩‍👧‍👦 中文 e\u0301 Привет"
    st = t.decode_stream()
    for i in t.encode(text):
        piece = st.step(i)
        assert "\ufffd" not in piece
        piece.encode("utf-8")  # complete characters only
    assert st.finish() == ""


def test_token_bytes_match_byte_level_alphabet(pair):
    ours, hf = pair
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    inv = {chr(c): b for b, c in zip(bs, cs)}
    added = {t.content for t in hf.get_added_tokens_decoder().values()}
    for tok, i in hf.get_vocab().items():
        want = tok.encode() if tok in added else bytes(inv[c] for c in tok)
        assert ours.token_bytes(i) == want, (i, tok)
        assert ours.token_to_id(tok) == i
        assert ours.id_to_token(i) == tok


def test_add_special_tokens_prepends_bos():
    need_shared()
    t = Tokenizer.from_file(DS_JSON)
    h = hf_tokenizers.Tokenizer.from_file(DS_JSON)
    s = "Hello world"
    assert t.bos_id == 0 and t.eos_id == 1
    assert t.encode(s, add_special_tokens=True) == [0] + h.encode(s, add_special_tokens=False).ids
