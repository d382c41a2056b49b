#!/usr/bin/env python3
"""Assemble the default model's English corpus from Debian packages (issue #21).

    tools/corpus/build_corpus.py [--out .corpus] [--heldout-percent 1]

Downloads the packages below with `apt-get download` (no installation), unpacks them with
`dpkg-deb -x`, extracts plain text (tools/corpus/extract.py), removes duplicate paragraphs,
and splits documents into train / held-out by a hash of their text (deterministic: the same
packages always give the same split). Writes under --out (git-ignored):
    train.jsonl, heldout.jsonl   one JSON string per line = one document
    manifest.json                per source: package, version, licence, documents, bytes
The corpus is not committed; this script and the package versions in manifest.json are what
makes it reproducible. Needs: apt-get (an updated package list), dpkg-deb, groff.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import extract as ex  # noqa: E402

# name -> (packages, licence of the text as stated in the package's debian/copyright, extractor)
DOC = "usr/share/doc"
SOURCES = {
    "bible-kjv": (["bible-kjv-text", "bible-kjv"], "public domain (KJV text; copyright expired)",
                  lambda r: ex.bible_kjv(r["bible-kjv-text"], r["bible-kjv"] / "usr/bin/bible")),
    "fortunes": (["fortunes", "fortunes-min"], "BSD (fortune-mod data)",
                 lambda r: list(ex.fortunes(r["fortunes"])) + list(ex.fortunes(r["fortunes-min"]))),
    "gcide": (["dict-gcide"], "GPL-2+ (GNU Collaborative International Dictionary of English, from Webster's 1913)",
              lambda r: ex.dictd(r["dict-gcide"], "gcide", clean=ex.gcide_clean)),
    "devil": (["dict-devil"], "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)",
              lambda r: ex.dictd(r["dict-devil"], "devil", per_doc=4)),
    "jargon": (["dict-jargon"], "public domain (The Jargon File 4.4.7)",
               lambda r: ex.dictd(r["dict-jargon"], "jargon", per_doc=4)),
    "wordnet": (["wordnet-base"], "WordNet 3.0 licence (permissive, Princeton University)",
                lambda r: ex.wordnet(r["wordnet-base"])),
    "python-docs": (["python3.11-doc"], "PSF-2.0 (Python documentation)",
                    lambda r: ex.text_files(r["python3.11-doc"], f"{DOC}/python3.11/html/_sources/**/*.txt")),
    "perl-docs": (["perl-doc"], "GPL-1+ or Artistic (Perl documentation)",
                  lambda r: ex.pod_files(r["perl-doc"], "usr/share/perl/*/pod/*.pod")),
    "postgresql-docs": (["postgresql-doc-15"], "PostgreSQL licence (BSD-like)",
                        lambda r: ex.html_pages(r["postgresql-doc-15"], f"{DOC}/postgresql-doc-15/html/*.html")),
    "debian-reference": (["debian-reference-en"], "GPL-2+",
                         lambda r: ex.html_pages(r["debian-reference-en"], "usr/share/debian-reference/*.en.html")),
    "git-docs": (["git-doc"], "GPL-2", lambda r: ex.text_files(r["git-doc"], f"{DOC}/git-doc/**/*.txt")),
    "bash-docs": (["bash-doc"], "GPL-3+", lambda r: ex.html_pages(r["bash-doc"], f"{DOC}/bash/*.html")),
    "manpages": (["manpages"], "various free licences (GPL-2+, BSD, Verbatim; see its debian/copyright)",
                 lambda r: ex.man_pages(r["manpages"])),
}


def fetch(pkgs: list[str], debs: Path, unpacked: Path) -> dict:
    """Download and unpack each package once; returns name -> (root folder, version)."""
    debs.mkdir(parents=True, exist_ok=True)
    out = {}
    for p in pkgs:
        found = sorted(debs.glob(f"{p}_*.deb"))
        if not found:
            subprocess.run(["apt-get", "download", p], cwd=debs, check=True, capture_output=True)
            found = sorted(debs.glob(f"{p}_*.deb"))
        root = unpacked / p
        if not root.exists():
            root.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(found[-1]), str(root)], check=True)
        version = subprocess.run(["dpkg-deb", "-f", str(found[-1]), "Version"], check=True, capture_output=True,
                                 text=True).stdout.strip()
        out[p] = (root, version)
    return out


def norm_key(par: str) -> bytes:
    return hashlib.sha1(re.sub(r"\W+", " ", par.lower()).strip().encode()).digest()


def dedupe(doc: str, seen: set) -> str:
    """Drop paragraphs seen before (anywhere in the corpus); short ones (< 40 chars) always stay
    since headings and one-liners repeat legitimately."""
    keep = []
    for par in doc.split("\n\n"):
        if len(par) >= 40:
            k = norm_key(par)
            if k in seen:
                continue
            seen.add(k)
        keep.append(par)
    return "\n\n".join(keep).strip()


def is_heldout(doc: str, percent: float) -> bool:
    h = int.from_bytes(hashlib.sha256(doc.encode()).digest()[:8], "little")
    return (h % 10000) < percent * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / ".corpus"))
    ap.add_argument("--heldout-percent", type=float, default=1.0)
    args = ap.parse_args()
    out = Path(args.out)
    seen: set = set()
    manifest = {"sources": {}, "heldout_percent": args.heldout_percent}
    with open(out / "train.jsonl", "w") as ftr, open(out / "heldout.jsonl", "w") as fho:
        for name, (pkgs, licence, fn) in SOURCES.items():
            got = fetch(pkgs, out / "debs", out / "x")
            n_docs = n_bytes = n_held = 0
            for doc in fn({p: root for p, (root, _) in got.items()}):
                doc = dedupe(doc, seen)
                if len(doc) < 20:
                    continue
                held = is_heldout(doc, args.heldout_percent)
                (fho if held else ftr).write(json.dumps(doc, ensure_ascii=False) + "\n")
                n_docs += 1
                n_held += held
                n_bytes += len(doc.encode())
            manifest["sources"][name] = {"packages": {p: v for p, (_, v) in got.items()}, "licence": licence,
                                         "documents": n_docs, "heldout_documents": n_held, "bytes": n_bytes}
            print(f"{name:18s} {n_docs:7d} docs {n_bytes / 1e6:7.2f} MB  ({licence})", flush=True)
    total = sum(s["bytes"] for s in manifest["sources"].values())
    manifest["total_bytes"] = total
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"total {total / 1e6:.2f} MB -> {out}")


if __name__ == "__main__":
    main()
