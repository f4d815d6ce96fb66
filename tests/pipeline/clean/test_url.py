"""The URL rules: a domain blocks its subdomains and nothing else, a URL blocks its page, banned words match
whole tokens of the host or path; clean drops by reason and per source; blocklists load from S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.clean.config import CleanConfig, QualityConfig
from pipeline.clean.langid import LangIdConfig
from pipeline.clean.stage import clean_batch, run_clean_part
from pipeline.clean.url import UrlConfig, UrlRules, load_url_rules
from pipeline.records import Record, read_part, write_part
from pipeline.storage import open_store
from pipeline.units.protocol import StageStats

RULES = UrlRules(
    [
        "# a comment",
        "",
        "bad.example",
        "*.spam.test",
        "https://www.news.example/story/7/",
        "WWW.Shout.example",
    ],
    ["casino", "porn"],
)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://bad.example/a", "url_blocklisted"),
        ("https://www.bad.example", "url_blocklisted"),
        ("https://deep.sub.bad.example:8080/x", "url_blocklisted"),
        ("http://notbad.example/", None),  # a domain is a suffix of labels, not of characters
        ("http://bad.example.org/", None),
        ("http://a.spam.test/", "url_blocklisted"),
        ("http://shout.example/", "url_blocklisted"),
        ("http://news.example/story/7", "url_blocklisted"),  # the page, without scheme, www. and trailing /
        ("http://news.example/story/7#top", "url_blocklisted"),
        ("http://news.example/story/8", None),
        ("http://online-casino.example/", "url_banned_word"),
        ("http://example.org/best/porn/videos", "url_banned_word"),
        ("http://casinorama.example/", None),  # a whole token only (datatrove's URLFilter does the same)
        ("http://[::1/", None),  # a malformed URL is judged on its text, never raises
    ],
)
def test_url_rules(url: str, reason: str | None) -> None:
    assert RULES.reason(url) == reason


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="banned_words"):
        UrlConfig(banned_words=("two words",))
    with pytest.raises(ValueError, match="blocklist"):
        UrlConfig(blocklist=("http://lists.example/list.txt",))
    assert load_url_rules(UrlConfig(), None) is None


def _doc(i: int, url: str | None, source: str) -> Record:
    text = " ".join(["the quick brown fox jumps over the lazy dog near the river bank today"] * 8)
    meta = {"source_name": source, "source_entry": 0, **({"url": url} if url else {})}
    return Record(f"f.warc.gz#B{i}", text, "file:///f.warc.gz", json.dumps(meta))


CFG = CleanConfig(quality=QualityConfig(enabled=False), langid=LangIdConfig(enabled=False))


def test_clean_drops_by_url_counted_per_source(tmp_path: Path) -> None:
    blocklist = tmp_path / "block.txt"
    blocklist.write_text("bad.example\n")
    cfg = CleanConfig(
        quality=CFG.quality,
        langid=CFG.langid,
        url=UrlConfig(blocklist=(str(blocklist),), banned_words=("casino",)),
    )
    docs = [
        _doc(0, "http://www.bad.example/", "web"),
        _doc(1, "http://casino.example/", "web"),
        _doc(2, "http://good.example/", "web"),
        _doc(3, None, "books"),  # no URL: no URL rule applies
    ]
    kept, stats = clean_batch(docs, cfg)
    assert [r.id for r in kept] == ["f.warc.gz#B2", "f.warc.gz#B3"]
    assert stats.dropped == {"url_blocklisted": 1, "url_banned_word": 1}
    assert stats.tally[("url_blocklisted", "web", "und")][0] == 1
    assert stats.tally[("url_banned_word", "web", "und")][0] == 1
    assert [e["id"] for e in stats.examples["url_blocklisted"]] == ["f.warc.gz#B0"]


def test_a_blocklist_on_each_cloud_store(cloud_bucket) -> None:
    store = open_store(cloud_bucket.uri, s3=cloud_bucket.options)
    store.put_bytes("lists/block.txt", b"bad.example\n")
    cfg = CleanConfig(
        quality=CFG.quality,
        langid=CFG.langid,
        url=UrlConfig(blocklist=(f"{cloud_bucket.uri}/lists/block.txt",)),
    )
    write_part(
        store,
        "in",
        0,
        [_doc(0, "http://x.bad.example/", "web"), _doc(1, "http://ok.example/", "web")],
        StageStats(stage="ingest"),
    )
    stats = run_clean_part(store, "in", "out", 0, cfg)
    assert stats.dropped == {"url_blocklisted": 1}
    assert [r.id for r in read_part(store, "out", 0)] == ["f.warc.gz#B1"]
