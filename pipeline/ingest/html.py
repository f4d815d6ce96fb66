"""HTML to text for web inputs: the extractor a user picks (``ingest.html.extractor``) and the page's charset.

Three extractors users know: resiliparse (DCLM's; the default: on this machine's real HTML it is ~20x faster
than trafilatura per core and keeps as much of the pages' words, see ``tests/bench/bench_web.py``), trafilatura
(FineWeb's and datatrove's; its defaults here are datatrove's but for deduplication, which acts within a page
here: 96.3% of pages get datatrove's text as it ships) and jusText (The Pile's). ``ingest.html.options`` are passed to the extractor's function unchanged. An extractor that is not
installed is an error naming the pip extra that installs it, raised when the extractor is built (before any
record is read), so a build never quarantines a whole crawl for a missing package.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

EXTRACTORS = ("resiliparse", "trafilatura", "justext")
# datatrove's Trafilatura defaults (favor_precision, no comments, deduplicate), with one difference: datatrove's
# deduplication spans every page a process reads, ours each page on its own (see _trafilatura), so a page's text
# does not depend on the worker that read it.
DEFAULT_OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "resiliparse": {"main_content": True},
    "trafilatura": {"favor_precision": True, "include_comments": False, "deduplicate": True},
    "justext": {"stoplist": "English"},
}
_EXTRAS = {"resiliparse": "resiliparse", "trafilatura": "trafilatura", "justext": "justext"}
# <meta charset="x"> or <meta http-equiv="Content-Type" content="text/html; charset=x"> in the page's head
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:\-]{1,40})""", re.I)
META_SNIFF_BYTES = 4096  # browsers look at the first 1024 bytes (HTML5 prescan); real pages put it later
Extractor = Callable[[str], str]


@dataclass(frozen=True, kw_only=True)
class HtmlConfig:
    """How an HTML payload becomes text: the extractor and its options (merged over ``DEFAULT_OPTIONS``)."""

    extractor: str = "resiliparse"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ValueError(f"ingest.html.extractor must be one of {EXTRACTORS}, got {self.extractor!r}")
        if not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options):
            raise ValueError(f"ingest.html.options must map option names to values, got {self.options!r}")

    def resolved_options(self) -> dict[str, Any]:
        return {**DEFAULT_OPTIONS[self.extractor], **self.options}


class ExtractorMissing(ValueError):
    """The configured extractor's package is not installed; the message names the pip extra."""


def _missing(name: str, exc: ImportError) -> ExtractorMissing:
    command = f"pip install 'pileworks[{_EXTRAS[name]}]'"
    said = " ".join(str(exc).split())  # lxml's own message is two lines: the error must stay one
    if "lxml.html.clean" in said or "lxml_html_clean" in said:  # lxml >= 5.2 moved it out
        command = "pip install lxml_html_clean"
    elif "LRUCache" in said:  # trafilatura before 2.3 has no cache to give per page
        command = "pip install 'trafilatura>=2.3'"
    return ExtractorMissing(
        f"ingest.html.extractor: {name} is not installed or not usable ({said}); install it with "
        f"{command} or choose another extractor ({', '.join(EXTRACTORS)})"
    )


def _resiliparse(options: dict[str, Any]) -> Extractor:
    try:
        from resiliparse.extract.html2text import extract_plain_text
        from resiliparse.parse.html import HTMLTree
    except ImportError as exc:
        raise _missing("resiliparse", exc) from exc
    return lambda html: extract_plain_text(HTMLTree.parse(html), **options)


def _trafilatura(options: dict[str, Any]) -> Extractor:
    try:
        import trafilatura
        from trafilatura.deduplication import LRU_SIZE, LRUCache
    except ImportError as exc:
        raise _missing("trafilatura", exc) from exc
    if not options.get("deduplicate"):
        return lambda html: trafilatura.extract(html, **options) or ""
    # trafilatura's `deduplicate` keeps one cache per process across documents, so which paragraphs a page
    # keeps would depend on the pages the same worker read before it (78 against 82 documents at 1 and 2
    # workers): a fresh cache per page keeps the deduplication within the page, the same on any worker count
    options = {k: v for k, v in options.items() if k != "deduplicate"}
    return lambda html: trafilatura.extract(html, deduplicate=LRUCache(maxsize=LRU_SIZE), **options) or ""


def _justext(options: dict[str, Any]) -> Extractor:
    try:
        import justext
        from lxml.etree import ParserError
    except ImportError as exc:
        raise _missing("justext", exc) from exc
    options = dict(options)
    stoplist = justext.get_stoplist(options.pop("stoplist"))

    def extract(html: str) -> str:
        try:
            paragraphs = justext.justext(html, stoplist, **options)
        except ParserError:  # lxml's "Document is empty" (an empty page, or only a comment): no text
            return ""
        return "\n\n".join(p.text for p in paragraphs if not p.is_boilerplate)

    return extract


_BUILDERS: Mapping[str, Callable[[dict[str, Any]], Extractor]] = {
    "resiliparse": _resiliparse,
    "trafilatura": _trafilatura,
    "justext": _justext,
}
_BUILT: dict[str, Extractor] = {}


def build_extractor(cfg: HtmlConfig) -> Extractor:
    """The extractor of ``cfg`` (one per distinct config and process: trafilatura's import takes a second)."""
    key = repr((cfg.extractor, sorted(cfg.resolved_options().items())))
    if key not in _BUILT:
        _BUILT[key] = _BUILDERS[cfg.extractor](cfg.resolved_options())
    return _BUILT[key]


def known_charset(label: str | None) -> str | None:
    """The Python codec of a charset label (``ISO-8859-1``, ``utf8``...), or None when no codec has that name.
    Like browsers, latin-1 and ASCII labels read as windows-1252 (its superset: real pages mislabel it)."""
    if not label:
        return None
    try:
        name = codecs.lookup(label.strip().strip("\"'")).name
    except LookupError:
        return None
    return "cp1252" if name in ("latin-1", "iso8859-1", "ascii") else name


def meta_charset(head: bytes) -> str | None:
    """The charset label a page declares in a ``<meta>`` tag of its first ``META_SNIFF_BYTES``, or None."""
    found = _META_CHARSET.search(head[:META_SNIFF_BYTES])
    return found.group(1).decode("ascii", "replace") if found else None


def header_charset(content_type: str) -> str | None:
    """The ``charset=`` parameter of a Content-Type header value, or None."""
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip():
            return value.strip().strip("\"'")
    return None
