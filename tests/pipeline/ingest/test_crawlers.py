"""Web archives as real crawlers write them (issue 42), each written here byte by byte: ClueWeb09's WARC/0.18
with LF-only HTTP headers and a stale ``Content-Encoding``, pywb/webrecorder's stale ``Transfer-Encoding``, wget's
``<https://…>`` target URIs, cc_net's LF-only WET, a WARC gzipped as one whole file, the Internet Archive's ARC,
and bodies that really are gzip, deflate, brotli or zstd. Every good page becomes a document; nothing is
quarantined for an encoding header its body does not follow; every id leads back to its record."""

from __future__ import annotations

import gzip
import io
import random
import zlib
from pathlib import Path

import brotli
import pytest
import zstandard
from warcio.archiveiterator import ArchiveIterator as WarcioIterator

from pipeline.clean.url import UrlRules
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.html import HtmlConfig
from pipeline.ingest.warc import decoded_body, split_http
from pipeline.sources import url_domain
from tests.fixtures.web_archives import (
    Response,
    arc_file,
    article,
    html_page,
    http_block,
    raw_record,
    response_record,
    write_warc,
)
from tests.pipeline.ingest.test_ingest import ingest_all


def page(seed: int, title: str = "Page") -> bytes:
    return html_page(f"{title} {seed}", article(random.Random(seed))).encode()


def _warcinfo(nl: bytes = b"\r\n", version: str = "WARC/1.0") -> bytes:
    return raw_record([("WARC-Type", "warcinfo")], b"software: test-crawler\r\n", nl=nl, version=version)


def test_clueweb_lf_only_http_headers_and_a_stale_content_encoding(tmp_path: Path) -> None:
    """ClueWeb09: WARC/0.18, HTTP headers ending in LF LF, ``Content-Encoding: gzip`` over a body stored decoded,
    and CRLF CRLF inside the page (where a CRLF-only split would cut the headers)."""
    body = page(1).replace(b"</h1>", b"</h1>\r\n\r\n", 1)
    plain = http_block(body, [("Server", "Apache")], nl=b"\n")
    stale = http_block(page(2), [("Content-Encoding", "gzip")], nl=b"\n")
    data = _warcinfo(version="WARC/0.18")
    offsets = []
    for n, block in enumerate([plain, stale]):
        offsets.append(len(data))
        data += response_record(f"http://clueweb{n}.example/a", block, version="WARC/0.18", n=n)
    (tmp_path / "00.warc").write_bytes(data)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert [r.id.rsplit("#", 1)[1] for r in records] == [f"B{o}" for o in offsets]
    assert all(r.text.count("of the day.") >= 10 and "Content-Type" not in r.text for r in records)
    assert records[0].meta_dict()["user"]["content_type"] == "text/html"  # the LF-only headers were read
    assert stats.extra["encoding_mismatch"] == 1


def test_pywb_stale_transfer_encoding_and_bodies_that_really_are_encoded(tmp_path: Path) -> None:
    """pywb/webrecorder keep ``Transfer-Encoding: chunked`` over a de-chunked body; other crawlers store the
    server's bytes: chunked, gzip, deflate (zlib and raw), brotli, zstd, and chunked gzip. Each is a document
    with the page's text; only the stale headers are counted as mismatches."""
    html = page(3)
    raw_deflate = zlib.compressobj(wbits=-15)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (html[:100], html[100:])) + b"0\r\n\r\n"
    gz = gzip.compress(html)
    bodies = {
        "stale-chunked": (html, [("Transfer-Encoding", "chunked")]),
        "chunked": (chunked, [("Transfer-Encoding", "chunked")]),
        "gzip": (gz, [("Content-Encoding", "gzip")]),
        "deflate": (zlib.compress(html), [("Content-Encoding", "deflate")]),
        "raw-deflate": (raw_deflate.compress(html) + raw_deflate.flush(), [("Content-Encoding", "deflate")]),
        "br": (brotli.compress(html), [("Content-Encoding", "br")]),
        "zstd": (zstandard.ZstdCompressor().compress(html), [("Content-Encoding", "zstd")]),
        "chunked-gzip": (
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(gz), gz),
            [("Transfer-Encoding", "chunked"), ("Content-Encoding", "gzip")],
        ),
        "stale-both": (html, [("Transfer-Encoding", "chunked"), ("Content-Encoding", "gzip")]),
    }
    data = _warcinfo()
    for n, (name, (payload, headers)) in enumerate(bodies.items()):
        data += response_record(f"https://enc.example/{name}", http_block(payload, headers), n=n)
    (tmp_path / "enc.warc").write_bytes(data)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert [r.meta_dict()["url"].rsplit("/", 1)[1] for r in records] == list(bodies)
    texts = {r.text for r in records}
    assert len(texts) == 1 and next(iter(texts)).count("of the day.") >= 10
    assert stats.extra["encoding_mismatch"] == 2  # stale-chunked; stale-both (counted once)


def test_a_body_that_is_encoded_and_undecodable_is_quarantined_with_its_reason(tmp_path: Path) -> None:
    rng = random.Random(9)
    noise = bytes(rng.randrange(256) for _ in range(3000))  # what a body in an unknown coding looks like
    data = _warcinfo()
    data += response_record("https://x.example/sdch", http_block(noise, [("Content-Encoding", "sdch")]))
    data += response_record("https://x.example/cut", http_block(noise, [("Content-Encoding", "gzip")]), n=1)
    data += response_record("https://x.example/ok", http_block(page(4), []), n=2)
    (tmp_path / "bad.warc").write_bytes(data)
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert [q.reason for q in quarantined] == ["bad_content_encoding", "bad_content_encoding"]
    assert "sdch" in quarantined[0].detail and "gzip" in quarantined[1].detail
    assert [r.meta_dict()["url"] for r in records] == ["https://x.example/ok"]


def test_http_and_body_helpers() -> None:
    assert split_http(b"HTTP/1.0 200 OK\nContent-Type: text/html\n\n<p>a\r\n\r\nb") == (
        200,
        {"content-type": "text/html"},
        b"<p>a\r\n\r\nb",
    )
    assert split_http(b"HTTP/1.1 404\r\n\r\n") == (404, {}, b"")  # no reason phrase (pywb's sample has one)
    assert decoded_body(b"<p>x</p>", {"content-encoding": "gzip"}) == (b"<p>x</p>", True)
    assert decoded_body(b"5\r\nhello\r\n0\r\n\r\n", {"transfer-encoding": "chunked"}) == (b"hello", False)
    # a chunked body cut short keeps its whole chunks
    assert decoded_body(b"5\r\nhello\r\n3\r\nwor", {"transfer-encoding": "chunked"}) == (b"hellowor", False)


def test_bracketed_and_idna_urls_name_their_domain_and_meet_the_blocklist(tmp_path: Path) -> None:
    """wget >= 1.20 writes ``WARC-Target-URI: <https://…>`` (WARC 1.0's grammar): stored without brackets;
    hosts are compared lower-cased and IDNA-decoded, in the domain column and by the URL rules."""
    responses = [
        Response("<https://WWW.Spam.Example/page>", page(5)),
        Response("<https://xn--bcher-kva.example/buch>", page(6)),
        Response("https://ok.example/", page(7)),
    ]
    write_warc(tmp_path / "wget.warc.gz", responses)
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert quarantined == []
    urls = [r.meta_dict()["url"] for r in records]
    assert urls == [
        "https://WWW.Spam.Example/page",
        "https://xn--bcher-kva.example/buch",
        "https://ok.example/",
    ]
    assert [url_domain(u) for u in urls] == ["spam.example", "bücher.example", "ok.example"]
    rules = UrlRules(["spam.example", "bücher.example"], [])
    assert [rules.reason(u) for u in urls] == ["url_blocklisted", "url_blocklisted", None]
    # documents stored before URLs were normalised at read time meet the same rules
    assert rules.reason("<https://spam.example/x>") == "url_blocklisted"
    assert UrlRules(["xn--bcher-kva.example"], []).reason("https://www.bücher.example/") == "url_blocklisted"


@pytest.mark.parametrize("gz", [False, True])
def test_a_wet_file_with_lf_line_endings(tmp_path: Path, gz: bool) -> None:
    """cc_net's WET sample (CC-MAIN-2019-13 layout): record headers end their lines with LF alone."""
    texts = ["\n".join(article(random.Random(10 + i))) for i in range(3)]
    records_bytes, offsets = [_warcinfo(nl=b"\n")], []
    for i, text in enumerate(texts):
        headers = [
            ("WARC-Type", "conversion"),
            ("WARC-Target-URI", f"http://wet{i}.example/"),
            ("WARC-Date", "2019-03-18T12:00:00Z"),
            ("WARC-Record-ID", f"<urn:uuid:{i}>"),
            ("Content-Type", "text/plain"),
        ]
        records_bytes.append(raw_record(headers, text.encode(), nl=b"\n"))
    data = b""
    for i, rec in enumerate(records_bytes):
        if i:
            offsets.append(len(data))
        data += gzip.compress(rec) if gz else rec
    path = tmp_path / ("cc.wet.gz" if gz else "cc.wet")
    path.write_bytes(data)
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert quarantined == [] and [r.text for r in records] == texts
    assert [r.id.rsplit("#", 1)[1] for r in records] == [f"B{o}" for o in offsets]
    assert records[1].meta_dict()["url"] == "http://wet1.example/"
    with path.open("rb") as f:  # the id's offset is where a reader finds that very record
        f.seek(offsets[2])
        first = next(iter(WarcioIterator(f)))
        assert first.rec_headers.get_header("WARC-Target-URI") == "http://wet2.example/"


def test_a_warc_gzipped_as_one_whole_file_has_ids_in_the_decompressed_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.warc"
    responses = [Response(f"https://whole{i}.example/", page(20 + i)) for i in range(3)]
    offsets = write_warc(plain, responses, gz=False)
    data = plain.read_bytes()
    plain.unlink()
    (tmp_path / "whole.warc.gz").write_bytes(gzip.compress(data))
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert quarantined == [] and len(records) == 3
    marks = [r.id.rsplit("#", 1)[1] for r in records]
    assert marks == [f"U{o}" for o in offsets]
    for mark, resp in zip(marks, responses, strict=True):  # zcat FILE | tail -c +OFFSET+1 starts with it
        rec = next(iter(WarcioIterator(io.BytesIO(data[int(mark[1:]) :]))))
        assert rec.rec_headers.get_header("WARC-Target-URI") == resp.url


def test_a_whole_file_gzip_cut_short_keeps_its_whole_records(tmp_path: Path) -> None:
    plain = tmp_path / "p.warc"
    offsets = write_warc(
        plain, [Response(f"https://cut{i}.example/", page(30 + i)) for i in range(3)], gz=False
    )
    data = gzip.compress(plain.read_bytes())
    plain.unlink()
    cut = data[: len(data) - 300]
    (tmp_path / "cut.warc.gz").write_bytes(cut)
    readable = len(zlib.decompressobj(wbits=31).decompress(cut))
    assert offsets[2] < readable < len(plain.read_bytes() if plain.exists() else gzip.decompress(data))
    records, quarantined, _ = ingest_all([str(tmp_path)])
    assert len(records) == 2 and [q.reason for q in quarantined] == ["truncated_record"]
    assert quarantined[0].location == f"U{offsets[2]}"


@pytest.mark.parametrize("gz", [False, True])
def test_arc_files_are_read_with_their_url_and_date(tmp_path: Path, gz: bool) -> None:
    pages = [(f"http://arc{i}.example/", http_block(page(40 + i), [])) for i in range(2)]
    data, offsets = arc_file(pages, gz=gz)
    path = tmp_path / ("old.arc.gz" if gz else "old.arc")
    path.write_bytes(data)
    records, quarantined, stats = ingest_all([str(tmp_path)])
    assert quarantined == []
    assert [r.meta_dict()["url"] for r in records] == [u for u, _ in pages]
    assert [r.meta_dict()["warc_date"] for r in records] == ["2014-02-16T05:00:21Z", "2014-02-16T05:01:21Z"]
    assert [r.id.rsplit("#", 1)[1] for r in records] == [f"B{o}" for o in offsets]
    assert all(r.text.count("of the day.") >= 10 for r in records)
    assert stats.extra["warc_skipped.not_http"] == 1  # the dns: record
    with path.open("rb") as f:
        f.seek(offsets[1])
        rec = next(iter(WarcioIterator(f, arc2warc=True)))
        assert rec.rec_headers.get_header("WARC-Target-URI") == pages[1][0]


@pytest.mark.parametrize("extractor", ["resiliparse", "trafilatura", "justext"])
def test_a_page_s_text_does_not_depend_on_the_pages_read_before_it(tmp_path: Path, extractor: str) -> None:
    """trafilatura's deduplication keeps a cache per process across documents: a paragraph seen on three pages
    before is dropped from the fourth. Pages read alone and after others give the same text, with every
    extractor, so the worker count and the part size cannot change a document."""
    rng = random.Random(11)
    shared = " ".join(["The shared paragraph of every page on this site repeats the same words."] * 3)
    responses = [
        Response(f"https://dup{i}.example/", html_page(f"D{i}", [shared, *article(rng, 3)]).encode())
        for i in range(5)
    ]
    (tmp_path / "all").mkdir()
    (tmp_path / "last").mkdir()
    write_warc(tmp_path / "all" / "a.warc.gz", responses[:4])
    write_warc(tmp_path / "last" / "b.warc.gz", responses[4:])
    cfg = IngestConfig(html=HtmlConfig(extractor=extractor))
    after, _, _ = ingest_all([str(tmp_path / "all"), str(tmp_path / "last")], cfg)
    alone, _, _ = ingest_all([str(tmp_path / "last")], cfg)
    assert len(after) == 5 and len(alone) == 1
    assert after[-1].text == alone[0].text and shared[:60] in alone[0].text
