#!/usr/bin/env python3
"""Seed corpora for the fuzz targets (deterministic): small valid inputs from the project's test
data and the shared data, plus every bad input issue #20 lists (deep nesting, negative and huge
ids, zero block sizes, huge iteration counts, non-ASCII grammar errors, ...).

    tests/fuzz/make_seeds.py OUT_DIR        writes OUT_DIR/<target>/<name> files
"""
import glob
import json
import os
import re
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("DEEPINFER_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
DEEP = 100000  # the nesting depth


def deep_list(n, leaf="0"):
    return "[" * n + leaf + "]" * n


class Corpus:
    def __init__(self, out):
        self.out = out
        self.count = {}

    def add(self, target, name, data):
        d = os.path.join(self.out, target)
        os.makedirs(d, exist_ok=True)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        self.count[target] = self.count.get(target, 0) + 1


# ---- safetensors ---------------------------------------------------------------------------

def st_file(header, data=b""):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(c):
    t = "safetensors_header"
    c.add(t, "valid_dtypes", st_file({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
        "c": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [22, 24]},
        "d": {"dtype": "I8", "shape": [1, 2], "data_offsets": [24, 26]},
        "e": {"dtype": "F8_E8M0", "shape": [0], "data_offsets": [26, 26]}}, bytes(range(26))))
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "golden", "*", "model.safetensors")))[:2]:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            c.add(t, "golden_header_" + os.path.basename(os.path.dirname(path)), struct.pack("<Q", n) + f.read(n))
    c.add(t, "deep_metadata", st_file(('{"__metadata__": {"k": ' + deep_list(DEEP) + "}}").encode()))
    c.add(t, "deep_shape", st_file(('{"w": {"dtype": "F32", "shape": ' + deep_list(DEEP) +
                                    ', "data_offsets": [0, 4]}}').encode(), b"\0" * 4))
    c.add(t, "overflow_shape", st_file({"w": {"dtype": "F32", "shape": [2 ** 32, 2 ** 32], "data_offsets": [0, 0]}}))
    c.add(t, "u64_dim", st_file({"w": {"dtype": "U8", "shape": [2 ** 64 - 1], "data_offsets": [0, 0]}}))
    c.add(t, "bad_utf8_header", st_file(b'{"w": \xff\xfe\x80 }'))
    c.add(t, "len_past_eof", struct.pack("<Q", 1 << 20) + b"{}")
    c.add(t, "overlap", st_file({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                 "y": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, b"\1" * 24))
    t = "safetensors_index"
    c.add(t, "valid", json.dumps({"metadata": {"total_size": 24}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "layers.0.w": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors", "layers.1.w": "model-00002-of-00002.safetensors"}}))
    c.add(t, "wrong_shard", json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors"}}))
    c.add(t, "traversal", json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    c.add(t, "deep", '{"weight_map": ' + deep_list(DEEP) + "}")
    c.add(t, "not_string", json.dumps({"weight_map": {"a": 7}}))
    default_index = os.path.join(ROOT, "assets", "default-model", "model.safetensors.index.json")
    if os.path.exists(default_index):
        with open(default_index, "rb") as f:
            c.add(t, "default_model_index", f.read())


# ---- config.json ---------------------------------------------------------------------------

def config_seeds(c):
    t = "config_v4"
    configs = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "golden", "*", "config.json"))):
        with open(path) as f:
            configs[os.path.basename(os.path.dirname(path))] = json.load(f)
    default_cfg = os.path.join(ROOT, "assets", "default-model", "config.json")
    if os.path.exists(default_cfg):
        with open(default_cfg) as f:
            configs["default_model"] = json.load(f)
    for name, cfg in configs.items():
        c.add(t, name, json.dumps(cfg, indent=1))
        if name.startswith("v41"):
            v41(c, name, cfg)
    base = configs.get("tiny_official") or next(iter(configs.values()))
    hf = configs.get("tiny") or base

    def variant(name, cfg, **kw):
        v = dict(cfg)
        v.update(kw)
        c.add(t, name, json.dumps(v))

    variant("block_size_zero", base, quantization_config={"quant_method": "fp8", "weight_block_size": [0, 0]})
    variant("sinkhorn_1e12", hf, hc_sinkhorn_iters=1e12)
    variant("eps_negative", hf, rms_norm_eps=-1)
    variant("theta_zero", base, rope_theta=0)
    variant("eos_huge", hf, eos_token_id=2 ** 40)
    variant("u64_vocab", hf, vocab_size=2 ** 64 - 1)
    for field in ("vocab_size", "compress_ratios"):
        v = dict(base)
        v[field] = "@@"
        c.add(t, "deep_" + field, json.dumps(v).replace('"@@"', deep_list(DEEP)))


def v41(c, name, cfg):
    """V4.1 configs seed their own target, plus the issue's kinds of bad values."""
    t = "config_v41"
    c.add(t, name, json.dumps(cfg, indent=1))
    for field, value in (("hc_sinkhorn_iters", 1e12), ("rms_norm_eps", -1), ("rope_theta", 0),
                         ("vocab_size", 2 ** 64 - 1), ("eos_token_id", -3)):
        v = dict(cfg)
        v[field] = value
        c.add(t, f"{name}_{field}", json.dumps(v))
    v = dict(cfg)
    v["vocab_size"] = "@@"
    c.add(t, f"{name}_deep", json.dumps(v).replace('"@@"', deep_list(DEEP)))


# ---- tokenizer -----------------------------------------------------------------------------

def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(ch) for b, ch in zip(bs, cs)}


def tiny_tokenizer(**over):
    ab = byte_alphabet()
    vocab = {ab[b]: b for b in range(256)}
    vocab.update({"ab": 256, "Ġt": 257, "he": 258})
    tj = {
        "version": "1.0",
        "added_tokens": [{"id": 259, "content": "<eos>", "special": True, "lstrip": False, "rstrip": False,
                          "normalized": False, "single_word": False},
                         {"id": 260, "content": "<｜User｜>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "vocab": vocab, "merges": ["a b", "Ġ t", "h e"]},
    }
    tj.update(over)
    return tj


def tokenizer_seeds(c):
    t = "tokenizer_files"
    cfg = json.dumps({"bos_token": "<eos>", "eos_token": {"content": "<eos>"}, "add_bos_token": True})
    c.add(t, "tiny", json.dumps(tiny_tokenizer()))
    c.add(t, "tiny_with_config", json.dumps(tiny_tokenizer()) + "\0" + cfg)
    c.add(t, "normalizer", json.dumps(tiny_tokenizer(normalizer={"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        {"type": "Strip", "strip_left": True, "strip_right": False}]})))
    c.add(t, "template_post", json.dumps(tiny_tokenizer(post_processor={
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<eos>"}}, {"Sequence": {"id": "A"}}],
        "special_tokens": {"<eos>": {"ids": [259]}}})))
    bad_added = tiny_tokenizer()
    bad_added["added_tokens"][0]["id"] = -5
    c.add(t, "added_id_negative", json.dumps(bad_added))
    bad_added["added_tokens"][0]["id"] = 2 ** 40
    c.add(t, "added_id_2_40", json.dumps(bad_added))
    huge_vocab = tiny_tokenizer()
    huge_vocab["model"]["vocab"]["zz"] = 2 ** 40
    c.add(t, "vocab_id_2_40", json.dumps(huge_vocab))
    for key, lst, leaf in (("pre_tokenizer", "pretokenizers", {"type": "ByteLevel"}),
                           ("normalizer", "normalizers", {"type": "Prepend", "prepend": "x"})):
        open_ = '{"type": "Sequence", "%s": [' % lst
        tj = tiny_tokenizer()
        tj[key] = "@@"
        c.add(t, "deep_" + key, json.dumps(tj).replace('"@@"', open_ * DEEP + json.dumps(leaf) + "]}" * DEEP))
    c.add(t, "config_wrong_types", json.dumps(tiny_tokenizer()) + "\0" + json.dumps({"add_bos_token": "yes"}))

    t = "tokenizer_text"
    texts = ["Hello world", "The quick brown fox jumps over 13 lazy dogs.", "naïve café 東京 🙂 ﷽",
             "  leading and trailing  \n\n\t", "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>",
             "1234567890" * 20, "a" * 3000, "def f(x):\n    return x ** 2  # comment\n",
             "\u200b\u00a0\u3000mixed   spaces", "ÀÁÂÃÄÅ àáâãäå " * 10]
    for i, s in enumerate(texts):
        c.add(t, f"text_{i}", s)
    c.add(t, "invalid_utf8", b"ok \xff\xfe \xc3 truncated \xed\xa0\x80 surrogate")

    t = "chat_template"
    for i, s in enumerate([b"\x02\x03hello\x00\x01", bytes(range(64)), b"\xff" * 40, b"\x05" + b"{\"a\": [1, 2]}" * 4]):
        c.add(t, f"bytes_{i}", s)


# ---- so_args ---------------------------------------------------------------------------------

REGEX_LINE = re.compile(r"^regex\s*=\s*(?:'([^']*)'|\"((?:[^\"\\]|\\.)*)\")\s*$")


def so_args_seeds(c):
    t = "so_args"
    kinds = {"regex": 0, "schema": 1, "ebnf": 2, "lark": 3, "choice": 4, "raw": 5}

    def add(name, kind, text):
        c.add(t, name, bytes([kinds[kind]]) + (text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text))

    n = 0
    for path in sorted(glob.glob(os.path.join(SHARED, "data", "structured", "regex-testdata", "*.toml"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = REGEX_LINE.match(line.strip())
                if m and n < 150:
                    add(f"regex_{n}", "regex", m.group(1) if m.group(1) is not None else m.group(2))
                    n += 1
    n = 0
    for path in sorted(glob.glob(os.path.join(SHARED, "data", "structured", "json-schema-test-suite", "draft2020-12", "*.json"))):
        with open(path, encoding="utf-8") as f:
            for case in json.load(f):
                text = json.dumps(case["schema"])
                if len(text) < 2000 and n < 200:
                    add(f"schema_{n}", "schema", text)
                    n += 1
    add("ebnf_json", "ebnf", 'root ::= object\nobject ::= "{" ws (pair ("," ws pair)*)? "}"\n'
        'pair ::= string ":" ws value\nvalue ::= string | [0-9]+ | object\nstring ::= "\\"" [a-z]* "\\""\nws ::= [ \\t\\n]*')
    add("ebnf_alt", "ebnf", 'root ::= ("yes" | "no" | "maybe"){1,3} [.!?]?')
    add("lark_expr", "lark", 'start: expr\nexpr: term (("+"|"-") term)*\nterm: NUMBER\n%import common.NUMBER\n%ignore " "')
    add("choice", "choice", "red\ngreen\nblue\nNaïve")
    add("raw_object", "raw", json.dumps({"json_object": True}))
    add("raw_flexible", "raw", json.dumps({"json_schema": {"type": "array", "items": {"type": "integer"}},
                                           "whitespace": "flexible"}))
    # The inputs.
    add("regex_deep_groups", "regex", "(" * DEEP + "a" + ")" * DEEP)
    add("regex_non_ascii_flag", "regex", "(?é)a")
    add("ebnf_non_ascii", "ebnf", "root ::= é")
    add("schema_deep_enum", "schema", '{"enum": [' + deep_list(DEEP) + "]}")
    add("schema_deep_const", "schema", '{"const": ' + deep_list(DEEP) + "}")
    def nested_objects(depth):
        s = '{"type": "string"}'
        for _ in range(depth):
            s = '{"type": "object", "properties": {"a": ' + s + '}, "required": ["a"]}'
        return s

    add("schema_objects_10", "schema", nested_objects(10))
    add("schema_objects_10000", "schema", nested_objects(10000))
    # Compile time used to double per nesting level (30 deep: > 60 s): legal, and in budget now.
    add("schema_objects_30", "schema", nested_objects(30))
    add("schema_objects_100", "schema", nested_objects(100))
    add("raw_deep_so_args", "raw", '{"json_schema": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}")
    add("ebnf_chain", "ebnf", "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(DEEP)) + f'r{DEEP} ::= "a"\n')


# ---- server request bodies -----------------------------------------------------------------

def server_request_seeds(c):
    """POST bodies for /v1/completions (first byte 0) and /v1/chat/completions (1; +2 = V4.1):
    what tests/python/test_server*.py send, and the bad inputs of issues #17 and #20."""
    t = "server_request"
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}}}
    history = msgs + [{"role": "assistant", "content": "", "reasoning_content": "think",
                       "tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    completions = {
        "text": {"model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0},
        "ids": {"prompt": [1, 2, 3], "max_tokens": 4, "echo": True, "logprobs": 2},
        "batch": {"prompt": ["a", "b"], "n": 2, "best_of": 3, "seed": 7, "stop": ["\n"], "logit_bias": {"5": -100}},
        "id_batch": {"prompt": [[5, 6], [7]], "top_k": 5, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.1},
        "stream": {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
        "so_regex": {"prompt": "x", "so_args": {"regex": "[a-z]{3}"}},
        "so_schema": {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "object", "properties": {"a": {"type": "number"}}}}}},
        "token_ids": {"prompt": "x", "return_token_ids": True, "max_tokens": None},
        # refused with a 400 naming the field
        "best_of_below_n": {"prompt": "x", "n": 3, "best_of": 2},
        "best_of_stream": {"prompt": "x", "n": 1, "best_of": 2, "stream": True},
        "suffix": {"prompt": "def f(", "suffix": "return x"},
        "float_max_tokens": {"prompt": "x", "max_tokens": 8.0},
        "id_past_vocab": {"prompt": [1, 99999]},
        "unknown_field": {"prompt": "x", "frobnicate": 1},
        "wrong_model": {"model": "other", "prompt": "x"},
    }
    for name, body in completions.items():
        c.add(t, "cmpl_" + name, b"\x00" + json.dumps(body).encode())
    chats = {
        "plain": {"messages": msgs, "max_tokens": 4},
        "thinking": {"messages": msgs, "reasoning_effort": "high", "logprobs": True, "top_logprobs": 2},
        "kwargs": {"messages": msgs, "chat_template_kwargs": {"thinking": True}, "max_completion_tokens": 3},
        "tools_auto": {"messages": msgs, "tools": [tool]},
        "tools_required": {"messages": msgs, "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False},
        "tools_named": {"messages": msgs, "tools": [tool],
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "history": {"messages": history, "tools": [tool]},
        "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
        "json_object": {"messages": msgs, "response_format": {"type": "json_object"}},
        "token_ids": {"messages": msgs, "return_token_ids": True},
        "bad_role": {"messages": [{"role": "robot", "content": "x"}]},
        "image_part": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "named_missing": {"messages": msgs, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "effort_bad": {"messages": msgs, "reasoning_effort": "extreme"},
        "empty": {"messages": []},
    }
    for name, body in chats.items():
        text = json.dumps(body).encode()
        c.add(t, "chat_" + name, b"\x01" + text)
        c.add(t, "chat41_" + name, b"\x03" + text)
    # Raw bytes: numbers past double's range (HARDENING finding 4's shape in a body), a body
    # nested 100,000 deep, invalid UTF-8, not an object, truncated.
    c.add(t, "num_overflow", b'\x00{"prompt": "x", "temperature": 1e999}')
    c.add(t, "num_overflow_so_args", b'\x00{"prompt": "x", "so_args": {"json_schema": {"type": "number", "minimum": 1e999}}}')
    c.add(t, "num_overflow_schema_text", b'\x01{"messages": [{"role": "user", "content": "x"}], "so_args": {"json": "1e999"}}')
    c.add(t, "deep_body", b"\x01" + ('{"messages": ' + deep_list(DEEP) + "}").encode())
    c.add(t, "deep_so_args", b"\x00" + ('{"prompt": "x", "so_args": {"json_schema": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}}").encode())
    c.add(t, "invalid_utf8", b'\x01{"messages": [{"role": "user", "content": "\xff\xfe caf\xc3"}]}')
    c.add(t, "not_object", b"\x00[1, 2, 3]")
    c.add(t, "truncated", b'\x01{"messages": [{"role": "us')
    c.add(t, "type_confusion", b'\x01{"messages": [{"role": "user", "content": 5}], "tools": {"a": 1}, "n": "2"}')


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build-fuzz", "seeds")
    c = Corpus(out)
    safetensors_seeds(c)
    config_seeds(c)
    tokenizer_seeds(c)
    so_args_seeds(c)
    server_request_seeds(c)
    for target, n in sorted(c.count.items()):
        print(f"{target}: {n} seeds")


if __name__ == "__main__":
    main()
