"""URL rules for documents that carry a URL (WARC/WET records, or ``ingest.url_field`` of jsonl/parquet).

``clean.url.blocklist``: files (local paths, ``file://``, ``s3://``, ``gs://`` or ``az://``), one domain or
URL per line (``#`` comments and blank lines ignored, UT1/dolma-style lists work as they are). A domain blocks
itself and every subdomain (``example.com`` blocks ``www.example.com``, not ``badexample.com``); a URL (with a
``/`` or a scheme) blocks that page, compared without its scheme, ``www.``, fragment and trailing slash. Drop
reason ``url_blocklisted``.

``clean.url.banned_words``: words that may not appear in the host or path, as a whole token between
non-alphanumeric characters (datatrove's URLFilter matches banned words the same way), so ``sex`` drops
``sex-shop.example`` but not ``essex.example``. Drop reason ``url_banned_word``.

A document without a URL is never dropped by these rules.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.records import normalize_url, url_host
from pipeline.storage import STORE_URI_HELP, S3Options, is_store_uri, read_object

_TOKEN = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, kw_only=True)
class UrlConfig:
    # files or store objects (s3://, gs://, az://): one domain or URL per line
    blocklist: tuple[str, ...] = ()
    banned_words: tuple[str, ...] = ()  # words that may not appear (as a token) in the host or path

    def __post_init__(self) -> None:
        for path in self.blocklist:
            if not isinstance(path, str) or not path.strip() or not is_store_uri(path):
                raise ValueError(f"clean.url.blocklist: {path!r} must be {STORE_URI_HELP} URI")
        for word in self.banned_words:
            if not isinstance(word, str) or _TOKEN.sub("", word.lower()) != word.lower() or not word:
                raise ValueError(
                    f"clean.url.banned_words: {word!r} must be one word of letters and digits (it is matched as "
                    "a whole token of the host or path)"
                )

    @property
    def enabled(self) -> bool:
        return bool(self.blocklist or self.banned_words)


def _page_key(url: str) -> str:
    """A URL without scheme, ``www.``, fragment and trailing slash, its host as :func:`url_host` gives it: how
    pages are compared."""
    url = normalize_url(url)
    parts = urlsplit(url if "://" in url else "http://" + url)
    host = url_host(url).removeprefix("www.")
    path = parts.path.rstrip("/")
    return host + path + (f"?{parts.query}" if parts.query else "")


class UrlRules:
    """A compiled blocklist (domains and pages) and banned words; ``digest``: what they decide with, for a
    build's unit keys (a new list at the same URI redoes clean)."""

    def __init__(self, lines: Iterable[str], banned_words: Iterable[str]):
        domains, pages = set(), set()
        for raw in lines:
            entry = raw.split("#", 1)[0].strip().lower()
            if not entry:
                continue
            if "/" in entry.split("://", 1)[-1] or "://" in entry:
                pages.add(_page_key(entry))
            else:
                domain = entry.removeprefix("*.").removeprefix("www.").strip(".")
                domains.add(url_host(domain) or domain)
        self.domains, self.pages = frozenset(domains), frozenset(pages)
        self.banned = frozenset(w.lower() for w in banned_words)
        payload = "\n".join([*sorted(self.domains), "--", *sorted(self.pages), "--", *sorted(self.banned)])
        self.digest = hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def reason(self, url: str) -> str | None:
        """``url_blocklisted``, ``url_banned_word`` or None."""
        url = normalize_url(url)  # documents ingested before URLs were normalised at read time
        try:
            parts = urlsplit(url if "://" in url else "http://" + url)
            host = url_host(url) if parts.hostname else ""
        except ValueError:  # a malformed URL (bad IPv6 brackets): judged on its raw text
            parts, host = None, url.lower()
        if self.domains:
            labels = host.split(".")
            if any(".".join(labels[i:]) in self.domains for i in range(len(labels))):
                return "url_blocklisted"
        if self.pages and parts is not None and _page_key(url) in self.pages:
            return "url_blocklisted"
        if self.banned:
            where = f"{host} {parts.path if parts else ''}".lower()
            if not self.banned.isdisjoint(_TOKEN.split(where)):
                return "url_banned_word"
        return None


@functools.lru_cache(maxsize=8)
def _rules(data: tuple[bytes, ...], banned: tuple[str, ...]) -> UrlRules:
    lines = (line for blob in data for line in blob.decode("utf-8", "replace").splitlines())
    return UrlRules(lines, banned)


def load_url_rules(cfg: UrlConfig, s3: S3Options | None) -> UrlRules | None:
    """The rules of ``cfg`` with its blocklists read through ``pipeline.storage`` (None: no URL rule), compiled
    once per distinct content."""
    if not cfg.enabled:
        return None
    blobs = [read_object(uri, s3, "clean.url.blocklist") for uri in cfg.blocklist]
    return _rules(tuple(blobs), tuple(cfg.banned_words))
