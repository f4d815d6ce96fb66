"""Rebuild the bundled sample corpus from Debian documentation packages.

Not run by the tests: it needs ``apt-get`` and ``dpkg-deb`` (a Debian/Ubuntu host with network access to a Debian
mirror). Usage, from the repository root::

    apt-get update
    python pipeline/sample_corpus/build_sample.py [--out pipeline/sample_corpus] [--work /tmp/pw-sample]

It downloads (``apt-get download``, nothing is installed) the packages in ``PACKAGES``, unpacks them with
``dpkg-deb -x``, turns the DocBook HTML into plain text with :mod:`html.parser` and writes:

- ``<group>.jsonl.zst``: The Pile layout, ``{"text": ..., "meta": {"source", "path", "license", "version", "lang"}}``,
  one document per HTML chapter (or per plain-text file for doc-debian);
- ``licenses/<NAME>.txt``: the licence texts of ``base-files`` (GPL-2 vs GPL-3 vs LGPL: natural near-duplicates);
- ``legacy/*.txt``: a few short chapters re-encoded to CP1252, UTF-16 (BOM), Shift-JIS and GB18030 to exercise
  detection (French has U+2019, so strict Latin-1 cannot hold it; CP1252 is its superset).

The output is deterministic for given package versions (sorted inputs, fixed zstd level, sorted JSON keys).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import zstandard

# group -> list of (package, lang, licence, glob of documents inside the unpacked package)
PACKAGES: dict[str, list[tuple[str, str, str, str]]] = {
    "debian-reference": [
        (f"debian-reference-{lang}", lang, "GPL-2+", f"usr/share/debian-reference/*.{lang}.html")
        for lang in ("en", "de", "es", "fr", "it", "ja", "pt", "zh-cn", "zh-tw")
    ],
    "debian-faq": [
        ("debian-faq", "en", "debian-faq-permissive", "usr/share/doc/debian/FAQ/*.en.html"),
        ("debian-faq-de", "de", "debian-faq-permissive", "usr/share/doc/debian/FAQ/de/*.de.html"),
        ("debian-faq-fr", "fr", "debian-faq-permissive", "usr/share/doc/debian/FAQ/fr/*.fr.html"),
        ("debian-faq-ja", "ja", "debian-faq-permissive", "usr/share/doc/debian/FAQ/ja/*.ja.html"),
        ("debian-faq-ru", "ru", "debian-faq-permissive", "usr/share/doc/debian/FAQ/ru/*.ru.html"),
        ("debian-faq-zh-cn", "zh-cn", "debian-faq-permissive", "usr/share/doc/debian/FAQ/zh-cn/*.zh-cn.html"),
    ],
    "developers-reference": [
        ("developers-reference", "en", "GPL-2+", "usr/share/developers-reference/*.html"),
        *[
            (f"developers-reference-{lang}", lang, "GPL-2+", f"usr/share/developers-reference/{lang}/*.html")
            for lang in ("de", "fr", "ja")
        ],
    ],
    "maint-guide": [("maint-guide", "en", "GPL-2+", "usr/share/doc/maint-guide/html/*.en.html")],
    "doc-debian": [("doc-debian", "en", "OPL-1.0/GPL", "usr/share/doc/debian/*")],
}
LICENSE_PACKAGE = "base-files"
LICENSE_NAMES = (
    "GPL-2",
    "GPL-3",
    "LGPL-2.1",
    "LGPL-3",
    "Apache-2.0",
    "MPL-1.1",
    "MPL-2.0",
    "GFDL-1.2",
    "GFDL-1.3",
    "Artistic",
    "BSD",
    "CC0-1.0",
)
# (package, document inside it, codec): short chapters re-encoded to legacy codecs, losslessly.
LEGACY = [
    ("debian-reference-fr", "usr/share/debian-reference/pr01.fr.html", "cp1252"),
    ("debian-reference-de", "usr/share/debian-reference/pr01.de.html", "utf-16"),  # with a BOM
    ("debian-reference-ja", "usr/share/debian-reference/pr01.ja.html", "shift_jis"),
    ("debian-reference-zh-cn", "usr/share/debian-reference/pr01.zh-cn.html", "gb18030"),
]
BLOCK_TAGS = {
    "p",
    "div",
    "br",
    "li",
    "tr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "dt",
    "dd",
    "table",
    "title",
    "blockquote",
    "ul",
    "ol",
    "dl",
}
# navigation of DocBook and Sphinx pages, and Sphinx's "¶" permalinks
SKIP_CLASSES = {"navheader", "navfooter", "toc", "related", "sphinxsidebar", "footer", "headerlink"}
# Sphinx pages that are not prose, or (the single-page manual) repeat every chapter
SKIP_NAMES = {"developers-reference.html", "search.html", "genindex.html"}


class _TextExtractor(HTMLParser):
    """DocBook/Sphinx HTML -> text: blocks become line breaks, <pre> keeps its layout, navigation is dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.pre = 0
        self.skip_tag = ""  # the element type of the skipped subtree we are in, if any
        self.skip_depth = 0  # >0 while inside it (counts nested elements of that type)
        self.in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = set((dict(attrs).get("class") or "").split())
        if self.skip_depth:
            self.skip_depth += tag == self.skip_tag
            return
        if classes & SKIP_CLASSES:
            self.skip_tag, self.skip_depth = tag, 1
            return
        if tag in ("head", "script", "style"):
            self.in_head = True
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK_TAGS:
            self.out.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4", "table") else "\n")

    def handle_endtag(self, tag: str) -> None:
        if self.skip_depth:
            self.skip_depth -= tag == self.skip_tag
            return
        if tag in ("head", "script", "style"):
            self.in_head = False
        if tag == "pre":
            self.pre -= 1
        if tag in BLOCK_TAGS:
            self.out.append("\n")
        elif tag in ("td", "th"):
            self.out.append("\t")

    def handle_data(self, data: str) -> None:
        if self.skip_depth or self.in_head:
            return
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self) -> str:
        raw = "".join(self.out)
        lines = [line.rstrip() for line in raw.split("\n")]
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def html_to_text(html: str) -> str:
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    return parser.text()


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    root: Path


def fetch(name: str, work: Path) -> Package:
    """``apt-get download`` + ``dpkg-deb -x`` into ``work/<name>``."""
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", name], cwd=debs, check=True)
    deb = sorted(debs.glob(f"{name}_*.deb"))[-1]
    version = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    root = work / "x" / name
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return Package(name, version, root)


def read_document(path: Path) -> str | None:
    """Text of one packaged document, or None for things that are not prose (pdf, images)."""
    data = path.read_bytes()
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if path.name.endswith(".pdf") or path.name.endswith(".pdf.gz") or b"\x00" in data[:4096]:
        return None
    text = data.decode("utf-8")
    return html_to_text(text) if ".html" in path.name else text


def write_group(out: Path, group: str, packages: dict[str, Package]) -> int:
    lines: list[bytes] = []
    for name, lang, license_, pattern in PACKAGES[group]:
        pkg = packages[name]
        for path in sorted(pkg.root.glob(pattern)):
            if path.name in SKIP_NAMES or not path.is_file():
                continue
            if (text := read_document(path)) is None or len(text) < 200:
                continue
            meta = {
                "source": name,
                "path": str(path.relative_to(pkg.root)),
                "license": license_,
                "version": pkg.version,
                "lang": lang,
            }
            lines.append(
                json.dumps({"text": text, "meta": meta}, ensure_ascii=False, sort_keys=True).encode()
            )
    raw = b"\n".join(lines) + b"\n"
    (out / f"{group}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=19).compress(raw))
    return len(lines)


def write_licenses(out: Path, pkg: Package) -> None:
    folder = out / "licenses"
    folder.mkdir(exist_ok=True)
    for name in LICENSE_NAMES:
        data = (pkg.root / "usr/share/common-licenses" / name).read_bytes()
        (folder / f"{name}.txt").write_bytes(data)


def write_legacy(out: Path, packages: dict[str, Package]) -> None:
    folder = out / "legacy"
    folder.mkdir(exist_ok=True)
    for name, doc, codec in LEGACY:
        text = read_document(packages[name].root / doc)
        assert text is not None
        data = text.encode(codec)  # strict: the re-encoding must be lossless
        if data.decode(codec) != text:
            raise ValueError(f"{name}/{doc} does not round-trip through {codec}")
        stem = Path(doc).name.removesuffix(".html")
        (
            folder / f"{name.removeprefix('debian-reference-')}-{stem}.{codec.replace('_', '-')}.txt"
        ).write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pw-sample"))
    args = parser.parse_args()
    names = sorted({p for entries in PACKAGES.values() for p, *_ in entries} | {LICENSE_PACKAGE})
    packages = {name: fetch(name, args.work) for name in names}
    for group in PACKAGES:
        print(f"{group}: {write_group(args.out, group, packages)} documents")
    write_licenses(args.out, packages[LICENSE_PACKAGE])
    write_legacy(args.out, packages)
    print("versions: " + ", ".join(f"{p.name}={p.version}" for p in packages.values()))


if __name__ == "__main__":
    main()
