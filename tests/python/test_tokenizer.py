"""deepinfer.Tokenizer API: errors on bad files, vocabulary access, chat formats."""
import json
import shutil

import pytest

from tokenizer_common import DS_JSON, GPT2_ENC, need_shared

from deepinfer import _C
from deepinfer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def ds():
    need_shared()
    return Tokenizer.from_file(DS_JSON)


def small_tokenizer_json(tmp_path, mutate=None):
    """A tiny valid byte-level tokenizer.json written to tmp_path (optionally mutated)."""
    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ"]
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["ab"] = len(vocab)
    j = {"version": "1.0", "added_tokens": [{"id": len(vocab), "content": "<eos>", "special": True, "lstrip": False,
                                             "rstrip": False, "normalized": False, "single_word": False}],
         "normalizer": None,
         "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
         "post_processor": None, "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]}}
    if mutate:
        mutate(j)
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(j))
    return str(p)


def test_small_tokenizer_roundtrip(tmp_path):
    t = Tokenizer.from_file(small_tokenizer_json(tmp_path))
    ids = t.encode("abab<eos>c")
    assert ids == [t.token_to_id("ab"), t.token_to_id("ab"), t.token_to_id("<eos>"), t.token_to_id("c")]
    assert t.decode(ids) == "abab<eos>c"
    assert t.decode(ids, skip_special_tokens=True) == "ababc"
    assert t.is_special(t.token_to_id("<eos>"))


@pytest.mark.parametrize("mutate,needle", [
    (lambda j: j["model"].update(type="Unigram"), "unsupported model type 'Unigram'"),
    (lambda j: j.update(pre_tokenizer={"type": "Metaspace"}), "unsupported pre_tokenizer type 'Metaspace'"),
    (lambda j: j.update(pre_tokenizer=None), "no ByteLevel step"),
    (lambda j: j.update(normalizer={"type": "NFKC"}), "unsupported normalizer type 'NFKC'"),
    (lambda j: j.update(decoder={"type": "WordPiece"}), "unsupported decoder type 'WordPiece'"),
    (lambda j: j["model"].update(merges=["a zz"]), "model.merges[0]"),
    (lambda j: j["model"].pop("vocab"), "missing field 'vocab'"),
    (lambda j: j.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}),
     "regex does not compile"),
    (lambda j: j.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"}),
     "unknown split behavior"),
])
def test_bad_tokenizer_json(tmp_path, mutate, needle):
    with pytest.raises(_C.TokenizerError, match=None) as e:
        Tokenizer.from_file(small_tokenizer_json(tmp_path, mutate))
    assert needle in str(e.value) and "tokenizer.json" in str(e.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(_C.TokenizerError, match="not found"):
        Tokenizer.from_file(str(tmp_path / "nope.json"))
    p = tmp_path / "tokenizer.json"
    p.write_text('{"model": {"type": "BPE", ')
    with pytest.raises(_C.TokenizerError, match="malformed JSON"):
        Tokenizer.from_file(str(p))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(_C.TokenizerError, match="neither tokenizer.json nor encoder.json"):
        Tokenizer.from_file(str(empty))


def test_gpt2_needs_vocab_bpe(tmp_path):
    need_shared()
    shutil.copy(GPT2_ENC, tmp_path / "encoder.json")
    with pytest.raises(_C.TokenizerError, match="vocab.bpe"):
        Tokenizer.from_file(str(tmp_path / "encoder.json"))


def test_invalid_utf8_text_rejected(ds):
    with pytest.raises((UnicodeEncodeError, _C.TokenizerError, ValueError, TypeError)):
        ds.encode("bad \ud800 surrogate")


def test_bad_ids(ds):
    with pytest.raises(ValueError, match="position 1"):
        ds.decode([5, ds.vocab_size + 3])
    with pytest.raises(ValueError):
        ds.token_bytes(-1)
    with pytest.raises(ValueError):
        ds.decode_stream().step(10**9)


def test_vocab_access(ds):
    assert ds.vocab_size == 128815
    assert ds.token_to_id("<｜User｜>") == 128803 and ds.token_to_id("<｜Assistant｜>") == 128804
    assert ds.token_bytes(ds.token_to_id("Ġthe")) == b" the"
    assert ds.token_bytes(0) == "<｜begin▁of▁sentence｜>".encode()
    assert ds.id_to_token(0) == "<｜begin▁of▁sentence｜>"
    assert 0 in ds.special_ids and 1 in ds.special_ids
    assert ds.token_to_id("definitely not a token") is None
    # Every id has bytes (grammar engines need them all); pieces of multi-byte chars are partial UTF-8.
    assert all(len(ds.token_bytes(i)) > 0 for i in range(ds.vocab_size) if ds.id_to_token(i))


BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"


def test_dsv4_chat_modes(ds):
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}]
    assert ds.apply_chat_template(msgs) == BOS + "You are helpful." + U + "hi" + A + "</think>"
    assert ds.apply_chat_template(msgs, thinking=True) == BOS + "You are helpful." + U + "hi" + A + "<think>"
    assert ds.apply_chat_template(msgs, add_generation_prompt=False) == BOS + "You are helpful." + U + "hi"
    ids = ds.apply_chat_template(msgs, tokenize=True)
    assert ids[0] == 0 and 128803 in ids and 128804 in ids  # </think> is plain text in the V3 vocab


def test_dsv4_multi_turn_drops_old_reasoning(ds):
    msgs = [{"role": "user", "content": "hello"},
            {"role": "assistant", "content": "Hello! I am DeepSeek.", "reasoning_content": "thinking..."},
            {"role": "user", "content": "1+1=?"}]
    want = BOS + U + "hello" + A + "</think>Hello! I am DeepSeek." + EOS + U + "1+1=?" + A + "<think>"
    assert ds.apply_chat_template(msgs, thinking=True) == want
    kept = BOS + U + "hello" + A + "<think>thinking...</think>Hello! I am DeepSeek." + EOS + U + "1+1=?" + A + "<think>"
    assert ds.apply_chat_template(msgs, thinking=True, drop_thinking=False) == kept
    chat = BOS + U + "hello" + A + "</think>Hello! I am DeepSeek." + EOS + U + "1+1=?" + A + "</think>"
    assert ds.apply_chat_template(msgs) == chat


def test_dsv4_reasoning_effort(ds):
    msgs = [{"role": "user", "content": "q"}]
    out = ds.apply_chat_template(msgs, thinking=True, reasoning_effort="max")
    assert out.startswith(BOS + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n")
    assert out.endswith(U + "q" + A + "<think>")
    assert ds.apply_chat_template(msgs, thinking=True, reasoning_effort="high") == BOS + U + "q" + A + "<think>"
    with pytest.raises(ValueError, match="reasoning_effort"):
        ds.apply_chat_template(msgs, reasoning_effort="extreme")


def test_dsv4_tools_and_results(ds):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "system", "content": "sys"},
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"role": "assistant", "content": "", "reasoning_content": "need tools",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}},
                            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c1", "content": "rain"}]
    out = ds.apply_chat_template(msgs, tools=tools, thinking=True)
    D = "｜DSML｜"
    assert out.startswith(BOS + "sys\n\n## Tools\n\nYou have access to a set of tools")
    assert '{"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}' in out
    calls = (f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
             f'<{D}parameter name="days" string="false">2</{D}parameter>\n</{D}invoke>\n<{D}invoke name="get_weather">\n'
             f'<{D}parameter name="city" string="true">Rome</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>')
    # tools present: reasoning is kept; results are ordered like the calls (c1 then c2)
    assert out.endswith(U + "weather in Paris and Rome?" + A + "<think>need tools</think>" + calls + EOS +
                        U + "<tool_result>rain</tool_result>\n\n<tool_result>sunny</tool_result>" + A + "<think>")
    with pytest.raises(ValueError, match="role"):
        ds.apply_chat_template([{"role": "robot", "content": "x"}])


def test_jinja_template_from_config(ds):
    out = ds.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                                 chat_format="jinja", add_generation_prompt=True)
    assert out == BOS + "S" + U + "hi" + A
    assert ds.apply_chat_template([{"role": "user", "content": "hi"}], chat_format="auto") == BOS + U + "hi" + A
