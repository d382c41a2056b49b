"""Text extractors for the default-model corpus: one function per Debian package family.

Each extractor takes the folder a .deb was unpacked into and yields documents (str). A document
is a unit of text that belongs together (a Bible chapter, a fortune, a dictionary entry group,
one documentation page); the corpus builder dedupes and splits train/held-out by document.
Markup is stripped crudely but deterministically: the goal is English prose, not fidelity.
"""
from __future__ import annotations

import gzip
import html
import html.parser
import re
import subprocess
from pathlib import Path
from typing import Iterator

_WS = re.compile(r"[ \t]+")
_BLANKS = re.compile(r"\n{3,}")


def tidy(text: str) -> str:
    """Collapse runs of spaces, strip trailing space, at most one blank line in a row."""
    lines = [_WS.sub(" ", ln).rstrip() for ln in text.replace("\r", "").split("\n")]
    return _BLANKS.sub("\n\n", "\n".join(lines)).strip()


def bible_kjv(root: Path, bible_bin: Path) -> Iterator[str]:
    """King James Version via the package's own `bible` reader: one document per chapter."""
    out = subprocess.run([str(bible_bin), "-p", str(root / "usr/lib"), "-l0", "Gen1:1-Rev22:21"],
                         check=True, capture_output=True, text=True).stdout
    title, verses = None, []
    for line in out.split("\n"):
        m = re.match(r"^\s+\d+ (.*)$", line)
        if m:
            verses.append(m.group(1).strip())
        elif line.strip():
            if title and verses:
                yield f"{title}\n\n" + " ".join(verses)
            title, verses = line.strip(), []
    if title and verses:
        yield f"{title}\n\n" + " ".join(verses)


def fortunes(root: Path) -> Iterator[str]:
    """BSD fortune files ('%' lines separate entries); the offensive set is not shipped here."""
    base = root / "usr/share/games/fortunes"
    for f in sorted(base.rglob("*")):
        if f.is_file() and f.suffix not in (".dat", ".u8") and not f.is_symlink() and "off" not in f.parts:
            for entry in f.read_text(encoding="latin-1").split("\n%\n"):
                if entry.strip("%\n "):
                    yield tidy(entry)


_GCIDE_PRON = re.compile(r"\\[^\\\n]{1,80}\\,?")        # \Ar"is*tar`chy\, pronunciation
_GCIDE_TAG = re.compile(r"\s*\[(?:1913 Webster|WordNet 1\.5|PJC|Century Dict\.|Webster 1913 Suppl\.)[^\]]*\]")


def gcide_clean(entry: str) -> str:
    """Drop GCIDE's pronunciation spans and source tags, unwrap {cross references}."""
    entry = _GCIDE_PRON.sub("", entry)
    entry = _GCIDE_TAG.sub("", entry)
    return entry.replace("{", "").replace("}", "")


def dictd(root: Path, name: str, per_doc: int = 8, clean=None) -> Iterator[str]:
    """A dictd database (.dict.dz + .index): entries in index order, `per_doc` per document,
    skipping the 00-database-* header entries; `clean` rewrites each entry."""
    data = gzip.open(root / f"usr/share/dictd/{name}.dict.dz").read()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64(s: str) -> int:
        v = 0
        for c in s:
            v = v * 64 + alphabet.index(c)
        return v

    spans = set()
    for line in (root / f"usr/share/dictd/{name}.index").read_text(encoding="utf-8", errors="replace").split("\n"):
        parts = line.split("\t")
        if len(parts) >= 3 and not parts[0].startswith("00-database") and not parts[0].startswith("00database"):
            spans.add((b64(parts[1]), b64(parts[2])))
    group = []
    for off, n in sorted(spans):
        entry = data[off:off + n].decode("utf-8", errors="replace")
        group.append(tidy(clean(entry) if clean else entry))
        if len(group) == per_doc:
            yield "\n\n".join(group)
            group = []
    if group:
        yield "\n\n".join(group)


def wordnet(root: Path, per_doc: int = 40) -> Iterator[str]:
    """WordNet synsets as 'word, word: gloss' lines, `per_doc` lines per document."""
    for pos in ("noun", "verb", "adj", "adv"):
        group = []
        for line in (root / f"usr/share/wordnet/data.{pos}").read_text(encoding="latin-1").split("\n"):
            if not line or line.startswith("  ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            f = head.split()
            n = int(f[3], 16)
            words = [f[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]
            group.append(f"{', '.join(words)} ({pos}): {gloss.strip()}")
            if len(group) == per_doc:
                yield "\n".join(group)
                group = []
        if group:
            yield "\n".join(group)


class _HtmlText(html.parser.HTMLParser):
    """Visible text of an HTML page; block elements become line breaks, scripts/nav dropped."""
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt", "dd", "table",
             "section", "blockquote"}
    SKIP = {"script", "style", "head", "nav"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_pages(root: Path, pattern: str) -> Iterator[str]:
    for f in sorted(root.glob(pattern)):
        p = _HtmlText()
        p.feed(f.read_text(encoding="utf-8", errors="replace"))
        text = tidy("".join(p.parts))
        if len(text) > 200:
            yield text


def text_files(root: Path, pattern: str) -> Iterator[str]:
    for f in sorted(root.glob(pattern)):
        text = tidy(f.read_text(encoding="utf-8", errors="replace"))
        if len(text) > 200:
            yield text


_POD_CODE = re.compile(r"[BCFIELSXZ]<+\s*([^<>]*?)\s*>+")


def pod_files(root: Path, pattern: str) -> Iterator[str]:
    """Perl POD: drop directives other than headings, unwrap B<> C<> I<> L<> ... codes."""
    for f in sorted(root.glob(pattern)):
        lines = []
        for ln in f.read_text(encoding="utf-8", errors="replace").split("\n"):
            if ln.startswith("=head") or ln.startswith("=item"):
                lines.append(ln.split(" ", 1)[1] if " " in ln else "")
            elif ln.startswith("="):
                continue
            else:
                lines.append(ln)
        text = "\n".join(lines)
        for _ in range(3):
            text = _POD_CODE.sub(lambda m: m.group(1).split("|")[0], text)
        text = tidy(text)
        if len(text) > 200:
            yield text


def man_pages(root: Path) -> Iterator[str]:
    """roff man pages rendered by the host's groff (ASCII, no hyphenation, no adjusting)."""
    for f in sorted((root / "usr/share/man").rglob("*.gz")):
        src = gzip.open(f).read()
        if src.startswith(b".so "):
            continue   # an alias page
        r = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou", "-rLL=100n", "-rHY=0", "-dAD=l"],
                           input=src, capture_output=True)
        text = tidy(html.unescape(r.stdout.decode("utf-8", errors="replace")))
        if len(text) > 200:
            yield text
