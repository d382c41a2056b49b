#!/usr/bin/env python3
"""Deterministic tokenizer test corpus: varied text (prose, code, JSON, CJK, Cyrillic, Arabic,
emoji with joiners, combining marks, whitespace and digit runs, special tokens inside text) and
random Unicode strings. Written as JSONL (one JSON string per line) so documents keep newlines.

  tools/make_tokenizer_corpus.py --out DIR [--mb 1.2] [--random 10000] [--seed 0]
writes DIR/corpus.jsonl (>= --mb MB of UTF-8) and DIR/random.jsonl (--random strings).
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_FILE = os.path.join(HERE, "..", "tests", "data", "tokenizer", "tricky.txt")

WORDS = ("the of and to in is was for on that with as by at from his her it an be this which or are had not "
         "but what all were when we there can been has more if will one would no about out up them into time "
         "model token inference engine attention expert sparse quantized throughput latency kernel memory "
         "Mr. Mrs. Dr. U.S.A. e.g. i.e. etc. don't it's we're they'll I've she'd").split()
CYR = "съешь же ещё этих мягких французских булок да выпей чаю привет мир как дела москва россия".split()
ARA = "مرحبا بالعالم هذا نص عربي كتاب مدرسة السلام عليكم شكرا جزيلا اللغة العربية".split()
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
            "<|endoftext|>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>", "<｜Use", "<|endof", "｜DSML｜"]
EMOJI = ["👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇯🇵", "🇺🇸", "❤️", "👍🏿", "🧑‍🤝‍🧑", "😀", "🤖", "✨", "🙏🏻", "👁️‍🗨️", "🐈‍⬛"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "\u0085", "\u200b", "\f", "\v"]


def prose(r):
    out = []
    for _ in range(r.randint(3, 12)):
        s = " ".join(r.choice(WORDS) for _ in range(r.randint(4, 20)))
        out.append(s[0].upper() + s[1:] + r.choice([".", "!", "?", ";", ",", ":"]))
    return " ".join(out)


def code(r):
    name = r.choice(["f", "compute_loss", "_helper", "Tokenizer", "x1"])
    lines = [f"def {name}(a, b={r.randint(0, 999)}):", f"    \"\"\"Docstring {r.random():.6f}.\"\"\"",
             f"    if a > {r.randint(-50, 50)}:", "        return a ** 2 + b  # square",
             "    for i in range(10):\n\t\tpass", "    return [x for x in a if x % 2 == 0]",
             "int main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  return v.size() > 2 ? 0 : -1;\n}",
             "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
             "const x = () => { return `template ${value}`; };  // js", "    " * r.randint(0, 4) + "}"]
    return "\n".join(r.sample(lines, r.randint(2, len(lines))))


def rand_json(r, depth=0):
    k = r.random()
    if depth > 3 or k < 0.3:
        return r.choice([r.randint(-10**9, 10**9), r.random() * 1e6, True, False, None, "str" * r.randint(0, 3),
                         "ünïcødé 中文 ✓", "line\nbreak \"quoted\" back\\slash"])
    if k < 0.65:
        return [rand_json(r, depth + 1) for _ in range(r.randint(0, 5))]
    return {r.choice(WORDS) + str(i): rand_json(r, depth + 1) for i in range(r.randint(0, 5))}


def cjk(r):
    ranges = [(0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3000, 0x303F)]
    out = []
    for _ in range(r.randint(5, 60)):
        a, b = r.choice(ranges)
        out.append(chr(r.randint(a, b)))
        if r.random() < 0.1:
            out.append(r.choice(["，", "。", " ", "、", "123", "abc", "！"]))
    return "".join(out)


def words_text(r, words):
    return " ".join(r.choice(words) for _ in range(r.randint(5, 40))) + r.choice([".", "؟", "!", ""])


def combining(r):
    base = "aeiouxyzAEIOU"
    return "".join(r.choice(base) + "".join(chr(r.randint(0x300, 0x36F)) for _ in range(r.randint(0, 4)))
                   for _ in range(r.randint(3, 30)))


def ws_digits(r):
    parts = []
    for _ in range(r.randint(3, 20)):
        c = r.random()
        if c < 0.4:
            parts.append(r.choice(SPACES) * r.randint(1, 8))
        elif c < 0.7:
            parts.append("".join(r.choice("0123456789") for _ in range(r.randint(1, 25))))
        elif c < 0.8:
            parts.append("".join(chr(0x660 + r.randint(0, 9)) for _ in range(r.randint(1, 7))))
        else:
            parts.append(r.choice(WORDS))
    return "".join(parts)


def mixed(r):
    gens = [prose, code, cjk, combining, ws_digits]
    parts = [r.choice(gens)(r) for _ in range(r.randint(2, 5))]
    for _ in range(r.randint(1, 4)):
        parts.insert(r.randint(0, len(parts)), r.choice(SPECIALS + EMOJI))
    return r.choice(["", " ", "\n"]).join(parts)


def emoji_text(r):
    return "".join(r.choice(EMOJI + [" ", "ok ", "\n", "👍"]) for _ in range(r.randint(3, 40)))


def random_unicode(r):
    """A random string biased towards interesting code points; always valid scalar values."""
    n = r.randint(0, 40)
    out = []
    for _ in range(n):
        c = r.random()
        if c < 0.25:
            cp = r.randint(0x20, 0x7E)
        elif c < 0.35:
            cp = ord(r.choice(" \t\n\r\x0b\x0c\x85\xa0\u2028\u3000"))
        elif c < 0.6:
            cp = r.randint(0x80, 0x2FFF)
        elif c < 0.75:
            cp = r.randint(0x3000, 0xD7FF)
        elif c < 0.85:
            cp = r.randint(0xE000, 0xFFFD)
        elif c < 0.95:
            cp = r.randint(0x1F000, 0x1FAFF)
        else:
            cp = r.randint(0x10000, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def make(out_dir, mb=1.2, n_random=10000, seed=0):
    r = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    docs = []
    with open(SEED_FILE, encoding="utf-8") as f:
        seed_text = f.read()
    docs.append(seed_text)
    docs.extend(line for line in seed_text.split("\n") if line)
    gens = [prose, prose, code, lambda r: json.dumps(rand_json(r), ensure_ascii=r.random() < 0.3, indent=r.choice([None, 2])),
            cjk, lambda r: words_text(r, CYR), lambda r: words_text(r, ARA), combining, ws_digits, mixed, emoji_text]
    size = sum(len(d.encode()) for d in docs)
    while size < mb * 1e6:
        d = r.choice(gens)(r)
        docs.append(d)
        size += len(d.encode())
    with open(os.path.join(out_dir, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    rr = random.Random(seed + 1)
    with open(os.path.join(out_dir, "random.jsonl"), "w", encoding="utf-8") as f:
        for _ in range(n_random):
            f.write(json.dumps(random_unicode(rr), ensure_ascii=False) + "\n")
    return os.path.join(out_dir, "corpus.jsonl"), os.path.join(out_dir, "random.jsonl")


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=1.2)
    ap.add_argument("--random", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    c, rnd = make(a.out, a.mb, a.random, a.seed)
    print(c, os.path.getsize(c), rnd, os.path.getsize(rnd))
