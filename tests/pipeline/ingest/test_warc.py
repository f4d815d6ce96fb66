"""WARC/WET ingest over files written in-process: documents with their URL and date, ids at record offsets,
skipped payloads counted by type, and every kind of damaged record quarantined while the rest of the file goes on."""

from __future__ import annotations

import gzip
import json
import random
import zlib
from collections import Counter
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator

from pipeline.ingest.config import IngestConfig
from pipeline.ingest.html import ExtractorMissing, HtmlConfig, build_extractor, known_charset, meta_charset
from pipeline.ingest.warc import split_http
from tests.fixtures.web_archives import Response, article, html_page, write_warc, write_wet
from tests.pipeline.ingest.test_ingest import ingest_all


def pages(n: int, seed: int = 0, host: str = "site") -> list[Response]:
    rng = random.Random(seed)
    return [
        Response(f"https://{host}{i}.example/p/{i}", html_page(f"Page {i}", article(rng)).encode())
        for i in range(n)
    ]


@pytest.mark.parametrize("gz", [True, False])
def test_warc_responses_become_documents_with_url_date_and_offsets(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / ("crawl.warc.gz" if gz else "crawl.warc")
    responses = pages(3)
    offsets = write_warc(path, responses, gz=gz)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert [r.id for r in records] == [f"file://{path}#B{o}" for o in offsets]
    for rec, resp in zip(records, responses, strict=True):
        meta = rec.meta_dict()
        assert meta["url"] == resp.url and meta["warc_date"].startswith("20")
        assert meta["user"]["warc_record_id"].startswith("<urn:uuid:")
        assert meta["user"]["content_type"] == "text/html"
        assert "<" not in rec.text and "tracker" not in rec.text and "color: red" not in rec.text
        assert "The " in rec.text
    assert stats.extra["warc_skipped.request"] == 3 and stats.extra["warc_skipped.warcinfo"] == 1
    # the id's offset is where the record starts: a parser started there reads that very record
    with open(path, "rb") as f:
        f.seek(offsets[1])
        first = next(iter(ArchiveIterator(f, parse_http=False)))
        assert first.headers.get("WARC-Target-URI") == responses[1].url


def test_wet_conversion_records_are_text(tmp_path: Path) -> None:
    texts = ["\n\n".join(article(random.Random(i))) for i in range(3)]
    offsets = write_wet(
        tmp_path / "crawl.wet.gz", [(f"http://w{i}.example/", t) for i, t in enumerate(texts)]
    )
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert [r.text for r in records] == texts
    assert [r.id.rsplit("#", 1)[1] for r in records] == [f"B{o}" for o in offsets]
    assert records[2].meta_dict()["url"] == "http://w2.example/"


def test_non_html_payloads_and_non_2xx_are_skipped_and_counted(tmp_path: Path) -> None:
    responses = [
        *pages(1),
        Response("http://x.example/a.png", b"\x89PNG\r\n\x1a\n" + bytes(200), content_type="image/png"),
        Response("http://x.example/a.pdf", b"%PDF-1.4 binary", content_type="application/pdf"),
        Response("http://x.example/old", b"<html>moved</html>", status="301 Moved Permanently"),
    ]
    write_warc(tmp_path / "c.warc.gz", responses)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert len(records) == 1 and quarantined == []
    assert stats.extra["skipped_content_type.image/png"] == 1
    assert stats.extra["skipped_content_type.application/pdf"] == 1
    assert stats.extra["skipped_http_status.3xx"] == 1


def test_charset_from_header_then_meta_then_detection(tmp_path: Path) -> None:
    french = "Le café est très bon à côté de la forêt, dit-elle en été. " * 8
    responses = [
        Response(
            "http://a.example/",
            html_page("a", [french], None).encode("cp1252"),
            "text/html; charset=windows-1252",
        ),
        Response("http://b.example/", html_page("b", [french], "iso-8859-1").encode("latin-1"), "text/html"),
        Response(
            "http://c.example/",
            html_page("c", [french], None).encode("utf-8"),
            "text/html; charset=x-unknown",
        ),
        # a byte-order mark wins over the header (the HTML standard), and is no part of the text (wget 1.21 kept
        # one before <!DOCTYPE>, whose <title> then became body text)
        Response("http://d.example/", b"\xef\xbb\xbf" + html_page("d", [french]).encode(), "text/html"),
        Response(
            "http://e.example/", html_page("e", [french]).encode("utf-16"), "text/html; charset=iso-8859-1"
        ),
    ]
    write_warc(tmp_path / "c.warc.gz", responses)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert all("café est très bon" in r.text for r in records)
    assert [r.meta_dict()["encoding"] for r in records] == ["cp1252", "cp1252", "utf-8", "utf-8", "utf-16"]
    assert [r.text.startswith(("d\n", "e\n")) for r in records[3:]] == [True, True]  # the <h1>, once
    assert stats.extra["unknown_charset"] == 1


def test_bad_records_are_quarantined_and_the_rest_of_the_file_goes_on(tmp_path: Path) -> None:
    rng = random.Random(5)
    noise = bytes(rng.randrange(128, 256) for _ in range(4000))
    responses = [
        *pages(2, seed=1),
        Response("http://nohttp.example/", b"<html><p>no status line</p></html>", http=False),
        Response(
            "http://cut.example/",
            html_page("t", article(rng)).encode(),
            warc_headers={"WARC-Truncated": "length"},
        ),
        Response("http://big.example/", html_page("big", article(rng, 200)).encode()),
        Response("http://charset.example/", noise, "text/html; charset=x-no-such-charset"),
        *pages(2, seed=2, host="after"),
    ]
    write_warc(tmp_path / "c.warc.gz", responses)
    records, quarantined, stats = ingest_all([str(tmp_path)], IngestConfig(max_record_bytes=50_000))
    reasons = {q.reason for q in quarantined}
    assert reasons == {"malformed_http", "warc_truncated", "record_too_large", "unknown_charset"}
    assert [json.loads(r.meta)["url"] for r in records] == [
        "https://site0.example/p/0",
        "https://site1.example/p/1",
        "https://after0.example/p/0",
        "https://after1.example/p/1",
    ]
    assert stats.docs_in == len(records) + len(quarantined) and sum(stats.dropped.values()) == 4
    assert all(q.location.startswith("B") and q.sample for q in quarantined)


def _members(data: bytes) -> list[int]:

    starts, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        d.decompress(data[pos:])
        starts.append(pos)
        pos = len(data) - len(d.unused_data)
    return starts


def test_damaged_files(tmp_path: Path) -> None:
    """Not gzip though named .gz; a corrupt gzip member in the middle; a file cut inside its last member; an
    uncompressed record declaring more bytes than the file holds; an empty WARC."""
    good = tmp_path / "good.warc.gz"
    write_warc(good, pages(4))
    data = good.read_bytes()
    members = _members(data)  # warcinfo, then (request, response) per page
    (tmp_path / "notgzip.warc.gz").write_bytes(b"this is a text file, not a WARC\n" * 20)
    middle = members[3]  # the request record of page 1 (members[4] is its response)
    (tmp_path / "corrupt.warc.gz").write_bytes(data[: middle + 30] + b"\x00" * 40 + data[middle + 70 :])
    (tmp_path / "cut.warc.gz").write_bytes(data[:-40])
    raw = tmp_path / "long.warc"
    write_warc(raw, pages(2), gz=False)
    block = raw.read_bytes()
    last = block.rfind(b"Content-Length: ")
    raw.write_bytes(block[:last] + block[last:].replace(b"Content-Length: ", b"Content-Length: 9", 1))
    (tmp_path / "empty.warc.gz").write_bytes(b"")
    (tmp_path / "empty2.warc.gz").write_bytes(gzip.compress(b""))
    records, quarantined, stats = ingest_all([str(tmp_path)])
    by_file: dict[str, list[str]] = {}
    for q in quarantined:
        by_file.setdefault(q.source.rsplit("/", 1)[1], []).append(q.reason)
    assert by_file == {
        "notgzip.warc.gz": ["corrupt_record"],
        "corrupt.warc.gz": ["corrupt_record"],
        "cut.warc.gz": ["truncated_record"],
        "long.warc": ["truncated_record"],
    }
    kept = Counter(r.source.rsplit("/", 1)[1] for r in records)
    # corrupt: page 1's request is lost, its response and the others are found again (the reader resyncs)
    assert kept == {"good.warc.gz": 4, "corrupt.warc.gz": 4, "cut.warc.gz": 3, "long.warc": 1}
    assert stats.extra["empty_input"] == 2


def test_html_helpers() -> None:
    assert known_charset("ISO-8859-1") == "cp1252" and known_charset("utf8") == "utf-8"
    assert known_charset("x-nothing") is None
    assert (
        meta_charset(b'<head><meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">')
        == "Shift_JIS"
    )
    assert split_http(b"<html>no headers</html>") is None
    assert split_http(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<p>x") == (
        200,
        {"content-type": "text/html"},
        b"<p>x",
    )


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura", "justext"])
def test_each_extractor_removes_markup_and_boilerplate(tmp_path: Path, extractor: str) -> None:
    # and an empty page (a 200 with no body: wget's crawls hold them), which jusText's lxml once raised on
    empty = [Response("https://empty.example/", b""), Response("https://blank.example/", b" \n<!-- -->\n")]
    write_warc(tmp_path / "c.warc.gz", pages(2) + empty)
    cfg = IngestConfig(html=HtmlConfig(extractor=extractor))
    records, quarantined, _ = ingest_all([str(tmp_path)], cfg)
    assert len(records) == 2 and [q.reason for q in quarantined] == ["no_text_extracted"] * 2
    for rec in records:
        assert "<p>" not in rec.text and "tracker" not in rec.text and "All rights reserved" not in rec.text
        assert rec.text.count("of the day.") >= 10


def test_options_pass_through_and_missing_extractor_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    page = html_page("t", article(random.Random(1)))
    full = build_extractor(HtmlConfig(extractor="resiliparse", options={"main_content": False}))(page)
    assert "All rights reserved" in full
    with pytest.raises(ValueError, match=r"ingest\.html\.extractor"):
        HtmlConfig(extractor="boilerpipe")
    import sys

    monkeypatch.setitem(sys.modules, "justext", None)
    monkeypatch.setattr("pipeline.ingest.html._BUILT", {})
    with pytest.raises(ExtractorMissing, match=r"pip install 'pileworks\[justext\]'"):
        build_extractor(HtmlConfig(extractor="justext"))
